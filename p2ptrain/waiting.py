"""Waiting for a condition with a deadline: the one polling loop of the demo, LocalNode and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


class WaitTimeout(AssertionError, TimeoutError):
    """The condition never held.  An AssertionError, so a test shows it as a plain failure, and a
    TimeoutError, so code that waits for something (the demo) can catch the usual exception."""


def wait_until(predicate: Callable[[], _T | None], timeout: float, what: str, interval: float = 0.25, *,
               detail: Callable[[], str] | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> _T:
    """Call ``predicate`` until it returns something truthy and return that.

    It is called at least once and once more at the deadline; an exception from it propagates
    (that is how a caller stops early, e.g. when the process it waits for died).  After
    ``timeout`` seconds: :class:`WaitTimeout` saying ``no <what> within <timeout> s``, followed
    by ``detail()`` when given (the last state seen, a log tail).
    """
    deadline = clock() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - clock()
        if remaining <= 0:
            message = f"no {what} within {timeout:g} s"
            raise WaitTimeout(f"{message}: {detail()}" if detail is not None else message)
        sleep(min(interval, remaining))
