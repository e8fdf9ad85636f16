"""Find the processes a test left behind: every descendant of the test run, orphans included.

The test process makes itself a child subreaper, so helpers orphaned by a dead node (p2pd,
hivemind's forked processes) are re-parented to it instead of init and stay visible here.
Zombies are not counted (they have exited); they are not reaped here either, because reaping a
``Popen`` child behind its back would lose the exit code a test is about to check.
"""

from __future__ import annotations

import ctypes
import signal

from p2ptrain.proc import descendants, signal_all

__all__ = ["become_subreaper", "descendants", "kill_all"]

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_all(pids: dict[int, str]) -> None:
    signal_all(pids, signal.SIGKILL)
