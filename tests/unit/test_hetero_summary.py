"""The heterogeneous benchmark's arithmetic: the ABBA schedule, time to the same loss, and the three verdicts."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from benchmarks.hetero import (
    FAIL,
    MIN_EPS,
    NOT_SHOWN,
    PASS,
    TARGETS,
    check_targets,
    loss_at,
    loss_speed,
    markdown,
    peer_cores,
    schedule,
    summarize,
    time_to,
    verdict,
)

WINDOW = 40.0


def _curve(rate: float, *, start: float = 4.0, every: float = 5.0, until: float = WINDOW) -> list[list[float]]:
    """Validations at each landed round: loss = start * exp(-rate * t), sampled every ``every`` seconds."""
    times = [0.0]
    while times[-1] + every <= until:
        times.append(times[-1] + every)
    return [[t, int(t * 20), start * math.exp(-rate * t)] for t in times]


def _peer(rate: float, sequences: int = 1200, rounds: tuple[int, int, int] = (8, 0, 0), helpers: float = 2.0,
          **curve: Any) -> dict:
    points = _curve(rate, **curve)
    ok, partial, failed = rounds
    return {"sequences": sequences, "train_seconds": WINDOW, "final_val_loss": points[-1][2], "curve": points,
            "epoch": 8, "rounds_ok": ok, "rounds_partial": partial, "rounds_failed": failed,
            "helpers_cpu_seconds": helpers}


def test_the_swarms_run_in_abba_order_with_the_equal_swarm_once():
    assert schedule(1) == ["alone", "mixed", "equal"]
    assert schedule(3) == ["alone", "mixed", "mixed", "alone", "alone", "mixed", "equal"]


def test_loss_and_time_are_interpolated_in_log_loss_between_validations():
    curve = [[0.0, 0, 4.0], [10.0, 200, 1.0], [20.0, 400, 0.5]]
    assert loss_at(curve, 5.0) == pytest.approx(2.0)  # halfway in log: the geometric mean
    assert loss_at(curve, 0.0) == 4.0 and loss_at(curve, 30.0) == 0.5  # held after the last landing
    assert time_to(curve, 2.0) == pytest.approx(5.0)
    assert time_to(curve, 1.0) == pytest.approx(10.0)
    assert time_to(curve, 0.4) == math.inf  # never reached in the window
    assert time_to(curve, 5.0) == 0.0


def test_time_to_the_same_loss_pairs_each_alone_run_with_its_mixed_run():
    """L* comes from the alone runs at 0.6 of the window; the mixed swarm counts by its worse peer."""
    alone = [_curve(0.05), _curve(0.05 * 1.02), _curve(0.05 / 1.02)]
    mixed = [(_curve(0.06), _curve(0.055)), (_curve(0.06), _curve(0.06)), (_curve(0.04), _curve(0.07))]
    speed = loss_speed(alone, mixed, WINDOW)
    assert speed["target_loss"] == pytest.approx(4.0 * math.exp(-0.05 * 24.0), rel=1e-3)
    assert speed["t_alone"][0] == pytest.approx(24.0, rel=0.02)
    # Pair by pair (alone[i] with mixed[i]): the worse (slower) peer decides the mixed swarm's time.
    expected = [(0.05 / 0.055) * 24.0 / speed["t_alone"][0], (0.05 / 0.06) * 24.0 / speed["t_alone"][1],
                (0.05 / 0.04) * 24.0 / speed["t_alone"][2]]
    assert speed["ratios"] == pytest.approx(expected, rel=0.03)
    # eps: the alone runs' own spread of times to L* (2% either way: about 4%), never below MIN_EPS.
    assert speed["eps"] == pytest.approx((1.02 - 1 / 1.02), rel=0.2) and speed["eps"] >= MIN_EPS
    assert loss_speed([_curve(0.05)] * 3, [(_curve(0.05), _curve(0.05))] * 3, WINDOW)["eps"] == MIN_EPS


def test_the_three_verdicts():
    assert verdict([0.95, 0.97, 1.01], "<=", 1.0, eps=0.03) == PASS  # median and worst within the noise
    assert verdict([1.05, 1.06, 1.10], "<=", 1.0, eps=0.03) == FAIL  # median above 1 + eps
    assert verdict([0.98, 1.02, 1.04], "<=", 1.0, eps=0.03) == NOT_SHOWN  # median above 1, within eps
    assert verdict([0.90, 0.95, 1.20], "<=", 1.0, eps=0.03) == NOT_SHOWN  # one pair far out
    assert verdict([math.inf, math.inf, 0.9], "<=", 1.0, eps=0.03) == FAIL  # alone's loss never reached
    assert verdict([math.nan, 0.9], "<=", 1.0) == FAIL and verdict([], "<=", 1.0) == FAIL  # not measured
    assert verdict([0.93, 0.95, 0.91], ">=", 0.9) == PASS
    assert verdict([0.95, 0.92, 0.85], ">=", 0.9) == NOT_SHOWN
    assert verdict([0.85, 0.88, 0.95], ">=", 0.9) == FAIL


def _runs(mixed_rates: list[float], alone_rate: float = 0.05, slow_rounds=(7, 1, 0)) -> dict[str, list]:
    return {"alone": [[_peer(alone_rate, 1200, (0, 0, 0), every=4.0)] for _ in mixed_rates],
            "mixed": [[_peer(rate, 950, (7, 1, 1), helpers=4.0, every=6.5), _peer(rate, 250, slow_rounds, every=6.5)]
                      for rate in mixed_rates],
            "equal": [[_peer(0.06, 1000, (8, 0, 0)), _peer(0.06, 1000, (8, 0, 0))]]}


def test_figures_per_pair_and_the_targets_of_a_mode():
    row = summarize("diloco", _runs([0.06, 0.058, 0.062]), WINDOW)
    assert row["pairs"] == 3
    assert row["fast_vs_alone"] == pytest.approx([950 / 1200] * 3)
    assert row["fast_vs_equal"] == pytest.approx([0.95] * 3)  # next to the slow peer vs next to an equal one
    assert row["slow_vs_alone"] == pytest.approx([250 / 1200] * 3)
    assert row["rounds"][0] == {"fast": [7, 1, 1], "slow": [7, 1, 0]}
    assert row["slow_rounds_share"] == pytest.approx([8 / 9] * 3)  # the slow peer averaged in 8 of 9
    assert row["val_spread"] == pytest.approx([0.0] * 3)
    assert row["helpers_alone"] == pytest.approx([2.0 / WINDOW] * 3)  # the fast peer's averaging work
    assert row["helpers_mixed"] == pytest.approx([4.0 / WINDOW] * 3)
    assert all(r < 1 for r in row["time_to_loss_vs_alone"])
    assert check_targets(row) == {**dict.fromkeys(TARGETS, PASS), "slow_rounds_share": FAIL}
    slower = summarize("diloco", _runs([0.03, 0.035, 0.032], slow_rounds=(8, 1, 0)), WINDOW)
    assert check_targets(slower) == {**dict.fromkeys(TARGETS, PASS), "time_to_loss_vs_alone": FAIL}


def test_a_failed_swarm_drops_its_pair_and_nothing_left_fails():
    runs = _runs([0.06])
    runs["alone"], runs["mixed"] = [], []
    row = summarize("diloco", runs, WINDOW)
    assert row["pairs"] == 0 and set(check_targets(row).values()) == {FAIL}


def test_the_table_prints_median_min_max_eps_and_the_verdicts():
    rows = [summarize("diloco", _runs([0.06, 0.058, 0.062]), WINDOW)]
    rows[0]["targets"] = check_targets(rows[0])
    text = markdown(rows, argparse.Namespace(slow_percent=25.0, seconds=WINDOW, repeats=3, peer_checks="on",
                                                 pin_cores=True))
    assert "3 ABBA pair(s) per mode, peer checks on" in text
    assert "| diloco | 0.79 [0.79-0.79] | 0.95 [0.95-0.95] |" in text
    assert "- diloco: fast_vs_equal 0.950 [0.950-0.950] >= 0.9 pass" in text
    assert "slow_rounds_share 0.889 [0.889-0.889] >= 0.9 FAIL" in text
    assert "time_to_loss_vs_alone" in text and "(eps 3.0%) pass" in text
    assert f"| {2 / WINDOW:.1%} [{2 / WINDOW:.1%}-{2 / WINDOW:.1%}] / {4 / WINDOW:.1%} [" in text


def test_each_peer_gets_a_core_of_its_own_and_the_fast_peer_always_the_same_one() -> None:
    """--pin-cores: rank 0 (the fast peer, alone or not) on the first core, rank 1 on the next; with
    one core, or without the flag, nothing is pinned."""
    cores = peer_cores(True, {3, 1, 2})
    assert cores is not None and cores(0) == {1} and cores(1) == {2}
    assert peer_cores(True, {0}) is None and peer_cores(False, {0, 1}) is None
