"""Waiting for a condition with a deadline, and retrying what failed: the project's two waiting loops.

:func:`wait_until` polls at a fixed interval (the demo, LocalNode and the tests); :func:`wait_until_async`
is the same loop for code that runs on an event loop (the TUI's Pilot tests), where sleeping would
block the very app being waited on, so it awaits instead.  Both share the deadline and the timeout
message.

:func:`answer_unless_stopping` waits for another process's answer (a future) the way a node must: a
stop asked for meanwhile ends the wait within a second instead of at the answer's timeout.

:func:`retry` is the one retry loop of the library: joining a swarm, fetching a run's manifest,
downloading a shard.  Its waits follow the one backoff policy, :data:`BACKOFF`, and it gives up
after a number of tries, a timeout, or a stop, raising :class:`GaveUp`; each caller turns that into
its own one line.  :class:`StopEvent` is what the library's waits that a stop cuts short are given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class StopEvent(Protocol):
    """A ``threading.Event`` or the daemon's ``Stopper``: every wait goes through ``wait(t)``, True once a
    stop was asked for."""

    def wait(self, timeout: float | None = None) -> bool: ...


class WaitTimeout(AssertionError, TimeoutError):
    """The condition never held.  An AssertionError, so a test shows it as a plain failure, and a
    TimeoutError, so code that waits for something (the demo) can catch the usual exception."""


class Stopping(Exception):
    """A wait was cut short because whoever waits is stopping."""


class PendingAnswer(Protocol[_T_co]):
    """A ``concurrent.futures.Future`` or one of hivemind's ``MPFuture`` s, as a waiter sees it."""

    def result(self, timeout: float | None = None) -> _T_co: ...

    def cancel(self) -> bool: ...


def asked_to_stop(wait: Callable[[float], object]) -> Callable[[], bool]:
    """``stopping`` for :func:`answer_unless_stopping` from a stop event's ``wait(t)`` (True once a stop
    was asked for), asked not to wait; ``time.sleep``, the wait of code that never stops, never says so."""
    return lambda: bool(wait(0.0))


def answer_unless_stopping(future: PendingAnswer[_T], timeout: float, stopping: Callable[[], bool], *,
                           every: float = 1.0, clock: Callable[[], float] = time.monotonic) -> _T:
    """``future.result(timeout)``, asking ``stopping()`` every ``every`` seconds meanwhile: the answer,
    TimeoutError past ``timeout``, or :class:`Stopping` (the future cancelled) once ``stopping()`` says
    True.  Why: a node that waits a minute for a state download it no longer needs would sit out
    ``systemctl stop`` for that minute."""
    deadline = clock() + timeout
    while True:
        try:
            return future.result(timeout=max(0.0, min(every, deadline - clock())))
        except TimeoutError:
            if clock() >= deadline:
                raise
            if stopping():
                future.cancel()
                raise Stopping from None


class _Deadline:
    def __init__(self, timeout: float, what: str, detail: Callable[[], str] | None,
                 clock: Callable[[], float]) -> None:
        self.timeout, self.what, self.detail, self.clock = timeout, what, detail, clock
        self.end = clock() + timeout

    def next_pause(self, interval: float) -> float:
        """How long to wait before the next try; :class:`WaitTimeout` once the deadline has passed."""
        remaining = self.end - self.clock()
        if remaining <= 0:
            message = f"no {self.what} within {self.timeout:g} s"
            raise WaitTimeout(f"{message}: {self.detail()}" if self.detail is not None else message)
        return min(interval, remaining)


def wait_until(predicate: Callable[[], _T | None], timeout: float, what: str, interval: float = 0.25, *,
               detail: Callable[[], str] | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> _T:
    """Call ``predicate`` until it returns something truthy and return that.

    It is called at least once and once more at the deadline; an exception from it propagates
    (that is how a caller stops early, e.g. when the process it waits for died).  After
    ``timeout`` seconds: :class:`WaitTimeout` saying ``no <what> within <timeout> s``, followed
    by ``detail()`` when given (the last state seen, a log tail).
    """
    deadline = _Deadline(timeout, what, detail, clock)
    while True:
        value = predicate()
        if value:
            return value
        sleep(deadline.next_pause(interval))


async def wait_until_async(predicate: Callable[[], _T | None], timeout: float, what: str, interval: float = 0.25, *,
                           pause: Callable[[float], Awaitable[object]] = asyncio.sleep,
                           detail: Callable[[], str] | None = None,
                           clock: Callable[[], float] = time.monotonic) -> _T:
    """:func:`wait_until` on an event loop: ``await pause(seconds)`` between tries (e.g. a Textual
    Pilot's ``pause``, which also lets the app process its messages and refresh)."""
    deadline = _Deadline(timeout, what, detail, clock)
    while True:
        value = predicate()
        if value:
            return value
        await pause(deadline.next_pause(interval))


@dataclass(frozen=True)
class Backoff:
    """Waits that grow between tries: ``first`` seconds, doubling, never more than ``cap``.

    Doubling spreads a swarm's retries out when a peer is down for a while; the cap keeps a retry
    within seconds of a peer coming back (a join waits at most ``cap`` seconds longer than it must).
    """

    first: float = 1.0
    cap: float = 10.0

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failed try (1: the first)."""
        return min(self.cap, self.first * 2.0 ** (failures - 1))


#: The one backoff policy of the project: 1, 2, 4, 8, 10, 10, ... seconds.
BACKOFF = Backoff()


class GaveUp(Exception):
    """:func:`retry` stopped trying: its tries or its time ran out, or (``stopped``) a stop cut a wait short."""

    def __init__(self, tries: int, stopped: bool) -> None:
        super().__init__(f"gave up after {tries} tries" + (" (stopped)" if stopped else ""))
        self.tries, self.stopped = tries, stopped


def retry(attempt: Callable[[], _T | None], *, tries: int | None = None, timeout: float | None = None,
          backoff: Backoff = BACKOFF, on_retry: Callable[[int, float], None] | None = None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] = time.sleep) -> _T:
    """Call ``attempt`` until it returns something other than None and return that.

    None means "failed, try again" (the attempt keeps what it needs for its caller's message); an
    exception from it propagates, so what another try would only repeat ends the loop at once.
    Between tries it waits ``backoff``'s delays; the last wait is shortened to end at the deadline,
    where it tries once more.  ``on_retry(tries_so_far, wait)`` runs before each wait (a log line).
    ``sleep`` may be a stop event's ``wait``: when it returns True a stop was requested and retry
    gives up at once.  Gives up with :class:`GaveUp` after ``tries`` tries or ``timeout`` seconds
    (None: no such bound; at least one is needed).
    """
    if tries is None and timeout is None:
        raise ValueError("retry needs tries or a timeout")
    end = None if timeout is None else clock() + timeout
    made = 0
    while True:
        value = attempt()
        made += 1
        if value is not None:
            return value
        wait = backoff.delay(made)
        if tries is not None and made >= tries:
            raise GaveUp(made, stopped=False)
        if end is not None:
            remaining = end - clock()
            if remaining <= 0:
                raise GaveUp(made, stopped=False)
            wait = min(wait, remaining)
        if on_retry is not None:
            on_retry(made, wait)
        if sleep(wait) is True:
            raise GaveUp(made, stopped=True)
