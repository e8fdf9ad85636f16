"""The test tiers' node fork server behaves as the node's own interpreter would, by what a test sees of it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from p2ptrain.local.forkserver import ForkServer
from p2ptrain.local.swarm import LocalNode, local_node_config
from p2ptrain.waiting import wait_until
from tests.integration.conftest import FAST_TRAINING, TEST_VOLUNTEER, TINY_TASK

pytestmark = pytest.mark.timeout(120)

LOCK_HOLDER = "tests.support.lock_holder"


def test_a_forked_cli_gets_its_arguments_environment_directory_and_log_and_exits_with_main_s_code(
        node_forkserver: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node.toml").write_text(local_node_config(tmp_path / "state", "forkserver-run"))
    log = tmp_path / "cli.log"
    # The config (found relative to the request's directory) is valid; the environment's override is not.
    env = {**os.environ, "P2PTRAIN_TRAINING__BATCH_SIZE": "0"}
    forked = node_forkserver.start(["run", "--config", "node.toml"], env, log)
    assert log.exists()  # as a Popen's redirected output would be
    assert forked.wait(timeout=60) == os.EX_CONFIG  # as `python -m p2ptrain.cli` gives it
    assert forked.poll() == os.EX_CONFIG
    text = log.read_text()
    assert "training.batch_size" in text, text


def test_a_forked_node_trains_in_its_own_session_and_is_killed_by_its_pid(
        node_forkserver: ForkServer, tmp_path: Path) -> None:
    node = LocalNode("a", tmp_path / "a", "forkserver-run", {
        "task": dict(TINY_TASK), "training": dict(FAST_TRAINING), "volunteer": dict(TEST_VOLUNTEER)},
        launcher=node_forkserver)
    node.start()
    node.wait_for(lambda s: s.local_epoch >= 1, 60, "an epoch")
    assert node.process is not None
    pid = node.process.pid
    assert os.getsid(pid) == pid  # its own session: a signal to the tests' group does not reach it
    with pytest.raises(subprocess.TimeoutExpired):
        node.process.wait(timeout=0.1)
    node.kill()
    assert node.wait(30) == -signal.SIGKILL
    assert not node.running


def test_a_forked_node_killed_holding_hivemind_s_locks_stalls_no_sibling(
        node_forkserver: ForkServer, tmp_path: Path) -> None:
    """Each forked process has hivemind's process-wide locks of its own: a churned node SIGKILLed
    while it held one must not leave every later node's MPFutures waiting for good."""
    holder = node_forkserver.start(["hold"], dict(os.environ), tmp_path / "hold.log", module=LOCK_HOLDER)
    wait_until(lambda: "holding" in (tmp_path / "hold.log").read_text(), 30, "the holder taking the locks",
               interval=0.05)
    holder.kill()
    assert holder.wait(timeout=30) == -signal.SIGKILL
    taker = node_forkserver.start(["take"], dict(os.environ), tmp_path / "take.log", module=LOCK_HOLDER)
    assert taker.wait(timeout=60) == 0, (tmp_path / "take.log").read_text()
