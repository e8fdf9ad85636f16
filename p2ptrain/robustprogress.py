"""The swarm's epoch as several peers agree on it, not as the loudest peer claims it.

hivemind 1.1.12's ``ProgressTracker`` takes the *maximum* epoch any peer reports as the global epoch
and sums everyone's samples: one peer claiming epoch 2**40 makes every node think it is behind (it
downloads state, and its optimizer jumps its own epoch there), and one peer claiming huge sample counts
or rates makes every node step early.  :class:`RobustProgressTracker` overrides
``_parse_swarm_progress_data`` (and ``global_epoch``, so a new ban takes effect at once): entries of
gated peers are dropped, the entry count, each peer's samples and rate are bounded, and the global epoch
is :func:`robust_global_epoch`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from hivemind.optim.progress_tracker import GlobalTrainingProgress, LocalTrainingProgress, ProgressTracker
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from p2ptrain.peergate import PeerGate
from p2ptrain.pinned import require_hivemind
from p2ptrain.statecheck import MAX_EPOCH

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


class RobustProgressTracker(ProgressTracker):
    """hivemind's ``ProgressTracker`` with bounded, gated, agreement-based swarm progress.

    ``max_samples_per_second`` bounds each peer's claimed rate; a peer's samples count at most
    ``target_batch_size`` (all a single peer can usefully contribute to one epoch).
    """

    def __init__(self, *args: Any, gate: PeerGate | None = None, max_samples_per_second: float = 1e5,
                 quorum: int = 2, **kwargs: Any) -> None:
        self._gate, self._max_rate, self._quorum = gate, max_samples_per_second, quorum
        self._raw_metadata: Any = None
        self._distrust_until = -math.inf
        self._gate_version = gate.version if gate is not None else 0
        #: Epoch of each non-client peer in the last refresh, by peer ID (for state validation).
        self.peer_epochs: dict[str, int] = {}
        super().__init__(*args, **kwargs)

    def distrust_unsupported(self, seconds: float) -> None:
        """Believe only epochs that several peers agree on for ``seconds``: call it when a download
        meant to reach the swarm's epoch found no usable state.  Otherwise hivemind's optimizer moves
        our epoch straight to a lone peer's unverified claim at the next epoch boundary."""
        self._distrust_until = time.monotonic() + seconds
        self.global_progress = self._parse_swarm_progress_data(self._raw_metadata)

    @property
    def global_epoch(self) -> int:
        if self._gate is not None and self._gate.version != self._gate_version:
            self._gate_version = self._gate.version  # a new ban: recount without waiting for the next fetch
            self.global_progress = self._parse_swarm_progress_data(self._raw_metadata)
        return self.global_progress.epoch

    def _entries(self, metadata: Any) -> list[LocalTrainingProgress]:
        """Valid entries of peers other than us and not gated, at most one per peer ID, bounded in number."""
        own = self.dht.peer_id.to_bytes()
        by_peer: dict[bytes, LocalTrainingProgress] = {}
        for item in list(metadata.values())[:MAX_PROGRESS_ENTRIES]:
            value = getattr(item, "value", None)
            if value is None:
                continue
            try:
                entry = LocalTrainingProgress.parse_obj(value)
                gated = self._gate is not None and entry.peer_id != own and self._gate.is_gated(PeerID(entry.peer_id))
            except Exception:  # the DHT's schema check already ran; anything odd left is skipped
                continue
            if gated or not math.isfinite(entry.time) or entry.epoch > MAX_EPOCH:
                continue
            previous = by_peer.get(entry.peer_id)
            if previous is None or entry.time > previous.time:
                by_peer[entry.peer_id] = entry
        return list(by_peer.values())

    def _parse_swarm_progress_data(self, metadata: Any) -> GlobalTrainingProgress:
        self._raw_metadata = metadata
        now = get_dht_time()
        entries = self._entries(metadata) if isinstance(metadata, dict) else []
        own_id = self.dht.peer_id.to_bytes()
        others = [e for e in entries if e.peer_id != own_id]
        self.peer_epochs = {str(PeerID(e.peer_id)): e.epoch for e in others if not e.client_mode}
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
