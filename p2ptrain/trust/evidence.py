"""What this node knows about other peers from sources one stranger cannot forge alone.

Two sources count: identity-bound peer records (a record's signing key is bound to the libp2p peer
ID it claims, :mod:`p2ptrain.swarm.recordcheck`) and peers actually met in averaging (their parts reached
us over a connection libp2p authenticated, and passed the checks).  hivemind's own progress entries
are not among them: their peer ID is self-declared, so anyone can write one in any peer's name.
A bound record proves only that someone holds the identity: one process can make thousands.  So
reports are taken from the records of peers that exist on the network as well: met in averaging,
the peers this node joined through, or peers its DHT has exchanged messages with.

:class:`PeerEvidence` collects both (the record thread writes records, the optimizer writes the
peers it met) and answers the questions the defences ask: which progress entries are bound to
whom, what epochs and validation losses the run's peers report, and which peers this node has
averaged with lately.  :func:`trusted_view` keeps the swarm view shown to users free of absurd
claims.  No hivemind here: the daemon's record thread writes to it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from p2ptrain.status import NodeState, PeerRecord, SwarmView
from p2ptrain.trust.swarm_view import summarize
from p2ptrain.trust.verdicts import epoch_ceiling

#: A peer met in a completed round counts as "met" for this long.
MET_SECONDS = 600.0
#: States whose record's epoch says where the run is (a starting or syncing node has not caught up).
_EPOCH_STATES = frozenset({NodeState.TRAINING.value, NodeState.PAUSED.value})
#: A record's throughput above this many times the best trusted rate (ours, or a met peer's) is a lie.
RATE_FACTOR = 100.0
#: Claims within these of ours are never left out of the view (see :func:`trusted_view`).
EPOCH_MARGIN = 10_000
RATE_FLOOR = 1e5


class PeerEvidence:
    """Bound records and peers met in averaging; thread-safe, node process only."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, met_seconds: float = MET_SECONDS,
                 is_gated: Callable[[str], bool] | None = None) -> None:
        self._lock = threading.Lock()
        self._clock, self._met_seconds = clock, met_seconds
        self._is_gated = is_gated
        self._met: dict[str, float] = {}
        self._records: dict[str, PeerRecord] = {}
        self._keys: dict[bytes, str] = {}
        self._dht_peers: frozenset[str] = frozenset()
        self._progress: Callable[[], Mapping[str, int]] | None = None
        #: Peers the user told this node to join through (their peer IDs): trusted to be in the run.
        self.initial_peers: frozenset[str] = frozenset()
        #: Changes whenever new records arrive (the tracker recounts with their keys).
        self.version = 0
        #: Set once the first swarm view of bound records has been read.
        self.records_seen = threading.Event()

    def follow_progress(self, epochs: Callable[[], Mapping[str, int]]) -> None:
        """Where the optimizer's tracker keeps the epochs of identity-bound progress entries (by peer):
        fresher than records, which go out every few seconds, and bound to the same keys."""
        self._progress = epochs

    # ------------------------------------------------------------------ writers

    def met_in_round(self, peers: Iterable[str]) -> None:
        """Peers whose parts this node accepted in a completed averaging round."""
        now = self._clock()
        with self._lock:
            for peer in peers:
                self._met[str(peer)] = now
            if len(self._met) > 4096:  # a long run meets many peers; forget the oldest
                for peer, _ in sorted(self._met.items(), key=lambda item: item[1])[:1024]:
                    del self._met[peer]

    def update_records(self, records: Iterable[PeerRecord], keys: Mapping[bytes, str],
                       dht_peers: Iterable[str] = ()) -> None:
        """The records of the latest swarm view, each bound record key's peer ID, and the peers in
        this node's DHT routing table (libp2p authenticated them)."""
        with self._lock:
            self._records = {record.peer_id: record for record in records}
            self._keys = dict(keys)
            self._dht_peers = frozenset(dht_peers)
            self.version += 1
        self.records_seen.set()

    # ------------------------------------------------------------------ questions

    def _gated(self, peer: str) -> bool:
        return self._is_gated is not None and self._is_gated(peer)

    def met_peers(self) -> set[str]:
        """Peers met in averaging in the last ``met_seconds``, not gated now."""
        horizon = self._clock() - self._met_seconds
        with self._lock:
            met = {peer for peer, when in self._met.items() if when >= horizon}
        return {peer for peer in met if not self._gated(peer)}

    def trusted_peers(self) -> set[str]:
        """Peers whose records a swarm view keeps first: those we joined through and averaged with."""
        return set(self.initial_peers) | self.met_peers()

    def bound_keys(self) -> dict[bytes, str]:
        """Record key (hivemind's RSA key, the subkey of a peer's DHT entries) -> the peer ID it is bound to."""
        with self._lock:
            return dict(self._keys)

    def _reporting(self) -> list[PeerRecord]:
        """Bound records that say where the run is, from the most trusted peers that have any: those
        met in averaging (one process with many identities cannot fake having averaged with us), else
        the ones we joined through, else at least two that exist on the network (in our DHT's routing
        table: a single stranger's report alone decides nothing)."""
        with self._lock:
            records = [r for r in self._records.values() if r.state in _EPOCH_STATES]
            seen = self._dht_peers
        records = [r for r in records if not self._gated(r.peer_id)]
        met = self.met_peers()
        for tier in (met, self.initial_peers):
            found = [r for r in records if r.peer_id in tier]
            if found:
                return found
        found = [r for r in records if r.peer_id in seen]
        return found if len(found) >= 2 else []

    def peer_epochs(self) -> dict[str, int]:
        """Epoch of each reporting peer: its record's, or its bound progress entry's if that is newer."""
        try:
            fresher = dict(self._progress()) if self._progress is not None else {}
        except Exception:  # the tracker mid-refresh: the records alone
            fresher = {}
        return {r.peer_id: max(r.epoch, fresher.get(r.peer_id, r.epoch)) for r in self._reporting()}

    def peer_val_losses(self) -> dict[str, float]:
        return {r.peer_id: r.val_loss for r in self._reporting()
                if r.val_loss is not None and math.isfinite(r.val_loss)}


def trusted_view(view: SwarmView, *, own_peer: str, own_epoch: int, own_rate: float, met: set[str],
                 is_gated: Callable[[str], bool] = lambda peer: False) -> tuple[SwarmView, int]:
    """The swarm view less claims no honest peer makes, and totals over the peers not excluded.

    A record is left out when its epoch is beyond :func:`epoch_ceiling` of what this node trusts
    (its own epoch and its averaging partners') or its rate is over :data:`RATE_FACTOR` times the
    best trusted rate; a fresh node (epoch 0, nobody met) judges no epochs, and nothing is judged
    against a rate of 0.  Excluded (gated) peers stay listed but count in no total.  Returns the
    view and how many records were left out.
    """
    by_peer = {p.peer_id: p for p in view.peers}
    trusted = [by_peer[p] for p in met if p in by_peer]
    reference = max([own_epoch, *(p.epoch for p in trusted)])
    rates = [own_rate, *(p.samples_per_second for p in trusted)]
    top_rate = max(rate for rate in rates if math.isfinite(rate))
    kept, dropped = [], 0
    for peer in view.peers:
        if peer.peer_id == own_peer:
            kept.append(peer)
            continue
        # Beyond the relative bounds *and* an absolute margin: a node that has only just started (its
        # own rate still near 0, its epoch behind a partner that raced ahead) must not drop honest
        # partners, whom the data is shared out among; absurd claims are far beyond both.
        absurd_epoch = reference > 0 and peer.epoch > max(epoch_ceiling(reference), reference + EPOCH_MARGIN)
        absurd_rate = top_rate > 0 and peer.samples_per_second > max(RATE_FACTOR * top_rate, RATE_FLOOR)
        if absurd_epoch or absurd_rate:
            dropped += 1
        else:
            kept.append(peer)
    counted = tuple(p for p in kept if not is_gated(p.peer_id))
    totals = summarize(counted, view.rejected_records_total + dropped)
    return dataclasses.replace(totals, peers=tuple(kept)), dropped
