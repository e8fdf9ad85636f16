"""The scale benchmark's arithmetic and bookkeeping, without starting a node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import scale
from benchmarks.dht_ops import key_kind, read_counts
from benchmarks.footprint import TreeSample, cpu_percent, role_of, sample_tree
from benchmarks.startup import node_environment, package_folders
from p2ptrain.status import StatusSnapshot

ROOT = Path(__file__).resolve().parents[2]


def test_roles_of_a_node_s_processes() -> None:
    assert role_of(10, 10, "python -m p2ptrain.cli run") == "node"
    assert role_of(11, 10, "python -m p2ptrain.cli run") == "helpers"  # hivemind's forks share the command line
    assert role_of(12, 10, "/venv/lib/hivemind/hivemind_cli/p2pd -listen=/unix/x") == "p2pd"


def test_cpu_percent_is_per_role_and_never_negative() -> None:
    before = TreeSample({"node": 1.0, "helpers": 2.0, "p2pd": 3.0})
    after = TreeSample({"node": 1.5, "helpers": 1.0, "p2pd": 3.2})  # a helper that exited: its CPU left the tree
    assert cpu_percent(before, after, 10.0) == pytest.approx({"node": 5.0, "helpers": 0.0, "p2pd": 2.0})


def test_this_process_tree_is_read() -> None:
    sample = sample_tree(os.getpid(), memory=True)
    assert sample.processes["node"] == 1 and sample.pss_mib["node"] > 1 and sample.cpu_seconds["node"] > 0


def test_percentiles_and_the_memory_check(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scale.percentile([], 0.5) is None
    assert scale.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == 5.0
    assert scale.percentile([1.0, 2.0, 3.0], 0.5) == 2.0
    monkeypatch.setattr(scale, "available_mib", lambda: 10_000.0)
    assert scale.fits_in_memory(8, [{"pss_mib_max": 500.0}]) is None  # 8 x 550 + 2048 = 6448
    refused = scale.fits_in_memory(32, [{"pss_mib_max": 500.0}])
    assert refused is not None and refused.startswith("memory: 32 nodes x 500 MiB") and "10000 MiB available" in refused


def test_rounds_are_counted_over_the_window_per_node() -> None:
    first = [StatusSnapshot(averaging_rounds_ok_total=2, samples_processed_total=100, bytes_sent_total=1000),
             StatusSnapshot(averaging_rounds_ok_total=1)]
    last = [StatusSnapshot(averaging_rounds_ok_total=6, averaging_rounds_partial_total=1,
                           samples_processed_total=300, bytes_sent_total=5000),
            StatusSnapshot(averaging_rounds_ok_total=2, averaging_rounds_failed_total=1, samples_processed_total=100,
                           bytes_sent_total=1000)]
    rounds = scale._rounds(first, last, [[(4, 1.0), (3, 0.5)], [(4, 1.0)]])
    assert (rounds["rounds_full"], rounds["rounds_partial"], rounds["rounds_failed"]) == (5, 1, 1)
    assert rounds["full_share_worst"] == pytest.approx(0.5) and rounds["full_share_median"] == pytest.approx(0.65)
    assert (rounds["group_min"], rounds["group_max"]) == (3, 4)
    assert rounds["bytes_per_sequence"] == pytest.approx(5000 / 300)


def test_a_size_that_could_not_start_is_a_row_that_says_why() -> None:
    args = scale.parse_args(["--nodes", "32"])
    table = scale.markdown([{"code": "this", "nodes": 32, "stopped_by": "memory: 32 nodes x 700 MiB"}], args)
    assert "| this | 32 | not started: memory: 32 nodes x 700 MiB |" in table


def test_a_run_without_the_paused_phase_has_dashes_for_its_idle_figures() -> None:
    args = scale.parse_args(["--nodes", "8", "--idle-seconds", "0"])
    row = {"code": "this", "nodes": 8, "averaged": 8, "join_to_round_p50": 5.0, "join_to_round_p95": 9.0,
           "rounds_full": 40, "rounds_partial": 0, "rounds_failed": 0, "full_share_worst": 1.0,
           "full_share_median": 1.0, "group_min": 8, "group_median": 8.0, "group_max": 8, "bytes_per_sequence": 960.0,
           "helper_cpu_seconds_per_round": 0.5, "pss_mib_median": 460.0, "pss_mib_node": 110.0,
           "pss_mib_helpers": 270.0, "pss_mib_p2pd": 80.0, "processes_per_node": 5.0, "param_spread_max": 0.01,
           "val_loss_spread": 0.1, **scale._NOT_IDLE}
    assert "| - / - (-+-+-) | 460 (110+270+80) |" in scale.markdown([row], args)


@pytest.mark.parametrize("argv", [["--nodes", "1"], ["--train-percent", "0"], ["--against", "/nonexistent"],
                                  ["--link", "50mbit/40ms"], ["--idle-seconds", "-1"]])
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        scale.parse_args(argv)
    assert exited.value.code == 2


def test_another_checkout_s_code_is_what_its_nodes_import(tmp_path: Path) -> None:
    other = tmp_path / "other"
    for package in ("p2ptrain", "daemon", "tui"):
        (other / package).mkdir(parents=True)
        (other / package / "__init__.py").write_text(f"WHERE = 'other {package}'\n")
    (other / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert package_folders(other)["p2ptrain.daemon"] == str(other / "daemon")
    env = {**os.environ, **node_environment(tmp_path / "site", checkout=other)}
    code = ("import p2ptrain, p2ptrain.daemon, p2ptrain.tui; "
            "print(p2ptrain.WHERE, p2ptrain.daemon.WHERE, p2ptrain.tui.WHERE)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)  # even from this checkout's root
    assert done.stdout.strip() == "other p2ptrain other daemon other tui", done.stderr


def test_dht_keys_are_named_by_kind_and_counts_add_up(tmp_path: Path) -> None:
    run = "scale-1234abcd"
    assert key_kind(f"{run}_peers", run) == "peers"
    assert key_kind(f"{run}_0cb0614e4a822253_progress", run) == "progress"
    assert key_kind(f"{run}_0cb0614e4a822253_grad_averager.0b0110", run) == "grad_averager.<group>"
    assert key_kind(f"{run}_0cb0614e4a822253_state_averager.all_averagers", run) == "state_averager.all_averagers"
    (tmp_path / "1.json").write_text('{"get peers": 2}')
    (tmp_path / "2.json").write_text('{"get peers": 3, "answered find": 7}')
    (tmp_path / "3.json").write_text("half written")
    assert read_counts(tmp_path) == {"get peers": 5, "answered find": 7}
    assert node_environment(tmp_path / "nothing") == {}
