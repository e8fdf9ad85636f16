"""The locks held around a kill (p2ptrain.averaging.lifecycle): which are found, which are held, all released."""

from __future__ import annotations

import ctypes
import multiprocessing as mp

from p2ptrain.averaging.lifecycle import hivemind_locks, holding, own_locks


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
