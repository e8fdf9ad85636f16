"""hivemind's progress tracker, hardened: one subclass with pacing, the robust swarm view and DiLoCo's round target.

:class:`SwarmProgressTracker` overrides (hivemind 1.1.12's ``ProgressTracker``; every one is listed in
:mod:`p2ptrain.averaging.pinned`):

* ``report_local_progress`` and the ``should_report_progress`` event: reports about once a second
  (:class:`~p2ptrain.averaging.paced_progress.ReportPacing`), not on every micro-batch.
* ``_parse_swarm_progress_data`` and ``global_epoch``: with ``robust`` (the peer checks) the swarm's
  epoch as several identity-bound peers agree on it, every claim bounded, gated peers dropped, a new
  ban effective at once (:mod:`p2ptrain.averaging.robust_progress`); without, hivemind's.  With a
  :class:`~p2ptrain.averaging.roundclock.RoundTarget` (DiLoCo) the target grows with the peers, by
  speed, counted over the entries believed.
* ``_local_public_key`` (read): :meth:`SwarmProgressTracker.withdraw` withdraws our entry while paused.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from hivemind.optim.progress_tracker import GlobalTrainingProgress, LocalTrainingProgress, ProgressTracker
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from p2ptrain.averaging.paced_progress import REPORT_PERIOD, HeldWakeups, ReportPacing
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.robust_progress import MAX_PROGRESS_ENTRIES, robust_global_epoch
from p2ptrain.averaging.roundclock import RoundTarget, claimed_rate
from p2ptrain.trust.peergate import PeerGate
from p2ptrain.trust.verdicts import MAX_EPOCH

require_hivemind(__name__)

#: Seconds after which a peer's progress entry no longer counts towards the round: a peer that trains
#: reports at least once a step and about once a second, a paused one withdraws its entry, but
#: hivemind re-publishes its last one (with its old time and rate) every ``metadata_expiration / 2``,
#: and a crashed peer's lives until it expires.  Extrapolated from its old time and rate, such an entry
#: makes every peer see the round due at once: rounds start early, and the swarm's progress is read at
#: the shortest period, over and over, while the whole swarm is paused.  Far above any step time.
STALE_AFTER = 30.0

logger = logging.getLogger(__name__)


class SwarmProgressTracker(ProgressTracker):
    """hivemind's ``ProgressTracker`` reporting about once a second (``report_period``).

    ``robust``: bounded, gated (``gate``), identity-bound (``bound``: record key -> peer ID) swarm
    progress whose epoch ``quorum`` peers agree on; ``max_samples_per_second`` bounds each peer's claimed
    rate, and a peer's samples count at most ``target_batch_size`` (all a single peer can usefully
    contribute to one epoch).  ``round_target``: DiLoCo's round target (the tracker's target then
    follows it; none is given).
    """

    def __init__(self, *args: Any, report_period: float = REPORT_PERIOD, robust: bool = False,
                 gate: PeerGate | None = None, max_samples_per_second: float = 1e5, quorum: int = 2,
                 bound: Callable[[], Mapping[bytes, str]] | None = None, round_target: RoundTarget | None = None,
                 **kwargs: Any) -> None:
        # All of it before hivemind's __init__, which reads the swarm's progress once.
        self._pacing, self._wakeups = ReportPacing(report_period), HeldWakeups()
        self.round_target = round_target
        if round_target is not None:
            kwargs["target_batch_size"] = round_target.per_peer_samples
        self.robust = robust
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

    @property
    def pace(self) -> float:
        """The swarm's pace at the last reading (0.0 without a round target)."""
        return self.round_target.pace if self.round_target is not None else 0.0

    # ------------------------------------------------------------------ paced reports

    @property
    def should_report_progress(self) -> HeldWakeups:
        """The reporter's wake-up event.  hivemind's ``__init__`` assigns a plain ``Event`` here
        (the setter keeps ours), so the reporter thread waits on this one from its first loop."""
        return self._wakeups

    @should_report_progress.setter
    def should_report_progress(self, _event: Any) -> None:
        pass

    def report_local_progress(self, local_epoch: int, samples_accumulated: int,
                              update_global_samples: bool = True) -> None:
        previous = self.local_progress  # the last call's, reported or not
        if self._pacing.due(local_epoch, samples_accumulated, previous.epoch, previous.samples_accumulated,
                            self.target_batch_size, time.monotonic()):
            super().report_local_progress(local_epoch, samples_accumulated, update_global_samples)
            return
        with self._wakeups.held():
            super().report_local_progress(local_epoch, samples_accumulated, update_global_samples)

    def withdraw(self) -> None:
        """Tell the swarm this peer is not accumulating samples now (what hivemind does when leaving).

        Peers count every live progress record as a partner and wait for it in each averaging round
        (up to ``averaging_timeout``); a paused node must not be waited for.  The tracker re-publishes
        its record every ``metadata_expiration / 2``, so a paused node repeats this now and then.
        """
        self.dht.store(self.training_progress_key, subkey=self._local_public_key, value=None,
                       expiration_time=get_dht_time() + self.metadata_expiration, return_future=True)

    # ------------------------------------------------------------------ the swarm's progress

    def _set_round_target(self, rates: Any) -> None:
        if self.round_target is not None:
            self.target_batch_size = self.round_target.update(rates)

    def _parse_swarm_progress_data(self, metadata: Any) -> GlobalTrainingProgress:
        self._raw_metadata = metadata
        if self.robust:
            return self._parse_robustly(metadata)
        values = [getattr(entry, "value", None) for entry in metadata.values()] if isinstance(metadata, dict) else []
        self._set_round_target([claimed_rate(value) for value in values if value is not None])
        return super()._parse_swarm_progress_data(metadata)

    def distrust_unsupported(self, seconds: float) -> None:
        """Believe only epochs that several peers agree on for ``seconds``: call it when a download
        meant to reach the swarm's epoch found no usable state.  Otherwise hivemind's optimizer moves
        our epoch straight to a lone peer's unverified claim at the next epoch boundary."""
        self._distrust_until = time.monotonic() + seconds
        self.global_progress = self._parse_swarm_progress_data(self._raw_metadata)

    @property
    def global_epoch(self) -> int:
        if not self.robust:
            return int(self.global_progress.epoch)
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

    def _parse_robustly(self, metadata: Any) -> GlobalTrainingProgress:
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
        current = [e for e in entries if now - e.time <= STALE_AFTER]
        if not any(e.peer_id != own_id for e in current):
            remaining = max(0, self.target_batch_size - local.samples_accumulated)
            return GlobalTrainingProgress(
                epoch, local.samples_accumulated, self.target_batch_size, num_peers=len(entries), num_clients=0,
                eta_next_epoch=now + remaining / self.performance_ema.samples_per_second,
                next_fetch_time=now + self.default_refresh_period)
        rate = self.performance_ema.eps
        samples = estimated = 0.0
        for entry in current:  # a peer that stopped adding samples neither brings the round closer nor speeds it
            entry_rate = min(entry.samples_per_second, self._max_rate)
            rate += entry_rate
            if entry.epoch == epoch:
                count = min(entry.samples_accumulated, self.target_batch_size)
                samples += count
                estimated += count + max(0.0, now - entry.time) * entry_rate
        eta = max(0.0, self.target_batch_size - estimated) / rate
        num_peers = len(entries)
        expected_peers = max(num_peers + self.expected_drift_peers, num_peers * (1 + self.expected_drift_rate))
        refresh = min(max(eta * num_peers / expected_peers, self.min_refresh_period), self.max_refresh_period)
        return GlobalTrainingProgress(
            epoch, int(samples), self.target_batch_size, num_peers=num_peers,
            num_clients=sum(e.client_mode for e in entries), eta_next_epoch=now + eta, next_fetch_time=now + refresh)
