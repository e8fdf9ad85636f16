"""Progress reports paced to about one a second: the reporter is woken rarely, the local
bookkeeping is kept on every call, and nothing that must be published at once waits."""

from __future__ import annotations

import threading

import pytest

from p2ptrain.averaging.paced_progress import HeldWakeups
from p2ptrain.averaging.progress import SwarmProgressTracker
from p2ptrain.averaging.roundclock import RoundTarget
from tests.support.clock import ManualClock
from tests.support.trackerdht import TrackerDht


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    fake = ManualClock()
    monkeypatch.setattr("p2ptrain.averaging.progress.time.monotonic", fake)
    return fake


def _woken(tracker: SwarmProgressTracker) -> bool:
    """Whether the reporter was woken since the last look (and reset it, as the reporter does)."""
    woken = tracker.should_report_progress.is_set()
    tracker.should_report_progress.clear()
    return woken


def _tracker(target: int = 100_000) -> SwarmProgressTracker:
    return SwarmProgressTracker(TrackerDht(), "run_x", target, start=False)  # type: ignore[arg-type]


def test_hivemind_constructor_keeps_the_paced_event() -> None:
    for tracker in (_tracker(),
                    SwarmProgressTracker(TrackerDht(), "run_x", round_target=RoundTarget(800), start=False),  # type: ignore[arg-type]
                    SwarmProgressTracker(TrackerDht(), "run_x", 1000, start=False, robust=True)):  # type: ignore[arg-type]
        assert isinstance(tracker.should_report_progress, HeldWakeups)


def test_a_burst_of_micro_batches_wakes_the_reporter_once_per_period(clock: ManualClock) -> None:
    tracker = _tracker()
    wakes = 0
    for step in range(1, 101):  # 100 micro-batches of 8 in 2.5 s
        tracker.report_local_progress(0, 8 * step)
        wakes += _woken(tracker)
        clock.now += 0.025
    assert wakes == 3  # at 0 s, 1 s and 2 s (hivemind's own tracker: 100)
    # The local bookkeeping saw every call: our samples, the swarm's as we count them, our rate.
    assert tracker.local_progress.samples_accumulated == 800
    assert tracker.global_progress.samples_accumulated == 800
    assert tracker.performance_ema.num_updates == 100


def test_a_round_far_shorter_than_the_period_is_reported_as_it_fills(clock: ManualClock) -> None:
    tracker = _tracker(target=256)  # gradient mode, a small target batch: an eighth is 32 samples
    wakes = []
    for step in range(1, 9):  # all within the period, a micro-batch every 0.1 s
        tracker.report_local_progress(0, 8 * step)
        if _woken(tracker):
            wakes.append(step)
        clock.now += 0.1
    assert wakes == [1, 5]  # the first samples, then 32 more (hivemind: every one)


def test_fast_micro_batches_on_a_small_target_are_reported_at_most_every_gap(clock: ManualClock) -> None:
    tracker = _tracker(target=192)  # an eighth is 24 samples: three micro-batches
    wakes = 0
    for step in range(1, 101):  # a micro-batch every 10 ms: 1 s
        tracker.report_local_progress(0, 8 * step)
        wakes += _woken(tracker)
        clock.now += 0.01
    assert wakes == 4  # at 0, 0.25, 0.5 and 0.75 s (an eighth alone: 33; hivemind: 100)


def test_a_new_epoch_a_reset_or_a_rejoin_is_reported_at_once(clock: ManualClock) -> None:
    tracker = _tracker()
    tracker.report_local_progress(0, 8)
    assert _woken(tracker)
    tracker.report_local_progress(0, 16)
    assert not _woken(tracker)
    tracker.report_local_progress(0, 16)  # a rejoin after a pause repeats what it had
    assert _woken(tracker)
    tracker.report_local_progress(1, 0)  # the next round
    assert _woken(tracker)
    tracker.report_local_progress(1, 8)  # its first samples: hivemind stops reporting a peer without any
    assert _woken(tracker)
    tracker.report_local_progress(1, 16)
    assert not _woken(tracker)
    clock.now += 1.0
    tracker.report_local_progress(1, 24)
    assert _woken(tracker)


def test_holding_is_per_thread_so_a_shutdown_always_wakes_the_reporter() -> None:
    event = HeldWakeups()
    with event.held():
        event.set()
        assert not event.is_set()
        other = threading.Thread(target=event.set)  # hivemind's shutdown() from another thread
        other.start()
        other.join()
        assert event.is_set()
    event.clear()
    event.set()
    assert event.is_set()


def test_every_epoch_shorter_than_the_period_still_publishes_samples(clock: ManualClock) -> None:
    """hivemind's reporter stops publishing a peer whose reports of two epochs all had no samples."""
    tracker = _tracker()
    for epoch in range(5):  # epochs of 0.2 s
        if epoch:
            tracker.report_local_progress(epoch, 0)
            _woken(tracker)
        published = []
        for step in range(1, 5):
            tracker.report_local_progress(epoch, 8 * step)
            if _woken(tracker):
                published.append(tracker.local_progress.samples_accumulated)
            clock.now += 0.05
        assert published and published[0] > 0, epoch
