"""One local training step and what it measured. No network, no HTTP: the optimizer hides the swarm.

Non-finite gradients are never handed to the optimizer (and so never reach peers): the step is
skipped, counted and logged.  The forward pass runs in the node's precision (autocast, see
:mod:`p2ptrain.model.device`) on its device; with fp16 the loss is scaled and the gradients unscaled
before anything looks at them, so the optimizer and the swarm only ever see true fp32 gradients.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from p2ptrain.model.device import Placement
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

    def __init__(self, task: Task, optimizer: SwarmOptimizer, batch_size: int,
                 placement: Placement | None = None) -> None:
        self.task = task
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.placement = placement if placement is not None else Placement()
        #: The scaler's view of the parameters (torch's GradScaler unscales through ``param_groups``).
        self._grads = _Grads(task.model) if self.placement.scaler is not None else None
        self.nonfinite_skips = 0
        self.samples_processed = 0

    @property
    def epoch(self) -> int:
        return int(self.optimizer.local_epoch)

    def step(self) -> StepStats:
        started = time.perf_counter()
        model = self.task.model
        model.train()
        batch = self.placement.batch(self.task.train_batches.next())
        with self.placement.autocast():
            loss = self.task.loss_fn(model, batch)
        scaler = self.placement.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.unscale_(self._grads)
        loss_value = float(loss.detach())
        finite = math.isfinite(loss_value) and gradients_are_finite(model)
        if scaler is not None:
            scaler.update()  # an overflow halves the scale, a run of good steps grows it
        if not finite:
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
        return validation_loss(self.task, self.placement)


class _Grads:
    """The model's parameters as one parameter group: what ``GradScaler.unscale_`` walks (the swarm
    optimizers differ in their own groups; the gradients are the model's either way)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.param_groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]


@torch.no_grad()
def validation_loss(task: Task, placement: Placement | None = None) -> float:
    """Mean loss over the task's validation batches (the same on every node), model back in train mode.

    Evaluated in fp32 on the node's device whatever the training precision, so the losses of peers
    with different precisions compare (records, the donor check)."""
    placement = placement if placement is not None else Placement()
    model = task.model
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in task.validation_batches():
            total += float(task.loss_fn(model, placement.batch(batch)))
            count += 1
    finally:
        model.train()
    return total / count if count else math.nan
