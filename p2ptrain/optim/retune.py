"""Retuning a running optimizer: a new manifest version's learning rate, schedule, weight decay and
gradient clipping, applied in place at an epoch boundary.

A run's owner may change these while nodes train (see :data:`p2ptrain.run.updates.LIVE_TRAINING`).
Rebuilding the optimizer would drop its state (Adam moments) and, in hivemind, its averagers; so
both swarm optimizers change the settings of the torch optimizer and LR schedule they already
hold, and the schedule goes on from the step it has reached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from p2ptrain.config.schema import TrainingSection


def retune(optimizer: torch.optim.Optimizer, scheduler: Any, cfg: TrainingSection,
           lr_factor: Callable[[int], float]) -> None:
    """Apply ``cfg``'s lr, weight decay and max grad norm to ``optimizer``, and make ``scheduler``
    (a ``LambdaLR``, or None) follow ``lr_factor`` from ``cfg.lr`` on, at the step it is at."""
    groups = optimizer.param_groups
    for group in groups:
        group["weight_decay"] = cfg.weight_decay
        group["initial_lr"] = cfg.lr
    if hasattr(optimizer, "max_grad_norm"):  # p2ptrain.optim.inner.ClippedAdamW
        optimizer.max_grad_norm = cfg.max_grad_norm
    if scheduler is None:
        for group in groups:
            group["lr"] = cfg.lr
        return
    scheduler.base_lrs = [cfg.lr for _ in groups]
    scheduler.lr_lambdas = [lr_factor for _ in groups]
    for group in groups:
        group["lr"] = cfg.lr * lr_factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]
