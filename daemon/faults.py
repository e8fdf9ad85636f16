"""Test-only fault injection, switched on by ``P2PTRAIN_TEST_FAULTS`` (comma-separated names).

Never set this on a real node.  It exists so the fault-injection suite (tests/chaos/) can run a
misbehaving peer as an ordinary ``p2ptrain run`` process.  Faults are injected by wrapping the
task's loss function, so the trainer and the optimizers carry no test seam at all:

``nonfinite_grads``
    The loss keeps its value, but backpropagating it adds ``HUGE_GRADIENT`` (3e38) to every
    gradient element: finite, so it passes the trainer's own check (which keeps an honest node's
    NaN away from its peers), but it overflows to inf as soon as hivemind accumulates two of them,
    so the peers receive non-finite gradients, as they would from a buggy or hostile node.

``stall_training``
    The 20th step hangs for ``STALL_SECONDS``: a stuck training loop, as the systemd watchdog must
    see it (no pings) while the API goes on answering.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from p2ptrain.tasks.base import Batch, LossFn, Task

logger = logging.getLogger(__name__)

ENV_VAR = "P2PTRAIN_TEST_FAULTS"
KNOWN_FAULTS = frozenset({"nonfinite_grads", "stall_training"})
HUGE_GRADIENT = 3e38
STALL_AFTER_STEPS = 20
STALL_SECONDS = 8.0


def fault_names(environ: Mapping[str, str]) -> set[str]:
    names = {name.strip() for name in environ.get(ENV_VAR, "").split(",") if name.strip()}
    unknown = names - KNOWN_FAULTS
    if unknown:
        logger.warning("%s: ignoring unknown fault(s) %s", ENV_VAR, ", ".join(sorted(unknown)))
    return names & KNOWN_FAULTS


class _FloodGradients(torch.autograd.Function):
    """Identity on the loss; in backward, ``HUGE_GRADIENT`` for every element of every parameter."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.meta = [(p.shape, p.dtype) for p in params]
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (grad, *(torch.full(shape, HUGE_GRADIENT, dtype=dtype) for shape, dtype in ctx.meta))


def _huge_gradients(loss_fn: LossFn) -> LossFn:
    def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        params = [p for p in model.parameters() if p.requires_grad]
        return _FloodGradients.apply(loss_fn(model, batch), *params)  # type: ignore[no-untyped-call]

    return loss


def _stall_once(loss_fn: LossFn) -> LossFn:
    calls = itertools.count(1)

    def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        if model.training and next(calls) == STALL_AFTER_STEPS:
            logger.warning("%s=stall_training: this step hangs for %.0fs on purpose", ENV_VAR, STALL_SECONDS)
            time.sleep(STALL_SECONDS)
        return loss_fn(model, batch)

    return loss


def with_faults(task: Task, environ: Mapping[str, str]) -> Task:
    """``task`` with the faults the environment asks for wrapped around its loss (the task itself
    when none is asked for: the normal case)."""
    names = fault_names(environ)
    loss_fn = task.loss_fn
    if "nonfinite_grads" in names:
        logger.warning("%s=nonfinite_grads: this node sends corrupt gradients on purpose (tests only)", ENV_VAR)
        loss_fn = _huge_gradients(loss_fn)
    if "stall_training" in names:
        loss_fn = _stall_once(loss_fn)
    return task if loss_fn is task.loss_fn else dataclasses.replace(task, loss_fn=loss_fn)
