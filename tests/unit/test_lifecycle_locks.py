"""The locks held around a kill (p2ptrain.averaging.lifecycle): which are found, which are held, all released;
and the DHT's request reader, which outlives a caller that died mid-request."""

from __future__ import annotations

import ctypes
import inspect
import logging
import multiprocessing as mp
import os
from multiprocessing.connection import Connection

import pytest
from hivemind.dht import DHT

from p2ptrain.averaging.lifecycle import DROPPED_REQUEST, RequestReader, hivemind_locks, holding, own_locks


class _Process:
    """Stands in for an averager: the shared values hivemind's and ours create before the fork."""

    def __init__(self) -> None:
        self.lock_averaged_tensors = mp.Lock()
        self._state_sharing_priority = mp.Value(ctypes.c_double, 0)
        self._serving = mp.Value(ctypes.c_int, 0)
        self.prefix = "run"  # not a lock
        self.unlocked = mp.Value(ctypes.c_int, 0, lock=False)  # no lock to take


def test_own_locks_are_the_process_shared_ones() -> None:
    process = _Process()
    found = own_locks(process)
    assert len(found) == 3
    assert process.lock_averaged_tensors in found and process._serving.get_lock() in found


def test_held_inside_released_after_and_a_busy_one_reported_not_waited_for_ever() -> None:
    free, busy = mp.Lock(), mp.Lock()
    busy.acquire()  # another process's, stuck
    with holding([free, busy], timeout=0.01) as missed:
        assert missed == [busy]
        assert not free.acquire(block=False)  # held by us
    assert free.acquire(block=False)  # released
    free.release()
    busy.release()


def test_hivemind_s_locks_are_free_between_kills() -> None:
    with holding(hivemind_locks(), timeout=1.0) as missed:
        assert missed == []
    assert all(lock.acquire(timeout=1.0) for lock in hivemind_locks())
    for lock in hivemind_locks():
        lock.release()


def _send_a_pipe_and_exit(connection: Connection) -> None:
    """As an averager's DHT call does: the request's future carries the pipe its answer goes back
    through, whose descriptor this process serves to the reader, until it exits."""
    answers, _ = mp.Pipe(duplex=False)
    connection.send(("_get", [], {"key": "k", "answer_to": answers}))
    os._exit(0)


def test_a_request_whose_sender_exited_before_it_was_read_is_dropped_and_the_next_one_read(caplog) -> None:
    reader_end, sender_end = mp.get_context("fork").Pipe(duplex=True)
    sender = mp.get_context("fork").Process(target=_send_a_pipe_and_exit, args=(sender_end,))
    sender.start()
    sender.join(10)
    assert sender.exitcode == 0
    sender_end.send(("_get", [], {"key": "k"}))
    reader = RequestReader(reader_end)
    with caplog.at_level(logging.WARNING, logger="p2ptrain.averaging.lifecycle"):
        assert reader.poll(5)
        assert reader.recv() == (DROPPED_REQUEST, [], {})  # raw: hivemind logs a traceback and stalls its loop
        assert reader.recv() == ("_get", [], {"key": "k"})
    assert [r.getMessage() for r in caplog.records] == [
        "DHT: dropped a request whose caller exited before it was read (ConnectionRefusedError)"]


def _caller_gone_mid_handover() -> None:
    raise EOFError  # as recvfds raises when the caller dies between its handshake and the descriptor


class _PipeOfAGoneCaller:
    def __reduce__(self) -> tuple:
        return _caller_gone_mid_handover, ()


def test_a_request_whose_pipe_handover_breaks_off_is_dropped_too() -> None:
    reader_end, sender_end = mp.get_context("fork").Pipe(duplex=True)
    sender_end.send(("_get", [], {"future": _PipeOfAGoneCaller()}))
    assert RequestReader(reader_end).recv() == (DROPPED_REQUEST, [], {})


def test_a_closed_request_pipe_still_ends_the_reader() -> None:
    reader_end, sender_end = mp.get_context("fork").Pipe(duplex=True)
    sender_end.close()
    with pytest.raises(EOFError):
        RequestReader(reader_end).recv()


def test_hivemind_s_dht_loop_reads_its_requests_with_recv_after_poll() -> None:
    source = inspect.getsource(inspect.unwrap(DHT.run))
    assert "self._inner_pipe.poll()" in source and "self._inner_pipe.recv()" in source
