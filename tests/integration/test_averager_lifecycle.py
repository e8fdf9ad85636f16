"""An averager's start has a deadline, and stopping one never leaves hivemind's shared locks held.

Real hivemind averager processes on one in-process DHT (127.0.0.1).  Each test is bounded: every wait
has a deadline shorter than the test's timeout, so a regression fails with a message, not a hang.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Iterator

import hivemind
import pytest
import torch
from hivemind.utils.mpfuture import MPFuture
from hivemind.utils.timed_storage import get_dht_time

from p2ptrain.averaging import lifecycle
from p2ptrain.averaging.lifecycle import StartTimeout
from p2ptrain.proc import state_and_parent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False}


@pytest.fixture
def dht() -> Iterator[hivemind.DHT]:
    node = hivemind.DHT(start=True, **LOOPBACK)
    try:
        yield node
    finally:
        node.shutdown()


class _BusyAtShutdown(hivemind.DecentralizedAverager):
    """Still writing updates to other processes when its stop grace runs out: its process takes
    hivemind's process-shared update lock again and again, as a process answering futures does."""

    async def _shutdown(self, timeout: float | None) -> None:
        while True:
            with MPFuture._update_lock:
                time.sleep(0.05)
            time.sleep(0.001)


class _NeverReady(hivemind.DecentralizedAverager):
    """A process that never reports ready (as one waiting on a DHT that no longer answers)."""

    def run(self) -> None:
        time.sleep(3600)


def _start_plain(dht: hivemind.DHT, prefix: str, timeout: float) -> hivemind.DecentralizedAverager:
    averager = hivemind.DecentralizedAverager([torch.zeros(8)], dht, prefix=prefix, start=False)
    averager.run_in_background(await_ready=True, timeout=timeout)
    return averager


def test_an_averager_stopped_while_busy_does_not_keep_the_next_from_starting(dht, caplog):
    prefix = f"busy{uuid.uuid4().hex[:6]}"
    busy = _BusyAtShutdown([torch.zeros(8)], dht, prefix=prefix, start=True, shutdown_timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="p2ptrain.averaging.lifecycle"):
        busy.shutdown()  # past its 1 s grace, it is killed: ~98% of the time while it holds the lock
    # Had it died holding the lock, the DHT process would block on its next answer and this start
    # would wait for the DHT for ever (here: fail at its deadline).
    for attempt in range(3):
        _start_plain(dht, f"{prefix}{attempt}", timeout=30.0).shutdown()
    assert not busy.is_alive()
    assert "did not stop within 1 s: killed" in caplog.text


def _ask_the_dht_and_freeze(dht: hivemind.DHT) -> None:
    dht.get("anything", return_future=True)  # the request carries the pipe its answer goes back through
    os.kill(os.getpid(), signal.SIGSTOP)  # killed here, while the DHT fetches that pipe from this process


def _stopped(pid: int) -> bool:
    found = state_and_parent(pid)
    return found is not None and found[0] == "T"


def test_a_caller_killed_while_the_dht_reads_its_request_does_not_end_the_dht(dht):
    os.kill(dht.pid, signal.SIGSTOP)  # the DHT reads the request only once its caller is frozen
    caller = multiprocessing.get_context("fork").Process(target=_ask_the_dht_and_freeze, args=(dht,))
    try:
        caller.start()
        deadline = time.monotonic() + 10
        while not _stopped(caller.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stopped(caller.pid)
        os.kill(dht.pid, signal.SIGCONT)
        time.sleep(1.0)  # the DHT is now waiting for the frozen caller to hand the pipe over
        caller.kill()  # as an averager killed past its stop grace
        caller.join(10)
        assert dht.store("after", b"ok", get_dht_time() + 60) is True
    finally:
        os.kill(dht.pid, signal.SIGCONT)
        caller.kill()
    assert dht.get("after").value == b"ok"
    assert dht.is_alive()


def test_a_start_that_never_gets_ready_fails_at_its_deadline_and_leaves_no_process(dht, caplog):
    averager = _NeverReady([torch.zeros(8)], dht, prefix=f"never{uuid.uuid4().hex[:6]}", start=False)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="p2ptrain.averaging.lifecycle"), \
            pytest.raises(StartTimeout, match=r"not ready within 2 s"):
        averager.run_in_background(await_ready=True, timeout=2.0)
    assert 2.0 <= time.monotonic() - started < 15.0
    assert not averager.is_alive()
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "not ready within 2 s" in caplog.records[0].getMessage()


def test_a_start_past_its_deadline_logs_where_the_process_hung(dht, capfd, monkeypatch):
    monkeypatch.setattr(lifecycle, "_stacks_on_timeout", False)
    lifecycle.report_stacks_on_timeout()
    try:
        averager = _NeverReady([torch.zeros(8)], dht, prefix=f"never{uuid.uuid4().hex[:6]}", start=False)
        with pytest.raises(StartTimeout):
            averager.run_in_background(await_ready=True, timeout=2.0)
    finally:
        faulthandler.unregister(lifecycle.STACK_DUMP_SIGNAL)
    written = capfd.readouterr().err
    assert f'{os.path.basename(__file__)}", line' in written and "in run" in written, written[-2000:]
    assert not averager.is_alive()


def test_the_start_hivemind_s_constructor_asks_for_has_the_default_deadline(dht, monkeypatch):
    # hivemind's constructor (start=True) waits with no timeout at all; ours applies AVERAGER_START_TIMEOUT.
    monkeypatch.setattr(lifecycle, "AVERAGER_START_TIMEOUT", 2.0)
    started = time.monotonic()
    with pytest.raises(StartTimeout):
        _NeverReady([torch.zeros(8)], dht, prefix=f"never{uuid.uuid4().hex[:6]}", start=True)
    assert time.monotonic() - started < 15.0
