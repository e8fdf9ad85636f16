"""Suite-wide fixtures: every child process a test starts must be gone when the test ends."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest

from p2ptrain.local.forkserver import ForkServer
from p2ptrain.waiting import WaitTimeout, wait_until
from tests.support.durations import DurationRecorder, longest_first, recorded
from tests.support.processes import become_subreaper, descendants, is_shared, kill_all, reap_orphans

#: How long helpers of a stopped node may take to exit (p2pd leaves once its client is gone).
LEAK_GRACE_SECONDS = 45.0
#: Started by torch once per process for shared-memory tensors (in-process DHTs use them); it
#: stays for the life of the test run and exits with it, so it is not a leak.
PER_RUN_HELPERS = ("torch_shm_manager",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--longest-first", action="store_true",
                     help="run the test files longest first, by tests/durations.json (with xdist: "
                          "--dist loadfile --no-loadscope-reorder)")
    parser.addoption("--store-durations", action="store_true",
                     help="merge the seconds of each test file run into tests/durations.json")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):  # the controller only
        config.pluginmanager.register(DurationRecorder(), "p2ptrain-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("longest_first"):  # tests/support/durations.py says why
        longest_first(items, recorded())


@pytest.fixture(scope="session", autouse=True)
def _subreaper() -> None:
    become_subreaper()


@pytest.fixture(scope="session")
def node_forkserver() -> Iterator[ForkServer]:
    """Forks the nodes of this test process (each xdist worker has its own): see its module."""
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest):
    """Fail the test that leaves a process behind (after a grace period), and kill the leftovers."""
    before = set(descendants())
    yield
    try:
        _wait_for_leftovers(request, before)
    finally:
        reap_orphans()


def _wait_for_leftovers(request: pytest.FixtureRequest, before: set[int]) -> None:
    def leftovers() -> dict[int, str]:
        return {pid: cmd for pid, cmd in descendants().items()
                if pid not in before and not is_shared(pid) and not cmd.split(" ", 1)[0].endswith(PER_RUN_HELPERS)}

    try:
        wait_until(lambda: not leftovers(), LEAK_GRACE_SECONDS, "exit of the test's processes", interval=0.5)
        return
    except WaitTimeout:
        leaked = leftovers()
    # A leftover hivemind process forked from this one shares hivemind's locks with the next test's:
    # killed while it holds one, it would wedge them (p2ptrain.averaging.lifecycle), so hold them here.
    lifecycle = sys.modules.get("p2ptrain.averaging.lifecycle")
    with (lifecycle.holding(lifecycle.hivemind_locks(), lifecycle.LOCK_TIMEOUT) if lifecycle is not None
          else contextlib.nullcontext()):
        kill_all(leaked)
    pytest.fail(f"{request.node.nodeid} leaked processes: {leaked}", pytrace=False)
