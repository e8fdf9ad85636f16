"""Publish a peer's training progress to the DHT about once a second, not on every micro-batch.

hivemind 1.1.12's ``ProgressTracker`` wakes its reporter on every ``report_local_progress`` call,
and both of p2ptrain's optimizers call it on every micro-batch: a DHT store (signed, sent to the
other peers through p2pd, checked and stored by each of them) every few tens of milliseconds.  On a
small model, whose micro-batches are short, that keeps every peer's helper processes (DHT process
and p2pd) steadily busy, between rounds as much as during them, on the cores it trains on
(docs/benchmarks.md has the figures).  Peers extrapolate each other's samples from the last report's
time and rate, so a report a second old costs the round clock nothing.

:class:`PacedReports` goes before hivemind's tracker in a class's bases: the local bookkeeping
(samples, rate, our own view of the swarm's samples) is updated on every call as before; the
reporter is woken every ``report_period`` seconds, or when an eighth of the round's samples have
come since the last report (whichever is first), and at once when the epoch changes, when the first
samples of an epoch come, or when the samples go back (a reset, a rejoin after a pause).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.utils import get_dht_time

#: Seconds between two progress reports of a peer that is only adding samples.
REPORT_PERIOD = 1.0
#: A report is also due once this fraction of the round's target has accumulated since the last one:
#: rounds far shorter than the period (gradient mode with a small target batch) are reported as
#: often as hivemind would report them.
REPORTS_PER_ROUND = 8


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


class PacedReports:
    """Mixin for a hivemind ``ProgressTracker``: report local progress at most every ``report_period`` s."""

    _next_report = -math.inf
    _reported_samples = 0

    def __init__(self, *args: Any, report_period: float = REPORT_PERIOD, **kwargs: Any) -> None:
        self.report_period = report_period
        self._wakeups = HeldWakeups()
        super().__init__(*args, **kwargs)

    @property
    def should_report_progress(self) -> HeldWakeups:
        """The reporter's wake-up event.  hivemind's ``__init__`` assigns a plain ``Event`` here
        (the setter keeps ours), so the reporter thread waits on this one from its first loop."""
        return self._wakeups

    @should_report_progress.setter
    def should_report_progress(self, _event: threading.Event) -> None:
        pass

    def report_local_progress(self, local_epoch: int, samples_accumulated: int,
                              update_global_samples: bool = True) -> None:
        now = time.monotonic()
        report = super().report_local_progress  # type: ignore[misc]
        if self._due(local_epoch, samples_accumulated, now):
            self._next_report, self._reported_samples = now + self.report_period, samples_accumulated
            report(local_epoch, samples_accumulated, update_global_samples)
            return
        with self._wakeups.held():
            report(local_epoch, samples_accumulated, update_global_samples)

    def _due(self, local_epoch: int, samples: int, now: float) -> bool:
        previous = self.local_progress  # type: ignore[attr-defined]  # the last call's, reported or not
        if local_epoch != previous.epoch or samples <= previous.samples_accumulated:
            return True  # a new epoch, a reset, a rejoin after a pause
        # hivemind's reporter stops publishing a peer whose reports of the last two epochs all had
        # zero samples, so the first samples of an epoch are reported at once, however short it is.
        if previous.samples_accumulated == 0 or now >= self._next_report:
            return True
        target = self.target_batch_size  # type: ignore[attr-defined]
        return samples - self._reported_samples >= target / REPORTS_PER_ROUND


class PacedProgressTracker(PacedReports, ProgressTracker):
    """hivemind's progress tracker, reporting about once a second (what the peer checks add is in
    :class:`p2ptrain.averaging.robust_progress.RobustProgressTracker`)."""


def withdraw_progress(tracker: ProgressTracker) -> None:
    """Tell the swarm this peer is not accumulating samples now (what hivemind does when leaving).

    Peers count every live progress record as a partner and wait for it in each averaging round
    (up to ``averaging_timeout``); a paused node must not be waited for.  The tracker re-publishes
    its record every ``metadata_expiration / 2``, so a paused node repeats this now and then.
    """
    tracker.dht.store(tracker.training_progress_key, subkey=tracker._local_public_key, value=None,
                      expiration_time=get_dht_time() + tracker.metadata_expiration, return_future=True)
