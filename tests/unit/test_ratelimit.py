"""ClientLimiter on a fake clock: bursts served, a short queue, refusals with Retry-After, a bounded table."""

from __future__ import annotations

import pytest

from p2ptrain.daemon.ratelimit import ClientLimiter
from tests.support.clock import ManualClock


def test_burst_is_served_at_once_then_requests_queue_then_are_refused() -> None:
    clock = ManualClock(100.0)
    limiter = ClientLimiter(rate=10, burst=3, max_wait=0.25, clock=clock)
    waits = [limiter.admit("a") for _ in range(6)]
    assert [w.wait for w in waits[:3]] == [0, 0, 0] and not any(w.refused for w in waits[:3])
    assert [round(w.wait, 3) for w in waits[3:5]] == [0.1, 0.2]  # each waits for its turn
    refused = waits[5]
    assert refused.refused and refused.retry_after == 1 and refused.wait == 0.25
    assert limiter.refused_total == 1
    assert not limiter.admit("b").refused  # another client has its own budget


def test_budget_refills_with_time() -> None:
    clock = ManualClock(100.0)
    limiter = ClientLimiter(rate=2, burst=2, max_wait=0, clock=clock)
    assert not limiter.admit("a").refused and not limiter.admit("a").refused
    assert limiter.admit("a").refused
    clock.now += 0.5
    assert not limiter.admit("a").refused
    clock.now += 10
    assert [limiter.admit("a").refused for _ in range(3)] == [False, False, True]


def test_retry_after_says_how_long() -> None:
    clock = ManualClock(100.0)
    limiter = ClientLimiter(rate=0.1, burst=1, max_wait=0, clock=clock)
    limiter.admit("a")
    assert limiter.admit("a").retry_after == 10


def test_client_table_is_bounded() -> None:
    clock = ManualClock(100.0)
    limiter = ClientLimiter(rate=1, burst=1, max_wait=0, max_clients=10, clock=clock)
    for i in range(100):
        limiter.admit(f"10.0.0.{i}")
    assert len(limiter) <= 10
    clock.now += 5
    limiter.admit("new")
    assert len(limiter) <= 10


@pytest.mark.parametrize("args", [(0, 1), (1, 0), (-1, 5)])
def test_nonsense_settings_are_refused(args: tuple[float, int]) -> None:
    with pytest.raises(ValueError):
        ClientLimiter(*args)
