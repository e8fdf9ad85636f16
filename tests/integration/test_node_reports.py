"""A failed check's report of a local node: where its threads are when it is stuck (a real process
answering SIGUSR2 as a node does, and the waits that give it time to write)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from p2ptrain.local.swarm import LocalNode
from p2ptrain.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


STUCK_NODE = """
import faulthandler, signal, sys, threading
from p2ptrain.proc import STACK_DUMP_SIGNAL
faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
print("started", flush=True)
def stuck_in_a_download():
    threading.Event().wait()
stuck_in_a_download()
"""


def _stand_in(tmp_path, code: str) -> LocalNode:
    """A LocalNode whose process is ``code``: a stand-in that answers SIGUSR2 as a node does."""
    node = LocalNode("stuck", tmp_path, "r")
    tmp_path.mkdir(exist_ok=True)
    with node.log_path.open("ab") as log:
        node.process = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
    wait_until(lambda: "started" in node.log_tail(), 30, "the stand-in starting", interval=0.05)
    return node


def test_a_failure_report_of_a_running_node_shows_where_its_threads_are(tmp_path):
    node = _stand_in(tmp_path, STUCK_NODE)
    try:
        report = node.report()
    finally:
        node.kill()
        node.wait(10)
    tail, _, stacks = report.partition("--- stuck is still running; its threads now:")
    assert tail.strip() == "started"
    assert "stuck_in_a_download" in stacks and "most recent call first" in stacks


def test_a_node_that_misses_its_stop_bound_leaves_its_stacks_in_its_log(tmp_path):
    deaf = STUCK_NODE.replace("print(", "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(")
    node = _stand_in(tmp_path, deaf)
    assert node.stop(timeout=0.5) == -9
    assert "stuck_in_a_download" in node.log_tail(100)
    assert node.report() == node.log_tail()  # not running any more: nothing to ask
