"""The node's loss curve for ``p2ptrain report``: one point per epoch, bounded, thinned evenly when full.

A run can last millions of epochs, the snapshot must stay small: when the curve is full every
other point is dropped and from then on only every second epoch is kept (then every fourth...),
so the points always span the whole run since the node started, evenly.
"""

from __future__ import annotations

import math

#: Points kept per curve (training and validation loss each).
LOSS_HISTORY_POINTS = 128


class LossCurve:
    """(epoch, loss) pairs, oldest first; a new point only for an epoch past the last one."""

    def __init__(self, points: int = LOSS_HISTORY_POINTS) -> None:
        self._points = max(2, points)
        self._epochs: list[int] = []
        self._values: list[float] = []
        self._stride = 1
        self._offered = 0
        self._last_epoch: int | None = None

    def add(self, epoch: int, value: float | None) -> None:
        if value is None or not math.isfinite(value) or (self._last_epoch is not None and epoch <= self._last_epoch):
            return
        self._last_epoch = epoch
        self._offered += 1
        if (self._offered - 1) % self._stride:
            return
        self._epochs.append(int(epoch))
        self._values.append(float(value))
        if len(self._epochs) > self._points:
            self._epochs, self._values = self._epochs[::2], self._values[::2]
            self._stride *= 2

    @property
    def epochs(self) -> tuple[int, ...]:
        return tuple(self._epochs)

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(self._values)
