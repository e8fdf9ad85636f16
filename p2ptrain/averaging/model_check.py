"""Looks at a downloaded model itself before switching to it: its loss on our validation batches.

Structural checks cannot tell a trained model from constant garbage of the right shape.  The
validation batches are the same on every node, so the donor's parameters, evaluated here, should
score about what the run's peers report in their signed records (or, when the reports disagree or
there are none, no worse than our own model).  The parameters are swapped in for one validation
pass and always swapped back.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from p2ptrain.trust.verdicts import LOSS_TOLERANCE, Verdict, check_candidate_loss

logger = logging.getLogger(__name__)


@torch.no_grad()
def loss_with_parameters(params: Sequence[torch.Tensor], candidate: Sequence[torch.Tensor],
                         evaluate: Callable[[], float], lock: ContextManager[Any] | None = None) -> float:
    """``evaluate()`` with ``candidate`` copied into ``params``; ``params`` are restored afterwards.

    ``lock`` (the averager's ``lock_averaged_tensors``) is held for the whole swap, so nothing that
    updates the live parameters in the background (a delayed optimizer step, an averaging round)
    writes into them while they hold the candidate, or is undone by the restore.
    """
    with lock if lock is not None else contextlib.nullcontext():
        saved = [p.detach().clone() for p in params]
        try:
            for param, value in zip(params, candidate, strict=True):
                param.copy_(value)
            return float(evaluate())
        finally:
            for param, value in zip(params, saved, strict=True):
                param.copy_(value)


def make_loss_check(params: Sequence[torch.Tensor], evaluate: Callable[[], float], *,
                    own_loss: Callable[[], float | None],
                    peer_losses: Callable[[], dict[str, float]] | None = None,
                    tolerance: float = LOSS_TOLERANCE, lock: Callable[[], ContextManager[Any]] | None = None,
                    ) -> Callable[[Any, Sequence[torch.Tensor], str], Verdict]:
    """A ``model_check`` for :class:`p2ptrain.averaging.state_check.StateValidator`.

    ``params`` are the tensors the state's first ``len(params)`` tensors are copied into (the model's
    parameters, in the optimizer's order); ``evaluate`` is the node's validation pass (a few fixed
    batches); ``own_loss`` the node's latest validation loss (None: measured here first);
    ``peer_losses`` the validation losses in the run's signed records, by peer ID; ``lock`` makes the
    context manager held while the candidate is swapped in (see :func:`loss_with_parameters`).
    """

    hold = lock if lock is not None else contextlib.nullcontext

    def check(metadata: Any, tensors: Sequence[torch.Tensor], donor: str) -> Verdict:
        own = own_loss()
        if own is None or not math.isfinite(own):
            with hold():
                own = float(evaluate())
        candidate = loss_with_parameters(params, tensors[:len(params)], evaluate, hold())
        reports = peer_losses() if peer_losses is not None else {}
        verdict = check_candidate_loss(candidate, own=own, tolerance=tolerance,
                                       honest=[loss for peer, loss in reports.items() if peer != donor])
        logger.info("donor %s's model scores validation loss %.4f here (ours %.4f): %s", donor, candidate, own,
                    "plausible" if verdict.ok else "rejected")
        return verdict

    return check
