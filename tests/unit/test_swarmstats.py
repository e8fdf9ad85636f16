"""SwarmStats is written from hivemind's background thread (overlapped rounds) and from the training
thread, and read twice a second for the snapshot: every reading must be one consistent state."""

from __future__ import annotations

import sys
import threading

from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.status import ROUND_DURATION_BUCKETS

ROUNDS_PER_WRITER = 20_000


def test_readings_are_consistent_while_two_threads_record_rounds() -> None:
    stats = SwarmStats()
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a torn reading shows up at once
    torn: list[str] = []

    def writer(ok: bool) -> None:
        report = RoundSummary(ok=ok, duration=1.0, group_size=3, peers_online=3, received_fraction=1.0)
        for _ in range(ROUNDS_PER_WRITER):
            stats.record_round(report, 300)

    writers = [threading.Thread(target=writer, args=(ok,)) for ok in (True, False)]
    try:
        for thread in writers:
            thread.start()
        while any(thread.is_alive() for thread in writers) and not torn:
            rounds = stats.rounds.figures()
            total = rounds.rounds_total
            if sum(rounds.duration_bucket_counts) != total or rounds.duration_sum != float(total) \
                    or sum(rounds.received_bucket_counts) != rounds.rounds_ok + rounds.rounds_partial:
                torn.append(f"{rounds}")
            if stats.view().bytes_sent % 400:
                torn.append(f"{stats.view()}")
    finally:
        for thread in writers:
            thread.join()
        sys.setswitchinterval(previous_interval)
    assert not torn, torn[0]
    final = stats.rounds.figures()
    assert final.rounds_ok == final.rounds_failed == ROUNDS_PER_WRITER
    assert final.duration_bucket_counts[ROUND_DURATION_BUCKETS.index(1.0)] == 2 * ROUNDS_PER_WRITER
    assert stats.view().bytes_sent == 400 * ROUNDS_PER_WRITER


def test_downloads_are_counted_with_their_time_and_progress_cleared() -> None:
    stats = SwarmStats()
    stats.download_started()
    assert stats.view().state_download_progress == 0.0
    stats.download_finished(True, 2.5)
    stats.download_started()
    stats.download_finished(False, 9.0)
    view = stats.view()
    assert (view.state_downloads, view.state_downloads_failed, view.state_download_seconds) == (1, 1, 2.5)
    assert view.state_download_progress is None
