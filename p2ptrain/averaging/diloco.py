"""DiLoCo's averager: the peers' parameters averaged each round, and the outer state served to newcomers.

:class:`DiLoCoAverager` is a hivemind ``DecentralizedAverager`` through the adapter's layer
(:class:`~p2ptrain.averaging.hardened.AveragerLayer`: an owned run's gate, the peer checks or
hivemind's all-reduce counted, groupmates served) that serves (outer params, outer momentum, round
position).  It speaks under the wire name ``_DiLoCoAverager`` (hivemind names every RPC after the
servicer's class) whichever checks a node runs, so nodes with and without them still find each other.
"""

from __future__ import annotations

from typing import Any, Protocol

import hivemind
import torch

from p2ptrain.averaging.hardened import AveragerLayer


class OuterStateSource(Protocol):
    """What the averager serves to newcomers: DiLoCo's optimizer, seen from below."""

    def served_state(self) -> tuple[dict[str, int], list[torch.Tensor]]:
        """Round position and the outer tensors, called in a thread of the training process."""
        ...

#: The RPC name every DiLoCo node uses, whichever checks it runs.
WIRE_NAME = "_DiLoCoAverager"


class DiLoCoAverager(AveragerLayer, hivemind.DecentralizedAverager):
    """Averages the peers' parameters each round; serves (outer params, outer momentum, round
    position) to newcomers (``owner``).  Takes the layer's keyword arguments."""

    rpc_name = WIRE_NAME

    def __init__(self, *args: Any, owner: OuterStateSource, **kwargs: Any) -> None:
        self._owner = owner
        super().__init__(*args, **kwargs)

    def get_current_state(self) -> tuple[Any, list[torch.Tensor], Any]:
        metadata, tensors = self._owner.served_state()
        return metadata, tensors, None
