"""Measuring tools of the fault-injection suite: process RSS from /proc, node statuses, wrapped nodes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


class WrappedNode(LocalNode):
    """A node started through a wrapper command (``command_prefix``: ``unshare``, ``ip netns exec``),
    optionally reached through ``ip netns exec <netns> curl`` because its API lives inside a
    network namespace."""

    netns: str | None = None

    def _read(self, path: str, timeout: float) -> Any:
        if self.netns is None:
            return super()._read(path, timeout)
        url = self.api_url()
        if url is None or not self.running:
            return None
        try:
            done = subprocess.run(["ip", "netns", "exec", self.netns, "curl", "-sf", "-m", str(timeout), url + path],
                                  capture_output=True, timeout=timeout + 5)
            return json.loads(done.stdout) if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None
