"""Find the processes a test left behind: every descendant of the test run, orphans included.

The test process makes itself a child subreaper, so helpers orphaned by a dead node (p2pd,
hivemind's forked processes) are re-parented to it instead of init and stay visible here.
Zombies are not counted (they have exited). Orphans that exit become zombies of the test process;
:func:`reap_orphans` collects them, but never a zombie that a live ``Popen`` object still owns,
because reaping that behind its back would lose the exit code a test is about to check.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from p2ptrain.proc import descendants, signal_all, state_and_parent

__all__ = ["SHARED", "become_subreaper", "descendants", "is_shared", "kill_all", "reap_orphans",
           "shared_processes", "zombie_children"]

#: Processes that a fixture wider than one test started (a module's DHTs, a scenario's nodes), with
#: everything they start: they outlive the test that happened to start them, and are not its leftovers.
SHARED: set[int] = set()

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def zombie_children(parent: int | None = None) -> list[int]:
    """Children of ``parent`` (default: this process) that have exited and wait to be reaped."""
    parent = os.getpid() if parent is None else parent
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and state_and_parent(int(entry)) == ("Z", parent)]


@contextmanager
def shared_processes() -> Iterator[None]:
    """Every process started inside belongs to a fixture wider than one test (see :data:`SHARED`)."""
    before = set(descendants())
    try:
        yield
    finally:
        SHARED.update(set(descendants()) - before)


def is_shared(pid: int) -> bool:
    """Whether ``pid`` is in :data:`SHARED` or a descendant of one there."""
    own = os.getpid()
    while pid not in (own, 0, 1):
        if pid in SHARED:
            return True
        found = state_and_parent(pid)
        if found is None:
            return False
        pid = found[1]
    return False


def kill_all(pids: dict[int, str]) -> None:
    signal_all(pids, signal.SIGKILL)


def reap_orphans() -> int:
    """Reap zombies re-parented to this subreaper (not our own ``Popen`` children); return how many."""
    zombies = zombie_children()
    if not zombies:
        return 0  # the common case: skip the scan of every live object below
    # type(), not isinstance(): isinstance() reads __class__, which lazy module proxies answer with warnings.
    owned = {obj.pid for obj in gc.get_objects()
             if issubclass(type(obj), subprocess.Popen) and obj.returncode is None}
    reaped = 0
    for pid in zombies:
        if pid in owned:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
            reaped += 1
        except ChildProcessError:
            pass
    return reaped
