"""A clock the test moves by hand, for code that takes a ``clock`` callable."""

from __future__ import annotations


class ManualClock:
    """Returns :attr:`now`, which only the test changes."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
