"""Smoke run of the benchmark harness: every mode trains, reports, and leaves no process behind."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

#: Plain hivemind (the baseline of the full benchmark) is left out: with its own defaults it spends
#: most of this run looking for groups, which says nothing about the harness.
MODES = ("compute", "ddp", "p2p_grad", "diloco")


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_every_mode_trains_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "benchmarks.swarm", "--peers", "2", "--out", str(out), "--shaped-modes", "",
           "--modes", ",".join(MODES), "--fork-workers",  # peers forked: their imports are not what is tested
           "--sequences", "160", "--eval-every", "80", "--micro-batch", "8", "--global-batch", "32",
           "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--val-batches", "2", "--inner-steps", "5",
           # every peer stops itself well inside the mode timeout (hivemind's defaults are slow here)
           "--max-train-seconds", "25", "--mode-timeout", "60",
           # one bare and one service swarm of the daemon-overhead part, with short windows
           "--overhead-repeats", "1", "--overhead-seconds", "3", "--overhead-warmup", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=330, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    rows = {row["mode"]: row for row in report["loopback"]}
    assert set(rows) == set(MODES), done.stdout[-2000:]
    for mode, row in rows.items():
        assert row["seq_per_s"] > 0, mode
        start_loss = row["curve"][0][2]
        assert math.isfinite(row["final_val_loss"]) and row["final_val_loss"] < start_loss, mode
    assert rows["ddp"]["bytes_per_seq"] > 0 and rows["compute"]["bytes_per_seq"] == 0
    assert rows["ddp"]["vs_ddp"] == pytest.approx(1.0)
    overhead = report["overhead"]
    assert [run["hooks"] for run in overhead["runs"]] == ["bare", "service"], done.stdout[-2000:]
    assert overhead["bare_seq_per_s"] > 0 and overhead["service_seq_per_s"] > 0
    service = overhead["runs"][1]
    assert service["endpoint_answers"] > 0  # the service swarm was scraped while it trained
    table = (out / "results.md").read_text()
    assert "p2ptrain DiLoCo" in table and "Daemon overhead" in table and table.strip() in done.stdout


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_the_heterogeneous_benchmark_measures_curves_and_says_a_verdict_per_target(tmp_path: Path) -> None:
    """One ABBA pair and the equal swarm, DiLoCo only, tiny model: every peer validates the swarm's model
    at each landed round, with the node's peer checks on, and every target gets one of the three verdicts."""
    out = tmp_path / "hetero"
    cmd = [sys.executable, "-m", "benchmarks.hetero", "--modes", "diloco", "--repeats", "1", "--seconds", "12",
           "--out", str(out), "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--val-batches", "2",
           "--inner-steps", "5", "--eval-min-gap", "0", "--report-only", "--fork-workers",
           # a swarm trains 12 s; its start (two peers, their DHT) takes longer beside another test
           "--mode-timeout", "100"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=390, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "hetero.json").read_text())
    [row] = report["rows"]
    assert row["pairs"] == 1 and set(row["targets"]) == {"fast_vs_equal", "slow_rounds_share", "val_spread",
                                                          "time_to_loss_vs_alone"}
    assert set(row["targets"].values()) <= {"pass", "FAIL", "not shown (within noise)"}
    runs = report["runs"]["diloco"]
    peers = [peer for kind in ("alone", "mixed", "equal") for swarm in runs[kind] for peer in swarm]
    assert len(peers) == 5, f"{len(peers)} of 5 peers reported (a failed swarm says why):\n{done.stdout[-3000:]}"
    assert {peer["peer_checks"] for peer in peers} == {"on"}
    for peer in peers:
        times = [point[0] for point in peer["curve"]]
        assert times[0] == 0.0 and times == sorted(times) and len(times) >= 3, peer["curve"]  # start, a round, end
        assert peer["eval_seconds"] > 0
    assert row["loss_speed"]["target_loss"] < runs["alone"][0][0]["curve"][0][2]  # L*: the alone run learned
    table = (out / "hetero.md").read_text()
    assert "1 ABBA pair(s) per mode, peer checks on" in table and table.strip() in done.stdout



@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_sparse_outer_mode_averages_rounds_and_sends_a_fraction_of_diloco_s_bytes(tmp_path: Path) -> None:
    """diloco_topk, tiny model, rounds of a fraction of a second: rounds average, the swarm's model learns,
    and a round's estimated traffic is a fraction of what today's DiLoCo sends at 8 bits (a byte a parameter).

    The run is bounded by its 12 s of training, not by its sequences: the two peers see each other in
    the DHT only after a few seconds, and each trains alone (no round) until then."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "benchmarks.swarm", "--peers", "2", "--out", str(out), "--shaped-modes", "",
           "--modes", "diloco_topk", "--sequences", "30000", "--eval-every", "6000", "--micro-batch", "8",
           "--global-batch", "32", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--val-batches", "2",
           "--inner-steps", "15", "--max-train-seconds", "12", "--mode-timeout", "75", "--overhead-repeats", "0",
           "--fork-workers"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["loopback"]
    assert len(rows) == 1, done.stdout[-3000:]  # a failed mode says why in the run's output
    [row] = rows
    rounds = row["rounds_ok"] + row["rounds_partial"]  # summed over the peers, as bytes_sent is
    assert rounds >= 1, done.stdout[-2000:]
    assert math.isfinite(row["final_val_loss"]) and row["final_val_loss"] < row["curve"][0][2]
    [worker] = out.glob("bench-diloco_topk-*/result.0.json")
    params = json.loads(worker.read_text())["params"]
    assert 0 < row["bytes_sent"] / rounds < params / 3
