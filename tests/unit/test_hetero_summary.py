"""The heterogeneous benchmark's arithmetic: ratios, round shares, spreads and the target verdicts."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from benchmarks.hetero import TARGETS, check_targets, markdown, summarize


def _peer(sequences: int, seconds: float, val_loss: float, rounds: tuple[int, int, int] = (0, 0, 0),
          epoch: int = 10) -> dict[str, Any]:
    ok, partial, failed = rounds
    return {"sequences": sequences, "train_seconds": seconds, "final_val_loss": val_loss, "epoch": epoch,
            "rounds_ok": ok, "rounds_partial": partial, "rounds_failed": failed}


def _results(fast_next_to_slow: int = 950, slow_rounds: tuple[int, int, int] = (8, 1, 1),
             slow_loss: float = 2.02) -> dict[str, list[dict[str, Any]]]:
    return {"alone": [_peer(1200, 60.0, 2.10)],
            "equal": [_peer(1000, 60.0, 2.00, (10, 0, 0)), _peer(1000, 60.0, 2.00, (10, 0, 0))],
            "slow": [_peer(fast_next_to_slow, 60.0, 2.00, (9, 1, 0)), _peer(250, 60.0, slow_loss, slow_rounds, 9)]}


def test_ratios_and_shares_come_from_the_right_peers() -> None:
    row = summarize("diloco", _results())
    assert row["fast_vs_alone"] == pytest.approx(950 / 1200)
    assert row["fast_vs_equal"] == pytest.approx(0.95)  # the fast peer next to the slow one vs next to an equal one
    assert row["slow_vs_alone"] == pytest.approx(250 / 1200)
    assert row["rounds"] == {"fast": [9, 1, 0], "slow": [8, 1, 1]}
    assert row["slow_rounds_share"] == pytest.approx(9 / 10)  # the slow peer averaged in 9 of the fast peer's 10
    assert row["epoch_gap"] == 1
    assert row["val_spread"] == pytest.approx(0.01)
    assert row["mixed_vs_alone_loss"] == pytest.approx(2.02 / 2.10) and row["swarm_beats_alone"]


def test_every_target_passes_or_fails_on_its_own_figure() -> None:
    assert check_targets(summarize("diloco", _results())) == dict.fromkeys(TARGETS, True)
    assert check_targets(summarize("diloco", _results(fast_next_to_slow=850))) == {
        **dict.fromkeys(TARGETS, True), "fast_vs_equal": False}
    assert check_targets(summarize("diloco", _results(slow_rounds=(5, 2, 3)))) == {
        **dict.fromkeys(TARGETS, True), "slow_rounds_share": False}
    # A slow model 5% worse: outside the 2% spread, and the mixed swarm's worse model loses to alone.
    assert check_targets(summarize("diloco", _results(slow_loss=2.2))) == {
        **dict.fromkeys(TARGETS, True), "val_spread": False, "mixed_vs_alone_loss": False}


def test_a_figure_that_could_not_be_measured_fails_its_target() -> None:
    results = _results()
    results["slow"][0].update(rounds_ok=0, rounds_partial=0, rounds_failed=0)  # the fast peer had no rounds
    row = summarize("diloco", results)
    assert math.isnan(row["slow_rounds_share"]) and not check_targets(row)["slow_rounds_share"]


def test_the_table_says_pass_or_fail_per_mode() -> None:
    rows = [summarize("diloco", _results()), summarize("p2p_grad", _results(fast_next_to_slow=850))]
    text = markdown(rows, argparse.Namespace(slow_percent=25.0, seconds=60.0))
    assert "- diloco: fast_vs_equal 0.950 >= 0.9 pass, slow_rounds_share 0.900 >= 0.9 pass" in text
    assert "- p2p_grad: fast_vs_equal 0.850 >= 0.9 FAIL" in text
