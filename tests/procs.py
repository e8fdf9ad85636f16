"""Find the processes a test left behind: every descendant of the test run, orphans included.

The test process makes itself a child subreaper, so helpers orphaned by a dead node (p2pd,
hivemind's forked processes) are re-parented to it instead of init and stay visible here.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has already exited: reap it, it is not a leak
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return None
    return int(fields[1])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int | None = None) -> dict[int, str]:
    """Live descendants of ``root`` (default: this process) with their command lines."""
    root = os.getpid() if root is None else root
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent_of(int(entry))
            if parent is not None:
                parents[int(entry)] = parent
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        children = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        for pid in children:
            found[pid] = cmdline(pid)
        frontier = children
    return found


def kill_all(pids: dict[int, str]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
