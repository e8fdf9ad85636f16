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
import faulthandler, os, signal, sys, threading
from p2ptrain.proc import STACK_DUMP_SIGNAL
faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
def stuck_in_a_download():
    threading.Event().wait()
def helper_waiting_on_a_lock():
    threading.Lock().acquire() and threading.Event().wait()
if os.fork() == 0:
    helper_waiting_on_a_lock()
print("started", flush=True)
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
    node_part, _, helper_part = stacks.partition("a helper of the node")
    assert "the node" in node_part and "stuck_in_a_download" in node_part and "most recent call first" in node_part
    assert "helper_waiting_on_a_lock" in helper_part  # the helper's stacks, after its own heading


def test_a_node_that_misses_its_stop_bound_leaves_its_stacks_in_its_log(tmp_path):
    deaf = STUCK_NODE.replace("print(", "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(")
    node = _stand_in(tmp_path, deaf)
    assert node.stop(timeout=0.5) == -9
    assert "stuck_in_a_download" in node.log_tail(100)
    assert node.report() == node.log_tail()  # not running any more: nothing to ask


def test_a_clean_up_that_expects_to_kill_asks_for_no_stacks(tmp_path):
    deaf = STUCK_NODE.replace("print(", "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(")
    node = _stand_in(tmp_path, deaf)
    assert LocalNode.stop_all([node], timeout=0.5, stacks=False) == {"stuck": None}
    assert node.wait(10) == -9 and "stuck_in_a_download" not in node.log_tail(100)
