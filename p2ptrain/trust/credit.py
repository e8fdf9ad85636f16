"""Credit: the samples this node contributed to the swarm's model, settled epoch by epoch.

What a volunteer means by "my machine contributed N samples" is: N samples whose work went into
the model the swarm trains.  A node's samples count once their epoch (DiLoCo: outer round) is
over and its fate is known:

- the epoch's round averaged with at least one other peer (a full or a partial round, see
  :mod:`p2ptrain.optim.round_stats`): **contributed**;
- no other peer was training, so no round was attempted and the node's own update *was* the
  swarm's (a node alone, or the first node before the others arrive): **contributed**;
- the round failed (no group, timeout, error), or was skipped although peers were online: the
  update stayed on this node, **not averaged**.

Never counted: the epoch still in progress, samples a state download threw away (the node was
out of sync and started over from the swarm's state), and steps skipped as non-finite.

The optimizer hands an epoch's samples over when its round begins (:meth:`CreditLedger.epoch_closed`,
with the weight the averager gives them); the round's outcome arrives later through
:meth:`p2ptrain.optim.swarm_stats.SwarmStats.record_round` (:meth:`CreditLedger.round_ended`).  One round
is in flight at a time in both modes, so outcomes settle epochs in the order they closed.

The ledger also keeps what this node can vouch for of *other* peers' contributions
(:attr:`CreditLedger.vouches`, :mod:`p2ptrain.trust.vouching`), so that a checkpoint carries both.

Standard library only; thread-safe (rounds end on a background thread with ``training.overlap``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from p2ptrain.trust.vouching import VouchLedger

#: Epochs waiting for their round's outcome; more than this means outcomes went missing (the
#: oldest is then settled as not averaged).
MAX_AWAITING = 4
#: Peers remembered as having contributed (for the model card's "contributing peers").
MAX_CONTRIBUTORS = 4096


@dataclass(frozen=True)
class CreditFigures:
    """One consistent reading of the ledger."""

    #: Samples of epochs that went into the swarm's model (averaged, or trained alone).
    contributed: int = 0
    #: Samples of epochs whose round failed: applied on this node only.
    not_averaged: int = 0
    #: Samples handed to a round that has not ended yet.
    awaiting: int = 0


class CreditLedger:
    """Counts contributed samples as epochs close and their rounds end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._awaiting: collections.deque[int] = collections.deque()
        self._contributed = 0
        self._not_averaged = 0
        self._contributors: dict[str, None] = {}
        #: Samples other peers carried into this node's rounds (fed by the peer checks' round reports).
        self.vouches = VouchLedger()

    def restore(self, state: dict[str, object]) -> None:
        """Carry a checkpoint's totals and contributors over (credit survives restarts)."""
        seen = state.get("contributors")
        self.vouches.restore(state.get("vouched"))
        with self._lock:
            self._contributed = _count(state.get("samples_contributed"))
            self._not_averaged = _count(state.get("samples_not_averaged"))
            if isinstance(seen, list | tuple):
                self._contributors = dict.fromkeys(p for p in seen[:MAX_CONTRIBUTORS] if isinstance(p, str))

    def checkpoint_fields(self) -> dict[str, object]:
        """What a checkpoint keeps of the ledger (and a model card shows)."""
        with self._lock:
            fields: dict[str, object] = {"samples_contributed": self._contributed,
                                         "samples_not_averaged": self._not_averaged,
                                         "contributors": list(self._contributors)}
        return {**fields, "vouched": self.vouches.checkpoint_field()}

    def note_contributors(self, peer_ids: list[str]) -> None:
        """Peers a swarm view credits with vouched-for samples: the run's contributors, as far as this
        node can vouch."""
        with self._lock:
            for peer in peer_ids:
                if len(self._contributors) >= MAX_CONTRIBUTORS:
                    return
                self._contributors.setdefault(peer, None)

    @property
    def contributors(self) -> int:
        with self._lock:
            return len(self._contributors)

    def epoch_closed(self, samples: int, *, round_started: bool, alone: bool) -> None:
        """An epoch's ``samples`` were handed over.  With ``round_started`` its round's outcome
        settles them; without, they count as contributed only when the node was ``alone``."""
        samples = _count(samples)
        with self._lock:
            if round_started:
                self._awaiting.append(samples)
                while len(self._awaiting) > MAX_AWAITING:
                    self._not_averaged += self._awaiting.popleft()
            elif alone:
                self._contributed += samples
            else:
                self._not_averaged += samples

    def round_ended(self, averaged: bool) -> None:
        """The oldest round in flight ended: ``averaged`` with at least one other peer, or not."""
        with self._lock:
            if not self._awaiting:
                return  # a round nobody handed samples to (e.g. one joined with zero weight)
            samples = self._awaiting.popleft()
            if averaged:
                self._contributed += samples
            else:
                self._not_averaged += samples

    def figures(self) -> CreditFigures:
        with self._lock:
            return CreditFigures(self._contributed, self._not_averaged, sum(self._awaiting))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
