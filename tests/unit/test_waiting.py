"""wait_until: the one polling loop, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from p2ptrain.waiting import WaitTimeout, wait_until, wait_until_async


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_returns_the_first_truthy_value() -> None:
    clock = FakeClock()
    answers = iter([None, 0, "", "found"])
    assert wait_until(lambda: next(answers), 10, "x", interval=1, clock=clock, sleep=clock.sleep) == "found"
    assert clock.sleeps == [1, 1, 1]


def test_times_out_after_a_last_try_at_the_deadline() -> None:
    clock = FakeClock()
    calls: list[float] = []
    with pytest.raises(WaitTimeout, match=r"^no answer within 2.5 s: last seen 7$") as caught:
        wait_until(lambda: calls.append(clock.now), 2.5, "answer", interval=1, detail=lambda: "last seen 7",
                   clock=clock, sleep=clock.sleep)
    assert calls == [0, 1, 2, 2.5]
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, TimeoutError)


def test_an_exception_from_the_predicate_stops_the_wait() -> None:
    clock = FakeClock()

    def dead() -> None:
        raise RuntimeError("the node exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until(dead, 10, "x", clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


def test_the_async_wait_awaits_its_pause_and_shares_the_deadline() -> None:
    clock = FakeClock()
    paused: list[float] = []

    async def pause(seconds: float) -> None:
        paused.append(seconds)
        clock.now += seconds

    answers = iter([None, None, "ready"])
    found = asyncio.run(wait_until_async(lambda: next(answers), 10, "x", interval=0.5, pause=pause, clock=clock))
    assert found == "ready" and paused == [0.5, 0.5]
    with pytest.raises(WaitTimeout, match=r"^no screen within 1 s$"):
        asyncio.run(wait_until_async(lambda: None, 1, "screen", interval=0.4, pause=pause, clock=clock))
    assert paused[2:] == [0.4, 0.4, pytest.approx(0.2)]
