"""Process hygiene: children that die with their parent, and finding every descendant of a process."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

from p2ptrain.waiting import WaitTimeout, wait_until

_PR_SET_PDEATHSIG = 1
#: The signal that asks a node, or a helper forked from it, for its threads' stacks: the node installs
#: the interpreter's own handler for it (:mod:`faulthandler`), which writes them to stderr from the
#: signal handler itself, so a process whose threads are all blocked still answers.  hivemind and
#: the node use it for nothing else.  It goes to one process at a time, never a group: every helper
#: forked from the node answers it too, into the same log, and their stacks would interleave.
STACK_DUMP_SIGNAL = signal.SIGUSR2
#: How long a process gets to write its stacks before whatever comes next (a kill, a read of its log).
STACK_DUMP_SECONDS = 1.0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent thread exits (Linux only).

    Meant for a freshly forked child (``preexec_fn`` or an at-fork hook); elsewhere a no-op.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its state letter on (the command name may hold spaces); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def state_and_parent(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) from /proc/<pid>/stat; None for a vanished process."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[1]))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (0 for a vanished one)."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _parent_of(pid: int) -> int | None:
    """The parent pid of a live process; None for vanished processes and zombies."""
    found = state_and_parent(pid)
    return None if found is None or found[0] == "Z" else found[1]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int | None = None) -> dict[int, str]:
    """Live descendants of ``root`` (default: this process) with their command lines, from /proc."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
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


def processes_matching(predicate: Callable[[str], bool]) -> dict[int, str]:
    """Every live process (not a zombie) whose command line satisfies ``predicate``."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _parent_of(int(entry)) is not None:
            command = cmdline(int(entry))
            if command and predicate(command):
                found[int(entry)] = command
    return found


def stop_processes(pids: Iterable[int], grace: float) -> None:
    """SIGTERM ``pids``, give them ``grace`` seconds, SIGKILL whatever is left."""
    pending = list(pids)
    signal_all(pending, signal.SIGTERM)

    def all_gone() -> bool:
        pending[:] = [pid for pid in pending if _parent_of(pid) is not None]
        return not pending

    with contextlib.suppress(WaitTimeout):
        wait_until(all_gone, grace, "exit after SIGTERM", interval=0.05)
    signal_all(pending, signal.SIGKILL)


def signal_all(pids: dict[int, str] | list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
