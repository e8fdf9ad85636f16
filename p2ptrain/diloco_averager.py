"""DiLoCo's averager: the peers' parameters averaged each round, and the outer state served to newcomers.

:class:`_DiLoCoAverager` is a plain hivemind ``DecentralizedAverager`` that serves (outer params,
outer momentum, round position); a node without the peer checks runs it as :class:`CountingDiLoCoAverager`
(its rounds say how much they averaged: :mod:`p2ptrain.roundcount`), and :class:`HardenedDiLoCoAverager`
is the same behind the peer checks (:class:`~p2ptrain.safeaverager.HardenedAveragerMixin`: robust
all-reduce, gated peers kept out, validated downloads).  All speak under the wire name
``_DiLoCoAverager`` (hivemind names every RPC after the servicer's class), so nodes with and without
the checks still find each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import hivemind
import torch

from p2ptrain.admission_averager import Admission, admitting
from p2ptrain.roundcount import CountingAveragerMixin
from p2ptrain.safeaverager import HardenedAveragerMixin

if TYPE_CHECKING:
    from p2ptrain.diloco import DiLoCoOptimizer

#: The RPC name every DiLoCo node uses, whichever class it runs.
WIRE_NAME = "_DiLoCoAverager"


class _DiLoCoAverager(hivemind.DecentralizedAverager):
    """Averages the peers' parameters each round; serves (outer params, outer momentum, round
    position) to newcomers."""

    def __init__(self, *args: Any, owner: DiLoCoOptimizer, **kwargs: Any) -> None:
        self._owner = owner
        super().__init__(*args, **kwargs)

    def get_current_state(self) -> tuple[Any, list[torch.Tensor], Any]:
        owner = self._owner
        # Runs in a thread of the training process. A newcomer must get the outer params after the
        # round in flight is applied, or it would start from params its peers have already left.
        owner.round_settled.wait(timeout=owner.cfg.averaging_timeout + owner.cfg.matchmaking_time)
        tensors = [p.clone() for p in owner.outer.params] + [b.clone() for b in owner.outer.momentum_buffers()]
        # A fast peer makes more inner steps than inner_steps in a round; newcomers check the step
        # against 0..inner_steps-1, and the LR schedule stands at the round's last position anyway.
        step = min(owner.inner_step, owner.cfg.inner_steps - 1)
        return dict(epoch=owner.local_epoch, inner_step=step), tensors, None


class CountingDiLoCoAverager(CountingAveragerMixin, _DiLoCoAverager):
    """DiLoCo's averager without the peer checks, its rounds reported, under the same wire name."""

    rpc_name = WIRE_NAME


class HardenedDiLoCoAverager(HardenedAveragerMixin, _DiLoCoAverager):
    """DiLoCo's averager behind the peer checks, under the same wire name."""

    rpc_name = WIRE_NAME


def averager_class(hardened: bool, admission: Admission | None) -> type[_DiLoCoAverager]:
    """The averager class a DiLoCo node runs: hardened or plain, behind an owned run's gate if any."""
    cls: type[_DiLoCoAverager] = HardenedDiLoCoAverager if hardened else CountingDiLoCoAverager
    return cls if admission is None else admitting(cls, admission)
