"""Honest figures for averaging rounds: how much of the swarm each round really averaged.

hivemind calls a round done when its all-reduce returns, even if it averaged two peers of five or
received a third of the contributions it expected (it logs "Reducer: received 33.3% of input
tensors" and goes on).  Here each round is reported as a :class:`RoundSummary` and sorted into one
of three outcomes (:func:`classify`):

- **ok** ("full"): it completed, its group held every peer of the run that was online (at least two;
  in swarms of 20 or more, 95% of them: someone is always joining or leaving), and at least 95% of
  the contributions expected in it arrived, as the node's reducer measured them (with the peer checks
  on or off: :mod:`p2ptrain.averaging.counting`).  That is what a
  user means by "my update was averaged with the swarm".  Peers this node excludes as offenders
  are not counted as online: nobody averages with them on purpose.
- **partial**: it completed but missed one of those marks (a group of two in a swarm of three, a
  peer that dropped out mid-round, parts that never arrived or were refused).  The node applied a
  real but thinner average.
- **failed**: it did not complete (no group found, timed out, an error); the node applied its own
  update only.

Standard library only: the status code, the node and the averager side all import it.
"""

from __future__ import annotations

import bisect
import collections
import enum
import math
import statistics
import threading
from dataclasses import dataclass
from typing import Any

from p2ptrain.status import RECEIVED_FRACTION_BUCKETS, ROUND_DURATION_BUCKETS

#: A completed round is "full" only if at least this share of its expected contributions arrived.
FULL_RECEIVED_FRACTION = 0.95
#: ... and its group held at least this share of the peers online (self included), rounded up: with
#: fewer than 20 peers that is all of them.
FULL_GROUP_COVERAGE = 0.95
#: Completed rounds the median received fraction is taken over.
RECENT_ROUNDS = 100
#: Durations kept for the TUI's sparkline.
RECENT_DURATIONS = 60


@dataclass(frozen=True)
class RoundSummary:
    """One averaging round as this node saw it.  The averager reports ``received_fraction`` (what
    was really averaged: see :attr:`p2ptrain.averaging.robust_reduce.AllReduceReport.averaged_fraction`); the node
    adds ``peers_online``."""

    #: The round completed (its all-reduce returned); False for no group, timeouts, errors.
    ok: bool
    #: Seconds from the start of the round to its end (or failure).
    duration: float
    #: Peers in the round's group, this node included; 0 when no group formed.
    group_size: int
    #: Peers of the run online when the round ended, this node included; 0 if unknown.
    peers_online: int
    #: Share (0..1) of the contributions expected from the group that actually arrived; None when
    #: not measured (the averager's report of the round never arrived): the group alone decides then.
    received_fraction: float | None

    def bounded(self) -> RoundSummary:
        """A copy with every figure made finite and in range (the averager process is trusted code,
        but a NaN here would poison every histogram after it)."""

        def count(value: int) -> int:
            return value if isinstance(value, int) and value > 0 else 0

        fraction = self.received_fraction
        if fraction is not None:
            fraction = min(1.0, max(0.0, fraction)) if math.isfinite(fraction) else 0.0
        duration = self.duration if math.isfinite(self.duration) and self.duration > 0 else 0.0
        return RoundSummary(ok=bool(self.ok), duration=duration, group_size=count(self.group_size),
                           peers_online=count(self.peers_online), received_fraction=fraction)


class RoundOutcome(enum.StrEnum):
    OK = "ok"
    PARTIAL = "partial"
    FAILED = "failed"


def classify(report: RoundSummary) -> RoundOutcome:
    """ok / partial / failed, by the rule in the module docstring (``report`` already bounded)."""
    if not report.ok:
        return RoundOutcome.FAILED
    # A stale swarm view may know fewer peers than the group had: the group is then all of them.
    online = max(report.peers_online, report.group_size)
    # A hair of float slack: 19 of 20 is exactly 0.95 however it was computed.
    covered = report.group_size >= 2 and report.group_size >= math.ceil(FULL_GROUP_COVERAGE * online - 1e-9)
    received = report.received_fraction
    if covered and (received is None or received >= FULL_RECEIVED_FRACTION - 1e-9):
        return RoundOutcome.OK
    return RoundOutcome.PARTIAL


def _bucket(value: float, bounds: tuple[float, ...]) -> int:
    return bisect.bisect_left(bounds, value)


@dataclass(frozen=True)
class RoundFigures:
    """Everything the status snapshot says about rounds, taken at one instant."""

    rounds_ok: int = 0
    rounds_partial: int = 0
    rounds_failed: int = 0
    last_duration: float | None = None
    last_group_size: int = 0
    last_peers_online: int = 0
    last_received_fraction: float | None = None
    recent_durations: tuple[float, ...] = ()
    duration_bucket_counts: tuple[int, ...] = (0,) * (len(ROUND_DURATION_BUCKETS) + 1)
    duration_sum: float = 0.0
    received_bucket_counts: tuple[int, ...] = (0,) * (len(RECEIVED_FRACTION_BUCKETS) + 1)
    received_sum: float = 0.0
    median_received_fraction: float | None = None

    @property
    def rounds_total(self) -> int:
        return self.rounds_ok + self.rounds_partial + self.rounds_failed

    def snapshot_fields(self) -> dict[str, Any]:
        """Keyword arguments for :class:`p2ptrain.status.StatusSnapshot`."""
        return dict(
            averaging_rounds_ok_total=self.rounds_ok, averaging_rounds_partial_total=self.rounds_partial,
            averaging_rounds_failed_total=self.rounds_failed, last_round_duration_seconds=self.last_duration,
            last_round_group_size=self.last_group_size, last_round_peers_online=self.last_peers_online,
            last_round_received_fraction=self.last_received_fraction,
            recent_round_durations=self.recent_durations,
            round_duration_bucket_counts=self.duration_bucket_counts, round_duration_sum_seconds=self.duration_sum,
            received_fraction_bucket_counts=self.received_bucket_counts, received_fraction_sum=self.received_sum,
            median_received_fraction=self.median_received_fraction,
        )


class RoundStats:
    """Counts rounds by outcome, with histograms of duration and received fraction.

    Thread-safe: rounds are recorded wherever they end (the training thread, an averaging callback)
    while the node's loop takes figures and summaries.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {outcome: 0 for outcome in RoundOutcome}
        self._last: RoundSummary | None = None
        self._last_completed: RoundSummary | None = None
        self._durations: collections.deque[float] = collections.deque(maxlen=RECENT_DURATIONS)
        self._duration_buckets = [0] * (len(ROUND_DURATION_BUCKETS) + 1)
        self._duration_sum = 0.0
        self._received: collections.deque[float] = collections.deque(maxlen=RECENT_ROUNDS)
        self._received_buckets = [0] * (len(RECEIVED_FRACTION_BUCKETS) + 1)
        self._received_sum = 0.0
        # The current summary window: outcome counts and the partial rounds' received fractions.
        self._window_start: float | None = None
        self._window_counts = {outcome: 0 for outcome in RoundOutcome}
        self._window_partial: list[float] = []

    def record(self, report: RoundSummary) -> RoundOutcome:
        report = report.bounded()
        outcome = classify(report)
        with self._lock:
            self._counts[outcome] += 1
            self._window_counts[outcome] += 1
            self._last = report
            self._durations.append(report.duration)
            self._duration_buckets[_bucket(report.duration, ROUND_DURATION_BUCKETS)] += 1
            self._duration_sum += report.duration
            if report.ok:
                self._last_completed = report
            fraction = report.received_fraction
            if report.ok and fraction is not None:
                self._received.append(fraction)
                self._received_buckets[_bucket(fraction, RECEIVED_FRACTION_BUCKETS)] += 1
                self._received_sum += fraction
            if outcome is RoundOutcome.PARTIAL and fraction is not None:
                self._window_partial.append(fraction)
        return outcome

    def figures(self) -> RoundFigures:
        with self._lock:
            last, completed = self._last, self._last_completed
            return RoundFigures(
                rounds_ok=self._counts[RoundOutcome.OK], rounds_partial=self._counts[RoundOutcome.PARTIAL],
                rounds_failed=self._counts[RoundOutcome.FAILED],
                last_duration=last.duration if last else None,
                # Group figures describe the last round that formed one (a failure has no group).
                last_group_size=completed.group_size if completed else 0,
                last_peers_online=completed.peers_online if completed else 0,
                last_received_fraction=completed.received_fraction if completed else None,
                recent_durations=tuple(self._durations),
                duration_bucket_counts=tuple(self._duration_buckets), duration_sum=self._duration_sum,
                received_bucket_counts=tuple(self._received_buckets), received_sum=self._received_sum,
                median_received_fraction=statistics.median(self._received) if self._received else None,
            )

    def run_summary(self) -> str:
        """One line on every round since the node started, for the log when it stops."""
        with self._lock:
            ok, partial, failed = (self._counts[o] for o in RoundOutcome)
        total = ok + partial + failed
        if not total:
            return "averaging this run: no rounds"
        return (f"averaging this run: {total} round{'s' if total != 1 else ''}, {ok} full, {partial} partial, "
                f"{failed} failed")

    def take_summary(self, now: float, every: float = 300.0) -> str | None:
        """Once per ``every`` seconds (monotonic ``now``): one line on the rounds that were not ok in
        that time, for the log at INFO; None when it is not yet time or every round was ok."""
        with self._lock:
            if self._window_start is None:
                self._window_start = now
                return None
            elapsed = now - self._window_start
            if elapsed < every:
                return None
            counts, partial = dict(self._window_counts), list(self._window_partial)
            self._window_start = now
            self._window_counts = {outcome: 0 for outcome in RoundOutcome}
            self._window_partial = []
        ok, n_partial, failed = (counts[o] for o in RoundOutcome)
        if not n_partial and not failed:
            return None
        minutes = max(1, round(elapsed / 60))
        parts = []
        if n_partial:
            received = f", median {statistics.median(partial):.0%} received" if partial else ""
            parts.append(f"{n_partial} partial round{'s' if n_partial != 1 else ''} in the last {minutes} min"
                         f"{received}")
        if failed:
            parts.append(f"{failed} failed" if n_partial else f"{failed} failed round{'s' if failed != 1 else ''} "
                         f"in the last {minutes} min")
        return f"averaging: {', '.join(parts)} ({ok} of {ok + n_partial + failed} full)"
