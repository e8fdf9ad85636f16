"""Round accounting: what counts as an ok ("full") round, histograms, the median, the 5-minute summary."""

from __future__ import annotations

import threading

import pytest

from p2ptrain.optim.round_stats import RoundOutcome, RoundStats, RoundSummary, classify
from p2ptrain.status import RECEIVED_FRACTION_BUCKETS, ROUND_DURATION_BUCKETS, StatusSnapshot


def report(ok: bool = True, duration: float = 1.0, group: int = 3, online: int = 3,
           received: float | None = 1.0) -> RoundSummary:
    return RoundSummary(ok=ok, duration=duration, group_size=group, peers_online=online, received_fraction=received)


@pytest.mark.parametrize("ok, group, online, received, outcome", [
    (False, 0, 3, 0.0, "failed"),
    (False, 3, 3, 1.0, "failed"),        # whatever it claims, a round that did not complete failed
    (True, 3, 3, 1.0, "ok"),
    (True, 2, 3, 1.0, "partial"),        # two of three peers: a third of the swarm left out
    (True, 2, 4, 1.0, "partial"),
    (True, 1, 1, 1.0, "partial"),        # a "group" of one averaged with nobody
    (True, 3, 3, 2 / 3, "partial"),      # a peer's parts are missing: 66.7% received
    (True, 3, 3, 1 / 3, "partial"),
    (True, 2, 2, 0.5, "partial"),
    (True, 10, 10, 0.9, "partial"),      # one part in ten missing is not "all"
    (True, 20, 20, 0.95, "ok"),          # one in twenty is near enough
    (True, 19, 20, 1.0, "ok"),           # in a big swarm someone is always coming or going
    (True, 18, 20, 1.0, "partial"),
    (True, 3, 2, 1.0, "ok"),             # the swarm view lags: the group is the whole swarm
    (True, 2, 0, 1.0, "ok"),             # peers online unknown: judged on the group alone
    (True, 3, 3, None, "ok"),            # not measured (peer checks off): judged on the group alone
])
def test_classify(ok: bool, group: int, online: int, received: float | None, outcome: str) -> None:
    assert classify(report(ok, 1.0, group, online, received).bounded()) == RoundOutcome(outcome)


def test_reports_are_bounded() -> None:
    bad = RoundSummary(ok=True, duration=float("nan"), group_size=-2, peers_online=-1,
                      received_fraction=float("inf")).bounded()
    assert bad == RoundSummary(ok=True, duration=0.0, group_size=0, peers_online=0, received_fraction=0.0)
    assert report(duration=-3.0, received=1.7).bounded().duration == 0.0
    assert report(received=1.7).bounded().received_fraction == 1.0
    assert report(received=-0.2).bounded().received_fraction == 0.0


def test_counts_histograms_and_last_round() -> None:
    stats = RoundStats()
    assert stats.record(report(duration=0.4)) is RoundOutcome.OK
    assert stats.record(report(duration=2.0, received=2 / 3)) is RoundOutcome.PARTIAL
    assert stats.record(report(duration=0.9, group=2, online=3, received=0.5)) is RoundOutcome.PARTIAL
    assert stats.record(report(ok=False, duration=15.0, group=0, received=0.0)) is RoundOutcome.FAILED
    f = stats.figures()
    assert (f.rounds_ok, f.rounds_partial, f.rounds_failed, f.rounds_total) == (1, 2, 1, 4)
    assert f.last_duration == 15.0  # the failure was the last round ...
    # ... but the group figures describe the last round that had a group.
    assert (f.last_group_size, f.last_peers_online, f.last_received_fraction) == (2, 3, 0.5)
    assert f.recent_durations == (0.4, 2.0, 0.9, 15.0)
    assert len(f.duration_bucket_counts) == len(ROUND_DURATION_BUCKETS) + 1 and sum(f.duration_bucket_counts) == 4
    assert f.duration_bucket_counts[ROUND_DURATION_BUCKETS.index(0.5)] == 1
    assert f.duration_bucket_counts[ROUND_DURATION_BUCKETS.index(30.0)] == 1
    assert f.duration_sum == pytest.approx(18.3)
    # Failed rounds received nothing to speak of: only completed rounds enter the fraction histogram.
    buckets = dict(zip((*RECEIVED_FRACTION_BUCKETS, "inf"), f.received_bucket_counts, strict=True))
    assert buckets == {0.25: 0, 0.5: 1, 0.67: 1, 0.75: 0, 0.9: 0, 0.99: 0, 1.0: 1, "inf": 0}
    assert f.received_sum == pytest.approx(1 + 2 / 3 + 0.5)
    assert f.median_received_fraction == pytest.approx(2 / 3)


def test_figures_fill_a_snapshot_that_survives_json() -> None:
    stats = RoundStats()
    for fraction in (1.0, 1.0, 0.5):
        stats.record(report(received=fraction))
    snapshot = StatusSnapshot(**stats.figures().snapshot_fields())
    again = StatusSnapshot.from_dict(snapshot.to_dict())
    assert again == snapshot
    assert (again.averaging_rounds_ok_total, again.averaging_rounds_partial_total) == (2, 1)
    assert again.median_received_fraction == 1.0 and again.last_round_received_fraction == 0.5
    assert again.received_fraction_bucket_counts[-2] == 2


def test_empty_figures() -> None:
    f = RoundStats().figures()
    assert f.rounds_total == 0 and f.median_received_fraction is None and f.last_duration is None
    assert StatusSnapshot(**f.snapshot_fields()).last_round_received_fraction is None


def test_summary_every_five_minutes_only_when_rounds_were_not_full() -> None:
    stats = RoundStats()
    assert stats.take_summary(0.0) is None  # opens the first window
    for fraction in (2 / 3, 2 / 3, 0.5, 1 / 3):
        stats.record(report(received=fraction))
    stats.record(report())
    stats.record(report(ok=False, group=0, received=0.0))
    assert stats.take_summary(299.0) is None
    assert stats.take_summary(300.0) == ("averaging: 4 partial rounds in the last 5 min, median 58% received, "
                                         "1 failed (1 of 6 full)")
    stats.record(report())
    assert stats.take_summary(600.0) is None  # all full: nothing to say
    stats.record(report(ok=False, group=0, received=0.0))
    assert stats.take_summary(1200.0) == "averaging: 1 failed round in the last 10 min (0 of 1 full)"
    stats.record(report(received=0.5))
    assert stats.take_summary(1500.0) == ("averaging: 1 partial round in the last 5 min, median 50% received "
                                          "(0 of 1 full)")


def test_run_summary_counts_every_round_since_start_whatever_the_windows() -> None:
    stats = RoundStats()
    assert stats.run_summary() == "averaging this run: no rounds"
    stats.record(report())
    assert stats.run_summary() == "averaging this run: 1 round, 1 full, 0 partial, 0 failed"
    stats.take_summary(0.0)
    stats.record(report(received=0.5))
    stats.record(report(ok=False, group=0, received=0.0))
    stats.take_summary(300.0)  # a window's summary does not reset the run's counts
    assert stats.run_summary() == "averaging this run: 3 rounds, 1 full, 1 partial, 1 failed"


def test_recording_from_several_threads() -> None:
    stats = RoundStats()

    def record_many() -> None:
        for i in range(500):
            stats.record(report(received=1.0 if i % 2 else 0.5))

    threads = [threading.Thread(target=record_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    f = stats.figures()
    assert (f.rounds_ok, f.rounds_partial) == (1000, 1000)
    assert sum(f.received_bucket_counts) == sum(f.duration_bucket_counts) == 2000


def test_without_peer_checks_the_reducer_still_counts_what_it_mixed_in():
    """With ``swarm.peer_checks = false`` hivemind's own reducer averages, and says only in its log that
    it got a third of the contributions: the counting reducer measures it, so such a round is partial
    there too, not "ok" on its group alone."""
    import asyncio

    import torch

    from p2ptrain.averaging.counting import CountingTensorPartReducer
    from p2ptrain.averaging.robust_reduce import AllReduceReport

    async def reduce() -> CountingTensorPartReducer:
        reducer = CountingTensorPartReducer([torch.Size([4])] * 3, 3)
        first = asyncio.gather(*(reducer.accumulate_part(sender, 0, torch.ones(4) * sender) for sender in range(3)))
        assert all(torch.allclose(r, torch.ones(4)) for r in await first)
        reducer.on_sender_failed(1)  # two senders vanish after their first part
        reducer.on_sender_failed(2)
        rest = await asyncio.gather(*(reducer.accumulate_part(0, part, torch.ones(4)) for part in (1, 2)))
        assert all(torch.allclose(r, torch.ones(4)) for r in rest)
        return reducer

    reducer = asyncio.run(reduce())
    assert reducer.contributions_accepted == 3 + 1 + 1
    measured = AllReduceReport(averager="grad", group_size=3, peers=("me", "p1", "p2"), senders=3,
                             contributions_expected=9, contributions_received=reducer.contributions_accepted,
                             results_expected=12, results_received=12, rejected=(), clipped=0, ok=True,
                             finished_at=0.0)
    report = RoundSummary(ok=True, duration=1.0, group_size=3, peers_online=3,
                         received_fraction=measured.averaged_fraction)
    assert report.received_fraction == pytest.approx(5 / 9) and classify(report) is RoundOutcome.PARTIAL
