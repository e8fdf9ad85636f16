"""Adopting a peer's training state safely: validated downloads and an O(1) learning-rate catch-up.

hivemind 1.1.12's ``TrainingStateAverager`` copies whatever a donor sends into the model and then
catches the LR schedule up with one ``scheduler.step()`` per epoch (``_update_scheduler``): a donor
claiming epoch 2**40 would hold a node in that loop for good.  :class:`SafeTrainingStateAverager`
overrides ``load_state_from_peers`` (validated, donor-aware, never raises, never adopts the donor's
hyperparameters) and ``_update_scheduler`` (:func:`catch_up_scheduler`: the schedule's position is
set, not walked).  :func:`training_state_validator` and :func:`diloco_state_validator` build the
checks for gradient mode and for DiLoCo's outer state.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import torch
from hivemind.optim.state_averager import TrainingStateAverager, dump_optimizer_state, load_optimizer_state

from p2ptrain.averaging.hardened import AveragerLayer
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.state_check import StateValidator, TensorTemplate
from p2ptrain.trust.verdicts import (
    MAX_EPOCH,
    Verdict,
    check_diloco_metadata,
    check_training_metadata,
    merge_optimizer_metadata,
)

require_hivemind(__name__)

logger = logging.getLogger(__name__)

#: A scheduler without a closed form is stepped at most this many times per catch-up.
MAX_CATCH_UP_STEPS = 10_000

ModelCheck = Callable[[Any, Sequence[torch.Tensor], str], Verdict]


def _set_lrs(scheduler: Any, lrs: Sequence[float | torch.Tensor]) -> None:
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def catch_up_scheduler(scheduler: Any, epoch: int, *, max_steps: int = MAX_CATCH_UP_STEPS) -> None:
    """Put ``scheduler`` where hivemind's loop would leave it after ``epoch`` epochs, in O(1) when it can.

    ``LambdaLR`` (our schedule) and torch's schedulers with a closed form are set directly; any other
    scheduler is stepped, at most ``max_steps`` times per call (a later call goes on from there).
    Never moves a schedule backwards.
    """
    if scheduler is None:
        return
    epoch = max(0, min(int(epoch), MAX_EPOCH))
    if scheduler._step_count > epoch:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        scheduler.last_epoch, scheduler._step_count = epoch, epoch + 1
        _set_lrs(scheduler, [base * fn(epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas,
                                                                  strict=True)])
        return
    if hasattr(scheduler, "_get_closed_form_lr"):
        scheduler.last_epoch, scheduler._step_count = epoch, epoch + 1
        _set_lrs(scheduler, scheduler._get_closed_form_lr())
        return
    behind = epoch + 1 - scheduler._step_count
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(min(behind, max_steps)):
            scheduler.step()
    if behind > max_steps:
        logger.warning("learning-rate schedule %s is %d epochs behind; caught up %d of them this time",
                       type(scheduler).__name__, behind, max_steps)


def training_state_validator(optimizer: torch.optim.Optimizer, extra_tensors: Sequence[torch.Tensor], *,
                             own_epoch: Callable[[], int],
                             peer_epochs: Callable[[], Mapping[str, int]] | None = None,
                             model_check: ModelCheck | None = None, epoch_slack: int = 10) -> StateValidator:
    """Checks for a hivemind ``TrainingStateAverager`` state: parameters, extras, optimizer statistics."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    local_metadata, optimizer_tensors = dump_optimizer_state(optimizer)
    return StateValidator(
        template=TensorTemplate.of([*params, *extra_tensors, *optimizer_tensors]),
        check_metadata=lambda metadata: check_training_metadata(metadata, local_metadata),
        own_epoch=own_epoch, peer_epochs=peer_epochs, epoch_slack=epoch_slack, model_check=model_check)


def diloco_state_validator(outer_params: Sequence[torch.Tensor], inner_steps: int, *, own_epoch: Callable[[], int],
                           peer_epochs: Callable[[], Mapping[str, int]] | None = None,
                           model_check: ModelCheck | None = None, epoch_slack: int = 10) -> StateValidator:
    """Checks for DiLoCo's state: outer parameters, then one momentum buffer per parameter (fp32)."""
    shapes = [torch.empty(p.shape, dtype=torch.float32) for p in outer_params]
    return StateValidator(
        template=TensorTemplate.of([*shapes, *shapes]),
        check_metadata=lambda metadata: check_diloco_metadata(metadata, inner_steps),
        own_epoch=own_epoch, peer_epochs=peer_epochs, epoch_slack=epoch_slack, model_check=model_check)


class SafeTrainingStateAverager(AveragerLayer, TrainingStateAverager):
    """hivemind's ``TrainingStateAverager``, hardened: see the module docstring.

    Takes the layer's keyword arguments (``admission``, ``gate``, ``reduce_rule``, ``round_reports``, ...),
    plus ``peer_epochs`` and ``model_check`` for the state validator it builds for itself.
    """

    rpc_name = "TrainingStateAverager"

    def __init__(self, *, peer_epochs: Callable[[], Mapping[str, int]] | None = None,
                 model_check: ModelCheck | None = None, epoch_slack: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state_validator = training_state_validator(
            self.optimizer, self.extra_tensors, own_epoch=lambda: self.local_epoch, peer_epochs=peer_epochs,
            model_check=model_check, epoch_slack=epoch_slack)

    def _update_scheduler(self) -> None:
        catch_up_scheduler(self.scheduler, self.local_epoch)

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None, **kwargs: Any) -> Any:
        """Download, validate and apply the best donor's state; True if one was adopted.  Never raises.
        Without the peer checks (an owned run's gate only), hivemind's download."""
        if not self._peer_checks:
            return TrainingStateAverager.load_state_from_peers(self, wait=wait, timeout=timeout, **kwargs)
        download = self.download_state(timeout)
        if download is None:  # the optimizer says once per download what that means (all rejected, none found)
            return False
        try:
            self._apply(download.metadata, download.tensors)
        except Exception as exc:  # validated input should always apply; if not, keep training locally
            logger.warning("could not apply the state of %s (%r); keeping ours", download.donor, exc)
            return False
        logger.info("adopted the state of %s: now at epoch %d", download.donor, self.local_epoch)
        return True

    @torch.no_grad()
    def _apply(self, metadata: dict[str, Any], tensors: Sequence[torch.Tensor]) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        targets = list(chain(params, self.extra_tensors))
        local_metadata, _ = dump_optimizer_state(self.optimizer)
        merged = merge_optimizer_metadata(local_metadata, metadata["optimizer_metadata"])
        with self.lock_averaged_tensors:
            load_optimizer_state(self.optimizer, merged, tensors[len(targets):])
            for target, value in zip(targets, tensors[:len(targets)], strict=True):
                target.copy_(value, non_blocking=True)
        if self.offload_optimizer:
            self._apply_optimizer_parameters_()
        if not self.reuse_tensors:
            self._load_local_tensors_into_averager_()
        self.local_epoch = metadata["epoch"]
        self._update_scheduler()
