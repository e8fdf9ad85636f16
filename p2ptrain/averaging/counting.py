"""hivemind's all-reduce with one small change: its reducer counts the contributions it mixed in.

hivemind calls a round done when its all-reduce returns, however few contributions its reducer got
(it only logs "Reducer: received 33.3% of input tensors").  Without the peer checks every round of
ours runs through :class:`CountingAllReduceRunner` (with them through
:class:`p2ptrain.averaging.allreduce.RobustAllReduceRunner`), so that either way a round is "full" by
the same measure (:mod:`p2ptrain.optim.round_stats`).  Both runners also refuse to dial a peer not
admitted to an owned run (:func:`admitted_stub`, for ``AllReduceRunner._get_peer_stub``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.averaging.partition import TensorPartReducer
from hivemind.p2p import P2PDaemonError, PeerID, StubBase

from p2ptrain.averaging.pinned import require_hivemind

require_hivemind(__name__)

#: Whether a peer may not be dialled (an owned run's admission check); None: any peer may.
Refuse = Callable[[PeerID], bool]


class NotAdmitted(P2PDaemonError):
    """This node will not talk to that peer; hivemind treats it like a peer that cannot be reached."""


def admitted_stub(runner: AllReduceRunner, refuse: Refuse | None, peer: PeerID) -> StubBase:
    """hivemind's stub for ``peer``, unless ``refuse`` says it is not admitted (then :class:`NotAdmitted`,
    which hivemind handles as a groupmate that cannot be reached)."""
    if refuse is not None and refuse(peer):
        raise NotAdmitted(f"peer {peer} is not admitted to this run")
    return AllReduceRunner._get_peer_stub(runner, peer)


class CountingTensorPartReducer(TensorPartReducer):
    """hivemind's reducer (``check_current_part_finished``), counting the contributions each part mixed in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.contributions_accepted = 0
        self.clipped = 0
        super().__init__(*args, **kwargs)

    def check_current_part_finished(self) -> None:
        if self.current_part_accumulated_from == self.num_current_senders and not self.finished.is_set():
            self.contributions_accepted += self.current_part_accumulated_from
        super().check_current_part_finished()


class CountingAllReduceRunner(AllReduceRunner):
    """hivemind's all-reduce, its reducer replaced by :class:`CountingTensorPartReducer` (``__init__``),
    never dialling a peer ``refuse`` names (``_get_peer_stub``)."""

    tensor_part_reducer: TensorPartReducer  # hivemind's, declared: read here before it is replaced

    def __init__(self, *, refuse: Refuse | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._refuse = refuse
        # Nothing has reached the reducer hivemind built yet (the round starts when the runner is run).
        plain = self.tensor_part_reducer
        self.tensor_part_reducer = CountingTensorPartReducer(plain.part_shapes, plain.num_senders)
        plain.finalize()
        self.rejections: list[tuple[str, str, str]] = []

    def _get_peer_stub(self, peer: PeerID) -> StubBase:
        return admitted_stub(self, self._refuse, peer)
