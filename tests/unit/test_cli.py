"""The front door's help text says what the program is."""

from __future__ import annotations

import subprocess
import sys


def test_help_describes_the_program() -> None:
    result = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "peer-to-peer training daemon" in result.stdout
    assert "front door" not in result.stdout.lower()
