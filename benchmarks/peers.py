"""Benchmark peers as process groups: start them, wait for all of them (bounded), kill whatever is left."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from p2ptrain.local.forkserver import ForkServer
from p2ptrain.waiting import WaitTimeout, wait_until

#: What a forked peer imports before it starts (the fork server imports it once).
PEER_MODULES = ("benchmarks.worker", "benchmarks.node_peer")
_fork_server: ForkServer | None = None


class PeerProcess(Protocol):
    """A started peer, by process ID: a ``subprocess.Popen`` or a forked process."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def add_fork_option(p: argparse.ArgumentParser) -> None:
    """``--fork-workers``: for smoke runs, where each peer's imports would be most of the CPU spent."""
    p.add_argument("--fork-workers", action="store_true",
                   help="fork every peer from one process that imported torch and hivemind once (smoke runs: "
                        "a peer's start-up CPU and memory figures are then not a fresh process's)")


def start_peer(module: str, argv: Sequence[str], env: Mapping[str, str], log: Path, *, fork: bool,
               cores: set[int] | None = None, prefix: Sequence[str] = ()) -> PeerProcess:
    """``python -m module *argv`` in a session of its own, its output to ``log``.  ``fork``: from this
    process's fork server (started by the first such call, with that call's ``env``); pinned to
    ``cores`` or run under a wrapper command (``prefix``: ``ip netns exec NS``), always a process of
    its own."""
    if fork and not cores and not prefix:
        return _forks(env).start(argv, env, log, module=module)
    with open(log, "ab") as out:
        return subprocess.Popen([*prefix, sys.executable, "-m", module, *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=dict(env), start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)


def _forks(env: Mapping[str, str]) -> ForkServer:
    global _fork_server
    if _fork_server is None:
        _fork_server = ForkServer(PEER_MODULES, env)
        atexit.register(_fork_server.close)
    return _fork_server


def kill_group(proc: PeerProcess) -> None:
    """Kill the session the harness created for ``proc`` (the peer and its hivemind helpers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def wait_for_peers(procs: Sequence[PeerProcess], timeout: float, what: str, log_of: Callable[[int], Path],
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
