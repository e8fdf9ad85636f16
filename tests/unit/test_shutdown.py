"""Leaving: a hang while closing ends the process with the code earned so far; a quick close does not."""

from __future__ import annotations

import logging
import threading

from p2ptrain.daemon.shutdown import close_within_deadline, land_round_in_flight
from p2ptrain.optim.round_stats import RoundStats, RoundSummary


def test_a_hanging_close_is_cut_short_with_the_latest_exit_code() -> None:
    released = threading.Event()
    forced: list[int] = []
    code = [1]

    def hang() -> None:
        code[0] = 0  # the final checkpoint landed before the hang: a forced exit is now a clean one
        released.wait(5)

    def force_exit(exit_code: int) -> None:
        forced.append(exit_code)
        released.set()

    close_within_deadline([hang], lambda: code[0], deadline=0.05, force_exit=force_exit)
    assert forced == [0]


def test_closers_that_return_in_time_run_in_order_and_disarm_the_deadline() -> None:
    order: list[str] = []
    forced: list[int] = []
    close_within_deadline([lambda: order.append("hooks"), lambda: order.append("swarm")], lambda: 1,
                          deadline=0.05, force_exit=forced.append)
    threading.Event().wait(0.1)
    assert order == ["hooks", "swarm"] and forced == []


def test_a_round_that_fails_to_land_is_one_warning(caplog) -> None:
    class Failing:
        def flush(self) -> None:
            raise TimeoutError("averaging timed out")

    land_round_in_flight(Failing())  # type: ignore[arg-type]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "did not land" in caplog.records[0].getMessage() and caplog.records[0].exc_info is None


def test_the_run_summary_counts_the_round_that_landed_last(caplog) -> None:
    rounds = RoundStats()

    class Landing:
        def flush(self) -> None:
            rounds.record(RoundSummary(ok=True, duration=1.0, group_size=2, peers_online=2, received_fraction=1.0))

    with caplog.at_level(logging.INFO, logger="p2ptrain.daemon.shutdown"):
        land_round_in_flight(Landing(), rounds)  # type: ignore[arg-type]
    assert caplog.messages == ["averaging this run: 1 round, 1 full, 0 partial, 0 failed"]
