"""Rolls the model back when averaging with the swarm made its parameters non-finite.

hivemind applies the group's averaged gradients (and, every few epochs, averaged parameters)
without asking: one buggy or hostile peer that sends inf/NaN, or values that overflow once
accumulated or compressed, poisons every member of its group.  There is no hook to reject one
peer's contribution before it is mixed in, so the node checks after the fact instead: whenever
the optimizer epoch changes (and at most once per ``check_every`` seconds otherwise, because
with overlap the optimizer step lands in the background a little later) every parameter must be
finite.  If so, a copy of the parameters and the optimizer's per-parameter state is kept as the
last good state; if not, both are restored in place (the same tensors hivemind holds, so its
averagers keep working) and the rollback is counted.  The epoch counter is never rolled back.

What is watched comes from the optimizer (:class:`~p2ptrain.optim.protocol.GuardTargets`): the
model's parameters, and in DiLoCo mode also the outer parameters and the outer momentum.
The copy costs one extra model + optimizer state in memory, refreshed once per epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from p2ptrain.optim.protocol import GuardTargets

logger = logging.getLogger(__name__)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


class NonFiniteRollback:
    """Last good copy of the watched tensors (and the optimizers' state), restored on non-finite values."""

    def __init__(self, targets: GuardTargets, *, check_every: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._params = list(targets.tensors)
        self._optimizers = list(targets.optimizers)
        self._check_every = check_every
        self._clock = clock
        self._next_check = clock() + check_every
        self._epoch: int | None = None
        self._good_params: list[torch.Tensor] = []
        self._good_state: dict[int, dict[str, Any]] = {}
        self._good_epoch = -1
        self.rollbacks = 0

    def after_step(self, epoch: int) -> bool:
        """Check (when due) and save or restore; True if a rollback happened."""
        now = self._clock()
        if epoch == self._epoch and now < self._next_check:
            return False
        self._epoch, self._next_check = epoch, now + self._check_every
        if all_finite([p.detach() for p in self._params]):
            if epoch != self._good_epoch:
                self._save(epoch)
            return False
        self._restore(epoch)
        return True

    @torch.no_grad()
    def _save(self, epoch: int) -> None:
        self._good_params = [p.detach().clone() for p in self._params]
        self._good_state = {}
        if self._optimizers:
            state = self._opt_state_tensors()
            if all_finite([t for values in state.values() for t in values.values() if torch.is_tensor(t)]):
                self._good_state = {i: {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in values.items()}
                                    for i, values in state.items()}
        self._good_epoch = epoch

    @torch.no_grad()
    def _restore(self, epoch: int) -> None:
        self.rollbacks += 1
        if not self._good_params:
            # Poisoned before any good state was seen: zero what is non-finite rather than train on NaN.
            for p in self._params:
                torch.nan_to_num_(p, nan=0.0, posinf=0.0, neginf=0.0)
            logger.warning("parameters became non-finite at epoch %d before any good state was kept: non-finite "
                         "values zeroed (rollback %d)", epoch, self.rollbacks)
            return
        for p, good in zip(self._params, self._good_params, strict=True):
            p.copy_(good)
        if self._optimizers:
            for i, values in self._opt_state_tensors().items():
                good_values = self._good_state.get(i)
                for key, value in values.items():
                    if not torch.is_tensor(value):
                        continue
                    if good_values is not None and key in good_values:
                        value.copy_(good_values[key])
                    else:  # no good copy of this statistic: restart it rather than keep NaN
                        value.zero_()
        logger.warning("parameters became non-finite after averaging at epoch %d (a peer sent non-finite or "
                     "exploding values): rolled back to the state of epoch %d (rollback %d)",
                     epoch, self._good_epoch, self.rollbacks)

    def _opt_state_tensors(self) -> dict[int, dict[str, Any]]:
        """Per-parameter state of every watched optimizer, numbered in a fixed order."""
        found: dict[int, dict[str, Any]] = {}
        index = 0
        for optimizer in self._optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    found[index] = optimizer.state.get(p, {})
                    index += 1
        return found
