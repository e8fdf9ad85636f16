"""Credit a stranger cannot mint: the samples of other peers that an honest node can vouch for.

A peer record's ``samples_contributed`` is what that peer says about itself, and identities are free:
a freeloader and a helper identity can each claim any figure, and an epoch far ahead to lift any
bound tied to it.  So a peer's credit counts only samples some node can vouch for:

- **this node's rounds**: the weight each peer's parts carried into an all-reduce this node reduced
  and accepted (gradient rounds: the samples it accumulated for the epoch; DiLoCo: those of the round),
  as the reduce rule capped it (:class:`VouchLedger`, fed by the round reports);
- **figures signed by the peers this node joined through**: every record carries the largest few
  figures its node's rounds vouch for (``vouched``).  The records of the peers this node joined
  through (the operator's word that they are in the run) are believed: what they vouch for of
  others, and their own figure (:func:`vouched_credit`).  A node that trained alone before the others
  came is thus credited by those who joined through it, and a fetcher, which averages with nobody,
  credits what the node it joined through vouches for.

Any other record's claim about itself never counts, nor does what such peers say of each other.
Whatever is vouched for is still clipped at the run's pace
(:func:`p2ptrain.trust.swarm_credit.credited_view`).  Standard library only; the ledger is thread-safe
(rounds end on a background thread with ``training.overlap``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from p2ptrain.status import PeerRecord

#: Peers a ledger remembers; past that the least vouched for are forgotten first.
MAX_VOUCHED_PEERS = 4096
#: Largest figures a record carries (each a peer ID and a count: about 60 bytes).
MAX_RECORD_VOUCHES = 8


@dataclass(frozen=True)
class Vouchers:
    """Where a node takes the figures it can vouch for from (None instead of this: the peer checks are
    off and the records' claims are taken as they are, bounded)."""

    #: This node's own rounds: samples each peer it averaged with carried into them.
    direct: Mapping[str, int] = field(default_factory=dict)
    #: Peers whose signed ``vouched`` figures count: those this node joined through.
    anchors: frozenset[str] = frozenset()


class VouchLedger:
    """The samples other peers carried into this node's rounds, by peer; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[str, float] = {}

    def add_round(self, shares: Mapping[str, float]) -> None:
        """One round's accepted weights (peer ID -> weight), this node's own left out by the caller."""
        with self._lock:
            for peer, weight in shares.items():
                if isinstance(weight, int | float) and math.isfinite(weight) and weight > 0 and isinstance(peer, str):
                    self._samples[peer] = self._samples.get(peer, 0.0) + float(weight)
            self._forget_smallest()

    def vouched(self) -> dict[str, int]:
        with self._lock:
            return {peer: int(samples) for peer, samples in self._samples.items() if samples >= 1}

    def largest(self, count: int = MAX_RECORD_VOUCHES) -> dict[str, int]:
        """The ``count`` peers vouched for most (what this node's record carries)."""
        ranked = sorted(self.vouched().items(), key=lambda item: (-item[1], item[0]))
        return dict(ranked[:count])

    def restore(self, saved: object) -> None:
        """A checkpoint's figures (anything malformed in it is skipped)."""
        if not isinstance(saved, dict):
            return
        with self._lock:
            self._samples = {peer: float(count) for peer, count in saved.items()
                             if isinstance(peer, str) and isinstance(count, int) and not isinstance(count, bool)
                             and count > 0}
            self._forget_smallest()

    def checkpoint_field(self) -> dict[str, int]:
        return self.vouched()

    def _forget_smallest(self) -> None:
        if len(self._samples) > MAX_VOUCHED_PEERS:
            kept = sorted(self._samples.items(), key=lambda item: -item[1])[:MAX_VOUCHED_PEERS]
            self._samples = dict(kept)


def vouched_credit(peers: Iterable[PeerRecord], vouchers: Vouchers, own_peer: str = "") -> dict[str, int]:
    """Each listed peer's credit as far as anyone this node believes vouches for it (0: nobody does).

    ``own_peer``'s and an anchor's (a peer this node joined through) is its record's own figure; any
    peer's is at least what this node's rounds (``vouchers.direct``) or an anchor's signed figures say.
    Any other peer's claims, about itself or about others, count for nothing.
    """
    records = {p.peer_id: p for p in peers}
    anchors = [peer for peer in vouchers.anchors if peer in records]
    signed = {anchor: dict(records[anchor].vouched) for anchor in anchors}
    credit: dict[str, int] = {}
    for peer, record in records.items():
        figures = [vouchers.direct.get(peer, 0)]
        figures += [signed[anchor].get(peer, 0) for anchor in anchors if anchor != peer]
        if peer == own_peer or peer in signed:  # our own ledger's figure; a peer we joined through: its word
            figures.append(record.samples_contributed)
        credit[peer] = max(0, *figures)
    return credit


def anchors_of(peers: Collection[str], is_gated: Callable[[str], bool] | None = None) -> frozenset[str]:
    """``peers`` (those this node joined through) less any excluded now."""
    return frozenset(peer for peer in peers if is_gated is None or not is_gated(peer))
