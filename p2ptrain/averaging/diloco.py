"""DiLoCo's averager: the peers' parameters averaged each round, and the outer state served to newcomers.

:class:`_DiLoCoAverager` is a plain hivemind ``DecentralizedAverager`` that serves (outer params,
outer momentum, round position); a node without the peer checks runs it as :class:`CountingDiLoCoAverager`
(its rounds say how much they averaged: :mod:`p2ptrain.averaging.counting`), and :class:`HardenedDiLoCoAverager`
is the same behind the peer checks (:class:`~p2ptrain.averaging.hardened.HardenedAveragerMixin`: robust
all-reduce, gated peers kept out, validated downloads).  All speak under the wire name
``_DiLoCoAverager`` (hivemind names every RPC after the servicer's class), so nodes with and without
the checks still find each other.
"""

from __future__ import annotations

from typing import Any, Protocol

import hivemind
import torch

from p2ptrain.averaging.admitting import Admission, admitting
from p2ptrain.averaging.counting import CountingAveragerMixin
from p2ptrain.averaging.hardened import HardenedAveragerMixin


class OuterStateSource(Protocol):
    """What the averager serves to newcomers: DiLoCo's optimizer, seen from below."""

    def served_state(self) -> tuple[dict[str, int], list[torch.Tensor]]:
        """Round position and the outer tensors, called in a thread of the training process."""
        ...

#: The RPC name every DiLoCo node uses, whichever class it runs.
WIRE_NAME = "_DiLoCoAverager"


class _DiLoCoAverager(hivemind.DecentralizedAverager):
    """Averages the peers' parameters each round; serves (outer params, outer momentum, round
    position) to newcomers."""

    def __init__(self, *args: Any, owner: OuterStateSource, **kwargs: Any) -> None:
        self._owner = owner
        super().__init__(*args, **kwargs)

    def get_current_state(self) -> tuple[Any, list[torch.Tensor], Any]:
        metadata, tensors = self._owner.served_state()
        return metadata, tensors, None


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
