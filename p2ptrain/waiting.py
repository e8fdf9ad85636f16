"""Waiting for a condition with a deadline: the one polling loop of the demo, LocalNode and the tests.

:func:`wait_until` sleeps between tries; :func:`wait_until_async` is the same loop for code that
runs on an event loop (the TUI's Pilot tests), where sleeping would block the very app being
waited on, so it awaits instead.  Both share the deadline and the timeout message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

_T = TypeVar("_T")


class WaitTimeout(AssertionError, TimeoutError):
    """The condition never held.  An AssertionError, so a test shows it as a plain failure, and a
    TimeoutError, so code that waits for something (the demo) can catch the usual exception."""


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
