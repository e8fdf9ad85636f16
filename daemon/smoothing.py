"""Small smoothing helpers for the node's live figures (samples/s, loss)."""

from __future__ import annotations

import collections
import math


class WindowRate:
    """Events per second over a sliding time window (robust to pauses, unlike an EMA of step times)."""

    def __init__(self, window: float = 20.0) -> None:
        self.window = window
        self._events: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, now: float, count: int) -> None:
        self._events.append((now, count))
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        if not self._events:
            return 0.0
        span = max(now - self._events[0][0], 1.0)
        return sum(count for _, count in self._events) / span

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self.window:
            self._events.popleft()


class Ema:
    """Exponential moving average that ignores non-finite samples."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def add(self, sample: float) -> None:
        if not math.isfinite(sample):
            return
        self.value = sample if self.value is None else (1 - self.alpha) * self.value + self.alpha * sample
