"""Counters about averaging rounds, traffic and state downloads, safe to write from two threads.

Who writes what: with ``training.overlap`` (the default) hivemind finishes a gradient round on a
background thread of its own, and the DiLoCo averager's rounds land from the training thread; the
state downloads run on the training thread.  Readers (the snapshot the node publishes twice a
second) must never see a round half-recorded, so rounds go to :class:`~p2ptrain.optim.round_stats.RoundStats`
(locked, read as one :class:`~p2ptrain.optim.round_stats.RoundFigures`) and traffic and downloads are kept
under this class's lock and read as one immutable :class:`SwarmStatsView`.  Credit (the samples
this node contributed, :mod:`p2ptrain.trust.credit`) is settled by the same round outcomes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from p2ptrain.optim.round_stats import RoundOutcome, RoundStats, RoundSummary
from p2ptrain.trust.credit import CreditLedger


@dataclass(frozen=True)
class SwarmStatsView:
    """One consistent reading of traffic and state downloads."""

    bytes_sent: int = 0
    bytes_received: int = 0
    state_downloads: int = 0
    state_downloads_failed: int = 0
    state_download_seconds: float = 0.0
    state_download_progress: float | None = None


@dataclass
class SwarmStats:
    """What the optimizers record as rounds end and downloads run; every method locks."""

    rounds: RoundStats = field(default_factory=RoundStats)
    credit: CreditLedger = field(default_factory=CreditLedger)
    _view: SwarmStatsView = field(default_factory=SwarmStatsView)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self) -> SwarmStatsView:
        with self._lock:
            return self._view

    def record_round(self, report: RoundSummary, payload_bytes: int) -> RoundOutcome:
        """One finished (or abandoned) averaging round.

        Traffic is estimated from the payload and the group size: a butterfly all-reduce makes each
        peer send and receive (n-1)/n of the tensors, twice (reduce-scatter, then all-gather).
        """
        outcome = self.rounds.record(report)
        # Credit: the epoch's samples count when the round averaged them with at least one other peer.
        self.credit.round_ended(averaged=outcome is not RoundOutcome.FAILED and report.group_size >= 2)
        if report.ok:
            group = max(report.group_size, 1)
            moved = int(2 * payload_bytes * (group - 1) / group)
            with self._lock:
                old = self._view
                self._view = replace(old, bytes_sent=old.bytes_sent + moved,
                                     bytes_received=old.bytes_received + moved)
        return outcome

    def epoch_closed(self, samples: int, *, round_started: bool, alone: bool) -> None:
        """An epoch's samples were handed to its round (or, with no round, applied): see
        :meth:`p2ptrain.trust.credit.CreditLedger.epoch_closed`.  Called before that round can end."""
        self.credit.epoch_closed(samples, round_started=round_started, alone=alone)

    def download_started(self) -> None:
        with self._lock:
            self._view = replace(self._view, state_download_progress=0.0)

    def download_finished(self, ok: bool, seconds: float) -> None:
        with self._lock:
            old = self._view
            self._view = replace(
                old,
                state_downloads=old.state_downloads + ok,
                state_downloads_failed=old.state_downloads_failed + (not ok),
                state_download_seconds=old.state_download_seconds + (seconds if ok else 0.0),
                state_download_progress=None,
            )
