"""Signal handlers only record: a SIGHUP storm while control requests flow never deadlocks the loop.

A Python signal handler runs on the main thread between two bytecodes, so a handler that takes a
lock the interrupted code already holds (``queue.Queue``'s mutex inside ``drain()``) hangs the
node for good.  The storm runs in a child process so a deadlock shows up as a timeout.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap

import pytest

STORM = textwrap.dedent("""
    import os, signal, threading, time
    from p2ptrain.daemon.control import Command, ControlQueue, ControlRequest
    from p2ptrain.daemon.main import _install_signal_handlers
    from p2ptrain.daemon.stopper import Stopper

    class Node:
        def __init__(self):
            self.stopper, self.control = Stopper(), ControlQueue()
        def request_stop(self, reason):
            self.stopper.request(reason)

    node = Node()
    _install_signal_handlers(node)
    until = time.monotonic() + {seconds}

    def api_client():  # what the HTTP API does from its threads
        while time.monotonic() < until:
            node.control.submit(ControlRequest(Command.CHECKPOINT, source="api"))

    def signals():  # `kill -HUP` as fast as it goes
        while time.monotonic() < until:
            os.kill(os.getpid(), signal.SIGHUP)

    for target in (api_client, signals):
        threading.Thread(target=target, daemon=True).start()
    drained = reloads = 0
    while time.monotonic() < until:
        for request in node.control.drain():
            drained += 1
            reloads += request.command is Command.RELOAD
    print("drained", drained, "reloads", reloads)
""")


def test_sighup_storm_while_control_requests_flow_never_deadlocks() -> None:
    seconds = 4
    try:
        done = subprocess.run([sys.executable, "-c", STORM.format(seconds=seconds)], capture_output=True, text=True,
                              timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the node's control loop deadlocked under a SIGHUP storm") from None
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert int(words[1]) > 0 and int(words[3]) > 0, done.stdout  # both producers got through


def test_a_sighup_refused_by_a_full_queue_is_said_once_and_still_reloads(caplog) -> None:
    from p2ptrain.daemon.control import Command, ControlQueue, ControlRequest

    control = ControlQueue(maxsize=2)
    for _ in range(2):
        assert control.submit(ControlRequest(Command.CHECKPOINT, source="api"))
    assert not control.submit(ControlRequest(Command.CHECKPOINT, source="api"))
    for _ in range(3):  # what the SIGHUP handler submits
        assert not control.submit(ControlRequest(Command.RELOAD, source="SIGHUP"))
    drained = control.drain()
    assert [r.command for r in drained] == [Command.CHECKPOINT, Command.CHECKPOINT, Command.RELOAD]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "control: 4 requests refused, the queue was full; the SIGHUP reload runs now")]
    caplog.clear()
    assert control.drain() == [] and caplog.records == []  # said once, handed out once


SECOND_SIGNAL = textwrap.dedent("""
    import os, signal
    from p2ptrain.daemon.control import ControlQueue
    from p2ptrain.daemon.stopper import Stopper

    class Node:
        def __init__(self):
            self.stopper, self.control = Stopper(), ControlQueue()
        def request_stop(self, reason):
            self.stopper.request(reason)

    node = Node()
    {install}
    node.stopper.request("leave requested by api")  # the node is already stopping: its final checkpoint
    os.kill(os.getpid(), signal.SIGTERM)  # one `systemctl stop`: must not cut the checkpoint short
    print("still here:", node.stopper.reason, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # the second signal: the sender insists
    print("not reached", flush=True)
""")


@pytest.mark.parametrize("install", [
    "from p2ptrain.daemon.main import _install_signal_handlers; _install_signal_handlers(node)",
    "node.stopper.handle_stop_signals()  # what p2ptrain fetch installs",
], ids=["run", "fetch"])
def test_only_a_second_signal_exits_at_once_not_a_stop_the_node_asked_for(install: str) -> None:
    done = subprocess.run([sys.executable, "-c", SECOND_SIGNAL.format(install=install)], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.splitlines() == ["still here: leave requested by api"], (done.stdout, done.stderr)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr


def test_a_control_request_wakes_the_loop_s_wait_and_only_that_wait() -> None:
    from p2ptrain.daemon.control import Command, ControlQueue, ControlRequest
    from p2ptrain.daemon.stopper import Stopper

    stopper = Stopper()
    control = ControlQueue(wake=stopper.wake)
    try:
        assert control.submit(ControlRequest(Command.RESUME, source="SIGHUP"))
        assert stopper.wait(0.01) is False  # others' waits (a retry's backoff) are not cut short by it
        for _ in range(10):  # a pending wake-up ends the loop's next wait, however many came
            control.submit(ControlRequest(Command.CHECKPOINT, source="api"))
        assert stopper.wait_for_work(3600.0) is False
        stopper.request("test over")
        assert stopper.wait_for_work(3600.0) is True
    finally:
        stopper.close()
