"""``p2ptrain pause / resume / leave`` against a real node: effects in its status, exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def p2ptrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2ptrain.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_pause_resume_leave_from_the_command_line(make_node, tmp_path):
    a = make_node("a", task=TINY_TASK)
    a.start()
    a.wait_for(lambda s: s.state == "training" and s.samples_processed_total > 0, 90, "training steps")
    url, token_file = a.api_url(), a.state_dir / "api.token"

    done = p2ptrain("pause", "--for", "1h", "--url", url, "--token-file", token_file)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "paused for 1h"
    paused = a.wait_for(lambda s: s.state == "paused", 20, "PAUSED state")
    assert paused.pause_reason == "manual"

    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token-" + "x" * 20 + "\n")
    wrong.chmod(0o600)
    refused = p2ptrain("resume", "--url", url, "--token-file", wrong)
    assert refused.returncode == 77, refused
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert a.status().state == "paused"

    # Discovery through the node's config: its state directory holds api.url and api.token.
    done = p2ptrain("resume", "--config", a.config_path)
    assert done.returncode == 0, done.stderr
    a.wait_for(lambda s: s.state == "training", 20, "training after resume")

    # A timed pause ends by itself.
    assert p2ptrain("pause", "--for", "3s", "--config", a.config_path).returncode == 0
    a.wait_for(lambda s: s.state == "paused", 20, "PAUSED state")
    a.wait_for(lambda s: s.state == "training", 30, "training after the timed pause")
    assert "timed pause is over" in a.log_path.read_text()

    done = p2ptrain("leave", "--config", a.config_path)
    assert done.returncode == 0, done.stderr
    assert a.wait(60) == 0, a.report()

    gone = p2ptrain("pause", "--url", url, "--token-file", token_file)
    assert gone.returncode == 69, gone
    assert "no node answers" in gone.stderr and "Traceback" not in gone.stderr
