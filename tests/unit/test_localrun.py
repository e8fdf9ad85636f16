"""A throwaway owned run for loopback nodes: the manifest takes the run-wide settings, node configs
keep only local matters, and an update is a new signed version on disk."""

from __future__ import annotations

import tomllib

from p2ptrain.local.run import create_local_run
from p2ptrain.local.swarm import local_node_config
from p2ptrain.run.manifest import read_manifest_file
from p2ptrain.run.runconfig import local_only, run_wide

OVERRIDES = {"task": {"d_model": 32, "n_heads": 2, "data_path": "/data"},
             "training": {"lr": 2e-3, "target_batch_size": 48, "validate_every": 5.0},
             "checkpoint": {"interval": 20.0}}


def test_overrides_split_into_the_manifest_s_part_and_the_node_s():
    assert run_wide(OVERRIDES) == {"task": {"d_model": 32, "n_heads": 2},
                                   "training": {"lr": 2e-3, "target_batch_size": 48}}
    assert local_only(OVERRIDES) == {"task": {"data_path": "/data"}, "training": {"validate_every": 5.0},
                                     "checkpoint": {"interval": 20.0}}


def test_a_local_run_is_signed_on_disk_with_loopback_timings_and_updates_bump_the_version(tmp_path):
    run = create_local_run(tmp_path / "run", "local", OVERRIDES, policy="invite", fingerprint="none")
    on_disk = read_manifest_file(run.manifest_path, run.ref)
    assert on_disk.policy == "invite" and on_disk.task["d_model"] == 32 and on_disk.training["lr"] == 2e-3
    assert on_disk.training["matchmaking_time"] == 0.5 and on_disk.fingerprint is None  # loopback default
    assert (tmp_path / "run" / "owner.key").stat().st_mode & 0o777 == 0o600
    run.update(revoked=("QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3",))
    assert read_manifest_file(run.manifest_path, run.ref).version == 2 == run.manifest.version


def test_an_owned_run_s_node_config_holds_local_matters_only(tmp_path):
    owned = tomllib.loads(local_node_config(tmp_path, None, {"training": {"validate_every": 5.0}}))
    assert "run_id" not in owned["swarm"] and set(owned["training"]) == {"threads", "load_state_timeout",
                                                                          "validate_every"}
    plain = tomllib.loads(local_node_config(tmp_path, "r", {}))
    assert plain["swarm"]["run_id"] == "r" and plain["training"]["matchmaking_time"] == 0.5


def test_a_node_s_warnings_are_summarised_by_message_with_counts(tmp_path):
    from p2ptrain.local.swarm import LocalNode

    node = LocalNode("a", tmp_path / "a", "run", {})
    assert node.warning_summary() == "(no log)"
    node.log_path.parent.mkdir(parents=True)
    node.log_path.write_text(
        "2026-12-02 13:04:03.847 WARNING p2ptrain.optim.gradient: averaging round failed; applied local gradients\n"
        "2026-12-02 13:04:04.603 INFO    p2ptrain.averaging.model_check: donor plausible\n"
        "2026-12-02 13:04:26.554 WARNING p2ptrain.optim.gradient: averaging round failed; applied local gradients\n"
        "2026-12-02 13:04:27.001 ERROR   p2ptrain.node: round 12 took 3.5 s\n")
    assert node.warning_summary().splitlines() == [
        "    2 x WARNING p2ptrain.optim.gradient: averaging round failed; applied local gradients",
        "    1 x ERROR p2ptrain.node: round N took N s"]
