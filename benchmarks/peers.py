"""Benchmark peers as process groups: wait for all of them (bounded), kill whatever is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from p2ptrain.waiting import WaitTimeout, wait_until


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the session the harness created for ``proc`` (the peer and its hivemind helpers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def wait_for_peers(procs: list[subprocess.Popen[bytes]], timeout: float, what: str, log_of: Callable[[int], Path],
                   tick: Callable[[], None] | None = None) -> None:
    """Wait until every peer exited 0; raise RuntimeError with the first failed peer's log tail.

    Stops early when one peer fails (the others would only wait for it); ``tick`` runs about every
    0.1 s while waiting.
    """
    def settled() -> bool:
        if tick is not None:
            tick()
        return all(p.poll() is not None for p in procs) or any(p.poll() not in (None, 0) for p in procs)

    with contextlib.suppress(WaitTimeout):  # a peer still running at the deadline is reported below
        wait_until(settled, timeout, what, interval=0.1)
    failed = [(rank, p.poll()) for rank, p in enumerate(procs) if p.poll() != 0]
    if failed:
        tail = log_of(failed[0][0]).read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{what}: peers {failed} did not finish cleanly (timeout {timeout:.0f}s); "
                           f"last log lines:\n{tail}")
