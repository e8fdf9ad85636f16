"""A real node under a fake systemd: sd_notify order, watchdog, journald format, SIGHUP reload,
volunteer pauses (time window, memory limit), and exit code 78 for bad config.

"The watchdog stops when training is stuck" uses the test-only fault switch
``P2PTRAIN_TEST_FAULTS=stall_training`` (one step hangs for a few seconds).
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from p2ptrain.daemon import faults
from p2ptrain.waiting import wait_until
from tests.integration.conftest import TINY_TASK
from tests.support.nodeapi import node_client
from tests.support.notify import NotifySocket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

WATCHDOG_USEC = 2_000_000  # pings every second (half the period)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")


@pytest.fixture
def notify_socket():
    sock = NotifySocket()
    yield sock
    sock.close()


def _pings_after(sock: NotifySocket, since: float) -> list[float]:
    return [m.at for m in sock.with_key("WATCHDOG", "1") if m.at > since]


def test_notify_watchdog_and_journal_format(make_node):
    a = make_node("a", task=TINY_TASK)
    a.write_config()
    a.log_path.touch()  # the node's stderr: JOURNAL_STREAM names this file's device and inode
    info = os.stat(a.log_path)
    sock = NotifySocket(on_ready=lambda: a.status(timeout=5))
    try:
        a.env = {"NOTIFY_SOCKET": sock.path, "WATCHDOG_USEC": str(WATCHDOG_USEC),
                 "JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}
        a.start()
        ready = wait_until(lambda: sock.with_key("READY", "1"), 90, "READY=1")[0]
        # READY only once joined and synced: at that moment the node already trains in a swarm.
        at_ready = sock.at_ready
        assert at_ready is not None and at_ready.state == "training" and at_ready.peer_id, at_ready
        assert ready.get("MAINPID") == str(a.process.pid)
        assert (ready.get("STATUS") or "").startswith("training epoch=")

        observed = time.monotonic()
        time.sleep(6)
        pings = _pings_after(sock, observed)
        assert len(pings) >= 3, f"watchdog pings while training: {sock.received()}"
        gaps = [later - earlier for earlier, later in zip(pings, pings[1:], strict=False)]
        assert min(gaps) >= 0.9, f"pings faster than half the watchdog period: {gaps}"
        statuses = [m for m in sock.with_key("STATUS") if m.get("READY") is None]
        assert statuses and all("samples/s" in m.get("STATUS") for m in statuses)

        a.signal(signal.SIGTERM)
        assert a.wait(60) == 0, a.report()
        messages = sock.received()
    finally:
        sock.close()

    kinds = [next(iter(dict(m.fields)), "") for m in messages]
    assert kinds.count("READY") == 1 and kinds.count("STOPPING") == 1, kinds
    first_ping = kinds.index("WATCHDOG")
    assert kinds.index("READY") < first_ping, "a watchdog ping before READY"
    assert kinds[-1] == "STOPPING", f"STOPPING=1 must be the last message: {kinds[-5:]}"

    lines = a.log_path.read_text().splitlines()
    assert not [line for line in lines if TIMESTAMP.match(line)], "timestamps in journal format"
    own = [line for line in lines if "p2ptrain." in line.split(":", 1)[0]]
    assert len(own) >= 10 and all(re.match(r"^<[0-7]>p2ptrain\.", line) for line in own), own[:5]
    assert "<6>p2ptrain.daemon.node: state TRAINING -> STOPPING" in lines


def test_watchdog_pings_stop_while_training_is_stuck(make_node, notify_socket):
    env = {"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": str(WATCHDOG_USEC),
           "P2PTRAIN_TEST_FAULTS": "stall_training"}
    a = make_node("a", env=env, task=TINY_TASK)
    a.start()
    wait_until(lambda: _log_has(a, "hangs for"), 120, "the stalled step")
    stalled_at = time.monotonic()
    # The API (another thread) still answers while the loop is stuck ...
    # (the loop publishes the snapshots, so the one served is as old as the stall)
    stuck = wait_until(lambda: (s := a.status()) is not None and time.time() - s.taken_at >= 3 and s, 10,
                       "the API answering with a stale snapshot")
    assert stuck.state == "training"
    time.sleep(max(0.0, stalled_at + faults.STALL_SECONDS + 3 - time.monotonic()))
    # ... but the watchdog heard nothing during the stall, and pings resumed once the step ended.
    pings = [m.at for m in notify_socket.with_key("WATCHDOG", "1")]
    before = [t for t in pings if t <= stalled_at]
    after = [t for t in pings if t > stalled_at]
    assert before and after, pings
    assert after[0] - before[-1] >= faults.STALL_SECONDS - 1, (before[-3:], after[:3])
    a.signal(signal.SIGTERM)
    assert a.wait(60) == 0, a.report()


def _window_excluding_now() -> str:
    """A daily window that starts in two hours and ends in three (local time, like the node's)."""
    now = datetime.datetime.now()
    start, end = now + datetime.timedelta(hours=2), now + datetime.timedelta(hours=3)
    return f"{start:%H:%M}-{end:%H:%M}"


def _log_has(node, text: str) -> bool:
    return text in node.log_path.read_text()


def test_sighup_reload_and_volunteer_pauses(make_node, notify_socket):
    env = {"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    a = make_node("a", env=env, task=TINY_TASK, volunteer={"max_memory_mb": 1})
    a.start()
    paused = a.wait_for(lambda s: s.state == "paused", 90, "a memory pause")
    assert paused.pause_reason == "memory"
    assert _log_has(a, "is over volunteer.max_memory_mb=1: pausing training")
    metrics = node_client(a).request("GET", "/metrics").body
    assert b'p2ptrain_pause_reason{p2ptrain_pause_reason="memory"} 1.0' in metrics

    # Deliberately paused is not stuck: the loop keeps feeding the watchdog.
    since = time.monotonic()
    time.sleep(4)
    assert len(_pings_after(notify_socket, since)) >= 2, notify_socket.received()[-5:]
    assert a.status().samples_processed_total == paused.samples_processed_total

    # One reload: two reloadable changes, a memory limit lifted, and a change that needs a restart.
    assert "DEBUG" not in a.log_path.read_text()
    a.overrides = {**a.overrides, "node": {"log_level": "DEBUG"},
                   "volunteer": {**a.overrides["volunteer"], "max_memory_mb": 0,
                                 "run_windows": [_window_excluding_now()]},
                   "task": {**TINY_TASK, "d_model": 64}}
    a.write_config()
    a.signal(signal.SIGHUP)
    wait_until(lambda: _log_has(a, "reloaded "), 30, "the reload log line")
    reloaded = next(line for line in a.log_path.read_text().splitlines() if "reloaded " in line)
    assert ("applied node.log_level, volunteer.max_memory_mb, volunteer.run_windows; "
            "needs a restart: task.d_model") in reloaded
    scheduled = a.wait_for(lambda s: s.pause_reason == "schedule", 30, "a schedule pause")
    assert scheduled.state == "paused"
    a.status()  # a request the API logs at DEBUG: the new level is live
    wait_until(lambda: re.search(r"DEBUG +p2ptrain\.daemon\.api: API ", a.log_path.read_text()), 10,
               "a DEBUG line after the reload")

    # Back inside the schedule (no windows): training resumes by itself.
    a.overrides = {**a.overrides, "node": {"log_level": "INFO"},
                   "volunteer": {**a.overrides["volunteer"], "run_windows": []},
                   "task": TINY_TASK}
    a.write_config()
    a.signal(signal.SIGHUP)
    a.wait_for(lambda s: s.state == "training" and s.samples_processed_total > paused.samples_processed_total,
               30, "training after the window was lifted")
    a.signal(signal.SIGTERM)
    assert a.wait(60) == 0, a.report()


def test_bad_config_exits_78_with_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[training]\nbatch_size = "lots"\n')
    done = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "run", "-c", str(bad)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 78, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "training.batch_size" in done.stderr and "Traceback" not in done.stderr
