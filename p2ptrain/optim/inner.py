"""The inner optimizer both modes share: AdamW that clips the averaged gradient, and its LR schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch


def warmup_cosine(warmup: int, total: int, floor: float = 0.1) -> Callable[[int], float]:
    """LR multiplier per optimizer epoch: linear warmup, then cosine decay down to ``floor``."""

    def factor(epoch: int) -> float:
        if epoch < warmup:
            return (epoch + 1) / warmup
        progress = min(1.0, (epoch - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class ClippedAdamW(torch.optim.AdamW):
    """AdamW that clips the (already averaged) gradient to ``max_grad_norm`` before each step."""

    def __init__(self, params: Iterable[Any], *, max_grad_norm: float, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        grads = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if grads:
            torch.nn.utils.clip_grad_norm_(grads, self.max_grad_norm)
        return super().step(closure)
