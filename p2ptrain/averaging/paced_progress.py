"""Publish a peer's training progress to the DHT about once a second, not on every micro-batch.

hivemind 1.1.12's ``ProgressTracker`` wakes its reporter on every ``report_local_progress`` call,
and both of p2ptrain's optimizers call it on every micro-batch: a DHT store (signed, sent to the
other peers through p2pd, checked and stored by each of them) every few tens of milliseconds.  On a
small model, whose micro-batches are short, that keeps every peer's helper processes (DHT process
and p2pd) steadily busy, between rounds as much as during them, on the cores it trains on
(docs/benchmarks.md has the figures).  Peers extrapolate each other's samples from the last report's
time and rate, so a report a second old costs the round clock nothing.

:class:`ReportPacing` says when a report is due, and the tracker
(:class:`p2ptrain.averaging.progress.SwarmProgressTracker`) holds the reporter's wake-ups
(:class:`HeldWakeups`) otherwise: the local bookkeeping (samples, rate, our own view of the swarm's
samples) is updated on every call as before; the reporter is woken every ``report_period`` seconds,
or when an eighth of the round's samples have come since the last report but no sooner than
``MIN_REPORT_GAP`` after it (a small target batch filled by fast micro-batches would otherwise mean a
store every few of them), and at once when the epoch changes, when the first samples of an epoch
come, or when the samples go back (a reset, a rejoin after a pause).  No hivemind here.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator

#: Seconds between two progress reports of a peer that is only adding samples.
REPORT_PERIOD = 1.0
#: A report is also due once this fraction of the round's target has accumulated since the last one:
#: rounds far shorter than the period (gradient mode with a small target batch) are reported as
#: often as hivemind would report them.
REPORTS_PER_ROUND = 8
#: The shortest time between two reports of a peer that is only adding samples.
MIN_REPORT_GAP = 0.25


class HeldWakeups(threading.Event):
    """A ``threading.Event`` whose ``set()`` does nothing in a thread inside :meth:`held`.

    Holding is per thread: a ``set()`` from any other thread (hivemind's ``shutdown``) always wakes
    the waiter, so a held report can never delay a shutdown.
    """

    def __init__(self) -> None:
        super().__init__()
        self._holding = threading.local()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._holding.on = True
        try:
            yield
        finally:
            self._holding.on = False

    def set(self) -> None:
        if not getattr(self._holding, "on", False):
            super().set()


class ReportPacing:
    """When a peer's progress report is due: every ``report_period`` seconds while it only adds samples."""

    def __init__(self, report_period: float = REPORT_PERIOD) -> None:
        self.report_period = report_period
        self._next_report = self._last_report = -math.inf
        self._reported_samples = 0

    def due(self, epoch: int, samples: int, previous_epoch: int, previous_samples: int, target: int,
            now: float) -> bool:
        """Whether ``(epoch, samples)`` is reported now, given the last call's (reported or not), the
        round's target and the time (monotonic); a due report is taken as made."""
        due = self._due(epoch, samples, previous_epoch, previous_samples, target, now)
        if due:
            self._last_report, self._next_report, self._reported_samples = now, now + self.report_period, samples
        return due

    def _due(self, epoch: int, samples: int, previous_epoch: int, previous_samples: int, target: int,
             now: float) -> bool:
        if epoch != previous_epoch or samples <= previous_samples:
            return True  # a new epoch, a reset, a rejoin after a pause
        # hivemind's reporter stops publishing a peer whose reports of the last two epochs all had
        # zero samples, so the first samples of an epoch are reported at once, however short it is.
        if previous_samples == 0 or now >= self._next_report:
            return True
        return (samples - self._reported_samples >= target / REPORTS_PER_ROUND
                and now - self._last_report >= min(MIN_REPORT_GAP, self.report_period))
