"""A node's own footprint on its machine: its processes, their CPU time and their memory (PSS), by role.

A node is its ``p2ptrain run`` process and everything it started: hivemind's forked helpers (the
DHT process and the averagers share the node's command line, since they are forks) and the p2p
daemon.  PSS (proportional set size) counts a page shared by k processes as 1/k in each, so the PSS
of all nodes on a machine adds up to what they take from it, which RSS would count k times.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from p2ptrain.proc import cmdline, cpu_seconds, descendants

ROLES = ("node", "helpers", "p2pd")


def role_of(pid: int, root: int, command: str) -> str:
    """``node`` for the root process, ``p2pd`` for the p2p daemon, ``helpers`` for the forks."""
    if pid == root:
        return "node"
    return "p2pd" if "p2pd" in command.split(" ", 1)[0] else "helpers"


def pss_kib(pid: int) -> int:
    """The process's PSS in KiB from /proc/<pid>/smaps_rollup (0 for a vanished process)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


@dataclass
class TreeSample:
    """One reading of a node's process tree."""

    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU seconds used so far by the tree's live processes, summed by role."""
    pss_mib: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    open_files: int = 0


def sample_tree(root: int, memory: bool = False) -> TreeSample:
    """Read the tree under ``root``: CPU by role always, PSS and open files when ``memory``."""
    sample = TreeSample({role: 0.0 for role in ROLES}, {role: 0.0 for role in ROLES}, {role: 0 for role in ROLES})
    found = {root: cmdline(root), **descendants(root)}
    for pid, command in found.items():
        role = role_of(pid, root, command)
        sample.cpu_seconds[role] += cpu_seconds(pid)
        sample.processes[role] += 1
        if memory:
            sample.pss_mib[role] += pss_kib(pid) / 1024
            sample.open_files += open_files(pid)
    return sample


def cpu_percent(before: TreeSample, after: TreeSample, seconds: float) -> dict[str, float]:
    """Percent of one core per role between two readings (a helper that exited in between counts 0)."""
    return {role: max(0.0, after.cpu_seconds[role] - before.cpu_seconds[role]) / seconds * 100 for role in ROLES}
