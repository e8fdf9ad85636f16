"""Suite-wide fixtures: every child process a test starts must be gone when the test ends."""

from __future__ import annotations

import time

import pytest

from tests.procs import become_subreaper, descendants, kill_all

#: How long helpers of a stopped node may take to exit (p2pd leaves once its client is gone).
LEAK_GRACE_SECONDS = 45.0


@pytest.fixture(scope="session", autouse=True)
def _subreaper() -> None:
    become_subreaper()


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest):
    """Fail the test that leaves a process behind (after a grace period), and kill the leftovers."""
    before = set(descendants())
    yield
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    leaked = {}
    while time.monotonic() < deadline:
        leaked = {pid: cmd for pid, cmd in descendants().items() if pid not in before}
        if not leaked:
            return
        time.sleep(0.5)
    kill_all(leaked)
    pytest.fail(f"{request.node.nodeid} leaked processes: {leaked}", pytrace=False)
