"""The front door's help text says what the program is."""

from __future__ import annotations

import os
import subprocess
import sys


def test_help_describes_the_program() -> None:
    result = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "peer-to-peer training daemon" in result.stdout
    assert "front door" not in result.stdout.lower()


def test_a_reader_that_stops_reading_ends_a_command_quietly(tmp_path):
    """``p2ptrain run init ... | head``: no BrokenPipeError traceback, the shell's SIGPIPE status."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a line
    try:
        result = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "run", "init", "piped", "--fingerprint", "none"],
                                stdout=write, stderr=subprocess.PIPE, cwd=tmp_path, timeout=60, check=False)
    finally:
        os.close(write)
    assert result.returncode == 141 and result.stderr == b""
    assert (tmp_path / "piped" / "manifest.toml").is_file()  # the command itself did its work
