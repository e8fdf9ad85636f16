"""Measuring tools of the fault-injection suite: process RSS from /proc, node statuses, wrapped nodes."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from p2ptrain.local.swarm import LocalNode
from p2ptrain.status import StatusSnapshot
from tests.support.processes import descendants


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (p2pd, hivemind's forked helpers)."""
    total = 0
    for each in (pid, *descendants(pid)):
        try:
            text = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def statuses(nodes: Iterable[LocalNode]) -> dict[str, StatusSnapshot]:
    """Status of every running node that answers (by name)."""
    found = {}
    for node in nodes:
        if node.running:
            status = node.status(timeout=3.0)
            if status is not None:
                found[node.name] = status
    return found


def training(node: LocalNode, timeout: float = 90.0) -> StatusSnapshot:
    return node.wait_for(lambda s: s.state == "training", timeout, "TRAINING state")


def log_text(node: LocalNode) -> str:
    try:
        return node.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
