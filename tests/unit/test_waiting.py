"""wait_until and retry: the project's polling and retry loops, on a fake clock."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from p2ptrain.waiting import (
    BACKOFF,
    Backoff,
    GaveUp,
    Stopping,
    WaitTimeout,
    answer_unless_stopping,
    asked_to_stop,
    retry,
    wait_until,
    wait_until_async,
)


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


def test_the_one_backoff_policy_doubles_from_a_second_up_to_ten() -> None:
    assert [BACKOFF.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 10, 10, 10]
    assert [Backoff(first=0.5, cap=3).delay(n) for n in range(1, 5)] == [0.5, 1, 2, 3]


def test_retry_returns_the_first_answer_after_backing_off() -> None:
    clock = FakeClock()
    answers = iter([None, None, None, 0])  # 0 is an answer: only None means "try again"
    retried: list[tuple[int, float]] = []
    assert retry(lambda: next(answers), tries=5, on_retry=lambda n, wait: retried.append((n, wait)),
                 clock=clock, sleep=clock.sleep) == 0
    assert clock.sleeps == [1, 2, 4] and retried == [(1, 1), (2, 2), (3, 4)]


def test_retry_gives_up_after_its_tries_without_a_last_wait() -> None:
    clock = FakeClock()
    calls: list[float] = []
    with pytest.raises(GaveUp) as caught:
        retry(lambda: calls.append(clock.now), tries=3, clock=clock, sleep=clock.sleep)
    assert caught.value.tries == 3 and not caught.value.stopped
    assert calls == [0, 1, 3] and clock.sleeps == [1, 2]


def test_retry_within_a_timeout_tries_once_more_at_the_deadline() -> None:
    clock = FakeClock()
    calls: list[float] = []
    with pytest.raises(GaveUp) as caught:
        retry(lambda: calls.append(clock.now), timeout=40, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [1, 2, 4, 8, 10, 10, 5]  # capped, the last wait cut to end at the deadline
    assert calls[-1] == 40 and caught.value.tries == len(calls) == 8


def test_a_stop_cuts_the_wait_short_and_gives_up_at_once() -> None:
    waits: list[float] = []

    def stop_wait(seconds: float) -> bool:  # a stop event's wait: True once a stop was requested
        waits.append(seconds)
        return len(waits) == 2

    calls = []
    with pytest.raises(GaveUp) as caught:
        retry(lambda: calls.append(1), timeout=600, sleep=stop_wait, clock=FakeClock())
    assert caught.value.stopped and caught.value.tries == len(calls) == 2 and waits == [1, 2]


def test_an_exception_from_the_attempt_is_not_retried() -> None:
    clock = FakeClock()

    def permanent() -> None:
        raise PermissionError("refused for good")

    with pytest.raises(PermissionError):
        retry(permanent, tries=4, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []
    with pytest.raises(ValueError, match="needs tries or a timeout"):
        retry(lambda: 1)


class SlowAnswer:
    """A future whose ``result(timeout)`` spends the timeout on a fake clock, answering after ``after`` s."""

    def __init__(self, clock: list[float], after: float) -> None:
        self.clock, self.after, self.cancelled, self.waits = clock, after, False, []

    def result(self, timeout: float | None = None) -> str:
        assert timeout is not None
        self.waits.append(timeout)
        if self.clock[0] + timeout >= self.after:
            self.clock[0] = max(self.clock[0], self.after)
            return "state"
        self.clock[0] += timeout
        raise TimeoutError

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def test_a_wait_for_an_answer_ends_within_a_slice_of_a_stop_and_cancels_it():
    clock = [0.0]
    stop_at = 3.5
    answer = SlowAnswer(clock, after=60.0)
    with pytest.raises(Stopping):
        answer_unless_stopping(answer, 65.0, lambda: clock[0] >= stop_at, clock=lambda: clock[0])
    assert answer.cancelled and clock[0] == 4.0 and answer.waits == [1.0] * 4  # one slice after the stop


def test_a_wait_for_an_answer_gives_the_answer_or_times_out_at_its_deadline():
    clock = [0.0]
    assert answer_unless_stopping(SlowAnswer(clock, after=2.5), 65.0, lambda: False, clock=lambda: clock[0]) == "state"
    clock = [0.0]
    late = SlowAnswer(clock, after=100.0)
    with pytest.raises(TimeoutError):
        answer_unless_stopping(late, 2.5, lambda: False, clock=lambda: clock[0])
    assert late.waits == [1.0, 1.0, 0.5] and not late.cancelled


def test_asked_to_stop_reads_a_stop_event_without_waiting_and_time_sleep_never_stops() -> None:
    event = threading.Event()
    stopping = asked_to_stop(event.wait)
    assert stopping() is False
    event.set()
    assert stopping() is True
    assert asked_to_stop(time.sleep)() is False
