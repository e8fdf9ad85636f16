"""Test-only fault injection, switched on by ``P2PTRAIN_TEST_FAULTS`` (comma-separated names).

Never set this on a real node.  It exists so the fault-injection suite (tests/chaos/) can run a
misbehaving peer as an ordinary ``p2ptrain run`` process:

``nonfinite_grads``
    After each backward pass, fill every gradient with a huge finite value (3e38).  That passes
    the trainer's own finiteness check (which keeps an honest node's NaN away from its peers) but
    overflows to inf once hivemind accumulates it over the micro-batch and compresses it, so the
    peers receive non-finite gradients, as they would from a buggy or hostile node.

``stall_training``
    After 20 steps, one step hangs for ``STALL_SECONDS``: a stuck training loop, as the systemd
    watchdog must see it (no pings) while the API goes on answering.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping

import torch

logger = logging.getLogger(__name__)

ENV_VAR = "P2PTRAIN_TEST_FAULTS"
KNOWN_FAULTS = frozenset({"nonfinite_grads", "stall_training"})
STALL_AFTER_STEPS = 20
STALL_SECONDS = 8.0


def _huge_gradients(model: torch.nn.Module) -> None:
    for p in model.parameters():
        if p.grad is not None:
            p.grad.fill_(3e38)


def _stall_once() -> Callable[[torch.nn.Module], None]:
    steps = itertools.count(1)

    def stall(_model: torch.nn.Module) -> None:
        if next(steps) == STALL_AFTER_STEPS:
            logger.warning("%s=stall_training: this step hangs for %.0fs on purpose", ENV_VAR, STALL_SECONDS)
            time.sleep(STALL_SECONDS)

    return stall


def gradient_fault(environ: Mapping[str, str]) -> Callable[[torch.nn.Module], None] | None:
    """The gradient-corrupting hook the environment asks for, or None (the normal case)."""
    names = {name.strip() for name in environ.get(ENV_VAR, "").split(",") if name.strip()}
    unknown = names - KNOWN_FAULTS
    if unknown:
        logger.warning("%s: ignoring unknown fault(s) %s", ENV_VAR, ", ".join(sorted(unknown)))
    if "nonfinite_grads" in names:
        logger.warning("%s=nonfinite_grads: this node sends corrupt gradients on purpose (tests only)", ENV_VAR)
        return _huge_gradients
    if "stall_training" in names:
        return _stall_once()
    return None
