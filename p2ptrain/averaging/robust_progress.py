"""The swarm's epoch as several peers agree on it, not as the loudest peer claims it.

hivemind 1.1.12's ``ProgressTracker`` takes the *maximum* epoch any peer reports as the global epoch
and sums everyone's samples: one peer claiming epoch 2**40 makes every node think it is behind (it
downloads state, and its optimizer jumps its own epoch there), and one peer claiming huge sample counts
or rates makes every node step early.  :class:`RobustProgressTracker` overrides
``_parse_swarm_progress_data`` (and ``global_epoch``, so a new ban takes effect at once): entries of
gated peers are dropped, each peer's samples and rate are bounded, and the global epoch is
:func:`robust_global_epoch`.

An entry's peer ID is self-declared (its DHT subkey is an RSA key anyone can make), so one process
could write many entries, or one in an honest peer's name.  Given the bound record keys
(``bound``: record key -> peer ID, from :class:`p2ptrain.trust.evidence.PeerEvidence`), only entries written
with the key a peer's identity-bound record names get a say in the epoch, and they win over other
entries claiming the same peer.  Without any (no records read yet, or none published) every entry
votes; when several claim one peer ID and none is bound, the most modest wins.  Every entry counts
as a peer and towards the samples, each bounded.  Entries are filtered and merged per peer before
their number is capped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hivemind.optim.progress_tracker import GlobalTrainingProgress, LocalTrainingProgress, ProgressTracker
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from p2ptrain.averaging.paced_progress import PacedReports
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.trust.peergate import PeerGate
from p2ptrain.trust.verdicts import MAX_EPOCH

require_hivemind(__name__)

logger = logging.getLogger(__name__)

#: Progress entries read per refresh; more than this is a flood, not a swarm.
MAX_PROGRESS_ENTRIES = 512


def robust_global_epoch(own: int, others: Sequence[int], *, quorum: int = 2, unsupported: bool = True) -> int:
    """The swarm's epoch as far as we can believe it; never below ``own``.

    The highest epoch that at least ``quorum`` peers (us included) agree on within 1 wins.  Without
    such agreement, the lower median of the others' epochs is believed (``unsupported=False``: not
    at all): a lone peer ahead of us is followed (a newcomer must catch up with a run of one), but
    one peer far ahead of the others is not, and when peers disagree the modest claim wins.  Claims
    outside ``0..MAX_EPOCH`` are ignored.
    """
    epochs = [e for e in others if isinstance(e, int) and 0 <= e <= MAX_EPOCH]
    pool = [*epochs, own]
    supported = [c for c in set(epochs) if sum(abs(e - c) <= 1 for e in pool) >= quorum]
    if supported:
        return max(own, max(supported))
    if not epochs or not unsupported:
        return own
    return max(own, sorted(epochs)[(len(epochs) - 1) // 2])


class RobustProgressTracker(PacedReports, ProgressTracker):
    """hivemind's ``ProgressTracker`` with bounded, gated, identity-bound, agreement-based swarm progress
    (reported about once a second: :class:`p2ptrain.averaging.paced_progress.PacedReports`).

    ``max_samples_per_second`` bounds each peer's claimed rate; a peer's samples count at most
    ``target_batch_size`` (all a single peer can usefully contribute to one epoch).
    """

    def __init__(self, *args: Any, gate: PeerGate | None = None, max_samples_per_second: float = 1e5,
                 quorum: int = 2, bound: Callable[[], Mapping[bytes, str]] | None = None, **kwargs: Any) -> None:
        self._gate, self._max_rate, self._quorum, self._bound = gate, max_samples_per_second, quorum, bound
        #: The object ``bound`` belongs to (a PeerEvidence): its ``version`` says when to recount.
        self._bound_source = getattr(bound, "__self__", None)
        self._parsed_bound_version = -1
        self._raw_metadata: Any = None
        self._distrust_until = -math.inf
        self._gate_version = gate.version if gate is not None else 0
        #: Epoch of each non-client peer in the last refresh, by peer ID (for state validation).
        self.peer_epochs: dict[str, int] = {}
        #: The same, only while entries were bound to record keys (empty otherwise: self-declared IDs).
        self.bound_peer_epochs: dict[str, int] = {}
        self._bound_mode = False
        super().__init__(*args, **kwargs)

    def distrust_unsupported(self, seconds: float) -> None:
        """Believe only epochs that several peers agree on for ``seconds``: call it when a download
        meant to reach the swarm's epoch found no usable state.  Otherwise hivemind's optimizer moves
        our epoch straight to a lone peer's unverified claim at the next epoch boundary."""
        self._distrust_until = time.monotonic() + seconds
        self.global_progress = self._parse_swarm_progress_data(self._raw_metadata)

    @property
    def global_epoch(self) -> int:
        banned = self._gate is not None and self._gate.version != self._gate_version
        if banned or self._bound_version() != self._parsed_bound_version:
            # A new ban, or new records to bind entries with: recount without waiting for the next fetch.
            self._gate_version = self._gate.version if self._gate is not None else 0
            self.global_progress = self._parse_swarm_progress_data(self._raw_metadata)
        return self.global_progress.epoch

    def _bound_version(self) -> int:
        return int(getattr(self._bound_source, "version", 0))

    def _bound_keys(self) -> Mapping[bytes, str]:
        try:
            return self._bound() if self._bound is not None else {}
        except Exception:  # evidence is a help, never a reason to stop counting progress
            return {}

    def _entries(self, metadata: Any) -> list[tuple[bool, LocalTrainingProgress]]:
        """(bound, entry): one entry per peer (ours included when published with our key), gated peers
        left out, bound ones first; at most ``MAX_PROGRESS_ENTRIES``."""
        own_id = self.dht.peer_id.to_bytes()
        self._parsed_bound_version = self._bound_version()
        bound = self._bound_keys()
        self._bound_mode = bool(bound)
        claims: dict[bytes, list[tuple[bool, LocalTrainingProgress]]] = {}
        for subkey, item in metadata.items():
            value = getattr(item, "value", None)
            if not isinstance(value, dict):
                continue
            try:
                entry = LocalTrainingProgress.parse_obj(value)
                name = str(PeerID(entry.peer_id))
            except Exception:  # the DHT's schema check already ran; anything odd left is skipped
                continue
            if entry.peer_id == own_id:
                if subkey == self._local_public_key and math.isfinite(entry.time) and entry.epoch <= MAX_EPOCH:
                    claims[own_id] = [(True, entry)]
                continue  # an entry in our name with another key is a forgery
            if self._gate is not None and self._gate.is_gated(name):
                continue
            is_bound = bound.get(subkey) == name if isinstance(subkey, bytes) else False
            if not math.isfinite(entry.time) or entry.epoch > MAX_EPOCH:
                if is_bound and self._gate is not None and entry.epoch > MAX_EPOCH:
                    # Signed with the key the peer's own record names: its lie, whoever else it fools.
                    # (An unbound entry's peer ID is self-declared: naming it could frame an honest peer.)
                    self._gate.offend(name, "implausible_epoch",
                                      f"its progress claims epoch {entry.epoch}, outside 0..{MAX_EPOCH}")
                continue
            claims.setdefault(entry.peer_id, []).append((is_bound, entry))
        chosen: list[tuple[bool, LocalTrainingProgress]] = []
        for peer, found in claims.items():
            if peer == own_id:
                chosen.append(found[0])
            elif any(is_bound for is_bound, _ in found):
                chosen.append(max(((b, e) for b, e in found if b), key=lambda item: item[1].time))
            else:  # several keys claim one peer and none is bound to it: the modest claim wins
                chosen.append(min(found, key=lambda item: (item[1].epoch, item[1].samples_accumulated)))
        chosen.sort(key=lambda item: (item[1].peer_id != own_id, not item[0], -item[1].time))
        return chosen[:MAX_PROGRESS_ENTRIES]

    def _set_round_target(self, rates: Sequence[float]) -> None:
        """Called with the (bounded) rates of the peers counted, before the progress is summed (see
        DiLoCo's round clock)."""

    def _parse_swarm_progress_data(self, metadata: Any) -> GlobalTrainingProgress:
        self._raw_metadata = metadata
        now = get_dht_time()
        marked = self._entries(metadata) if isinstance(metadata, dict) else []
        entries = [entry for _, entry in marked]
        own_id = self.dht.peer_id.to_bytes()
        others = [e for e in entries if e.peer_id != own_id]
        self._set_round_target([min(e.samples_per_second, self._max_rate) for e in entries])
        # The epoch is what several peers agree on, and only identity-bound entries get a say once
        # any are known (anyone can write an entry in any name, with as many keys as it likes); all
        # entries still count as peers to average with and towards the samples, each bounded.
        voters = [e for bound, e in marked if bound and e.peer_id != own_id and not e.client_mode]
        if not voters:
            voters = [e for e in others if not e.client_mode]
        self.peer_epochs = {str(PeerID(e.peer_id)): e.epoch for e in voters}
        self.bound_peer_epochs = dict(self.peer_epochs) if self._bound_mode and any(b for b, _ in marked) else {}
        local = self.local_progress
        epoch = robust_global_epoch(local.epoch, list(self.peer_epochs.values()), quorum=self._quorum,
                                    unsupported=time.monotonic() >= self._distrust_until)
        if not others:
            remaining = max(0, self.target_batch_size - local.samples_accumulated)
            return GlobalTrainingProgress(
                epoch, local.samples_accumulated, self.target_batch_size, num_peers=len(entries), num_clients=0,
                eta_next_epoch=now + remaining / self.performance_ema.samples_per_second,
                next_fetch_time=now + self.default_refresh_period)
        rate = self.performance_ema.eps
        samples = estimated = 0.0
        for entry in entries:
            entry_rate = min(entry.samples_per_second, self._max_rate)
            rate += entry_rate
            if entry.epoch == epoch:
                count = min(entry.samples_accumulated, self.target_batch_size)
                samples += count
                estimated += count + max(0.0, min(now - entry.time, 3600.0)) * entry_rate
        eta = max(0.0, self.target_batch_size - estimated) / rate
        num_peers = len(entries)
        expected_peers = max(num_peers + self.expected_drift_peers, num_peers * (1 + self.expected_drift_rate))
        refresh = min(max(eta * num_peers / expected_peers, self.min_refresh_period), self.max_refresh_period)
        return GlobalTrainingProgress(
            epoch, int(samples), self.target_batch_size, num_peers=num_peers,
            num_clients=sum(e.client_mode for e in entries), eta_next_epoch=now + eta, next_fetch_time=now + refresh)
