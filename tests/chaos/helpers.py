"""Measuring tools of the fault-injection suite: process RSS from /proc, polling with a deadline."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from p2ptrain.localswarm import LocalNode
from p2ptrain.status import StatusSnapshot
from tests.livenode import wait_until
from tests.procs import descendants

_T = TypeVar("_T")


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


def poll(probe: Callable[[], _T | None], timeout: float, what: str, every: float = 0.5) -> _T:
    """Call ``probe`` until it returns something truthy; raise AssertionError naming ``what`` if it never does."""
    return wait_until(probe, timeout, what, interval=every)


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
    """A node started through a wrapper command (``unshare``, ``ip netns exec``); optionally reached
    through ``ip netns exec <netns> curl`` because its API lives inside a network namespace."""

    prefix: list[str] = []
    netns: str | None = None

    def start(self, join: Iterable[str] = ()) -> None:
        import os
        import signal
        import subprocess
        import sys

        from p2ptrain.proc import die_with_parent

        if not self.config_path.exists():
            self.write_config()
        (self.state_dir / "api.url").unlink(missing_ok=True)
        command = [*self.prefix, sys.executable, "-m", "p2ptrain.cli", "run", "--config", str(self.config_path)]
        for addr in join:
            command += ["--join", addr]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM),
            )

    def _get(self, path: str, timeout: float):  # type: ignore[override]
        if self.netns is None:
            return super()._get(path, timeout)
        import json
        import subprocess

        url = self.api_url()
        if url is None or not self.running:
            return None
        try:
            done = subprocess.run(["ip", "netns", "exec", self.netns, "curl", "-sf", "-m", str(timeout), url + path],
                                  capture_output=True, timeout=timeout + 5)
            return json.loads(done.stdout) if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None
