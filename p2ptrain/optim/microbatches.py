"""Gradient accumulation over the micro-batches of one DiLoCo inner step, a dropped micro-batch left out."""

from __future__ import annotations

import torch


class MicroBatches:
    """Sums the gradients of the micro-batches of one inner step apart from ``.grad``.

    Each accepted micro-batch's gradients are moved into the sums (``.grad`` left empty), so a
    micro-batch the trainer drops (non-finite loss or gradients; it calls ``zero_grad``) is thrown
    away alone, whatever its place in the inner batch, and never mixes into the others.
    """

    def __init__(self, params: list[torch.Tensor], per_step: int) -> None:
        self.params, self.per_step = params, per_step
        self.count = 0
        self._sums: list[torch.Tensor] | None = None

    def resize(self, per_step: int) -> None:
        """Micro-batches per inner step from the next inner step on (an inner batch under way keeps its size)."""
        if self.count == 0:
            self.per_step = max(1, per_step)

    @torch.no_grad()
    def add(self) -> bool:
        """Take the current micro-batch's gradients; True once ``per_step`` of them are in."""
        self.count += 1
        if self.per_step == 1:
            return True  # nothing to sum: the gradients stay where the inner optimizer reads them
        if self._sums is None:
            self._sums = [torch.zeros_like(p) for p in self.params]
        for total, param in zip(self._sums, self.params, strict=True):
            if param.grad is not None:
                total.add_(param.grad)
                param.grad = None
        return self.count >= self.per_step

    @torch.no_grad()
    def load_mean(self) -> None:
        """Put the mean of the summed gradients into ``.grad`` for the inner step, and start over."""
        if self.per_step > 1 and self._sums is not None:
            for total, param in zip(self._sums, self.params, strict=True):
                param.grad = total.div_(max(1, self.count))
            self._sums = None
        self.count = 0

    def reset(self) -> None:
        self.count, self._sums = 0, None
