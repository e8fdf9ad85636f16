"""One local training step and what it measured. No network, no HTTP: the optimizer hides the swarm.

Non-finite gradients are never handed to the optimizer (and so never reach peers): the step is
skipped, counted and logged.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.tasks.base import Task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepStats:
    loss: float
    samples: int
    seconds: float
    skipped_nonfinite: bool
    epoch: int


def gradients_are_finite(model: torch.nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return True
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


class Trainer:
    """Runs micro-batches of ``task`` through the swarm ``optimizer``."""

    def __init__(self, task: Task, optimizer: SwarmOptimizer, batch_size: int) -> None:
        self.task = task
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.nonfinite_skips = 0
        self.samples_processed = 0

    @property
    def epoch(self) -> int:
        return int(self.optimizer.local_epoch)

    def step(self) -> StepStats:
        started = time.perf_counter()
        model = self.task.model
        model.train()
        batch = self.task.train_batches.next()
        loss = self.task.loss_fn(model, batch)
        loss.backward()
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value) or not gradients_are_finite(model):
            self.optimizer.zero_grad()
            self.nonfinite_skips += 1
            logger.warning("non-finite loss or gradient (loss=%s): skipped this contribution (%d so far)",
                           loss_value, self.nonfinite_skips)
            return StepStats(loss_value, 0, time.perf_counter() - started, True, self.epoch)
        self.optimizer.step(batch_size=self.batch_size)
        self.optimizer.zero_grad()
        self.samples_processed += self.batch_size
        return StepStats(loss_value, self.batch_size, time.perf_counter() - started, False, self.epoch)

    def validation_loss(self) -> float:
        return validation_loss(self.task)


@torch.no_grad()
def validation_loss(task: Task) -> float:
    """Mean loss over the task's validation batches (the same on every node), model back in train mode."""
    model = task.model
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in task.validation_batches():
            total += float(task.loss_fn(model, batch))
            count += 1
    finally:
        model.train()
    return total / count if count else math.nan
