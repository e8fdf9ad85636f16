"""SIGHUP reload diff: which changed fields apply at run time and which need a restart."""

from __future__ import annotations

from p2ptrain.config.schema import parse_config
from p2ptrain.daemon.reload import reloadable_changes

PEER = "/ip4/127.0.0.1/tcp/41400/p2p/QmTzQ1JRkWErjk39mryYw2WVaphAZNAREyMchXzYQ7c15n"


def test_identical_configs_change_nothing() -> None:
    config = parse_config({"swarm": {"initial_peers": [PEER]}}, "a")
    assert reloadable_changes(config, config.model_copy(deep=True)) == ([], [])


def test_reloadable_and_restart_fields_are_separated() -> None:
    old = parse_config({}, "old")
    new = parse_config({
        "node": {"log_level": "DEBUG"},
        "swarm": {"initial_peers": [PEER], "run_id": "other-run"},
        "training": {"threads": 2, "lr": 0.01},
        "volunteer": {"run_windows": ["22:00-07:00"], "busy_cpu_percent": 30},
        "api": {"port": 0},
        "task": {"options": {"vocab": {"size": 3}}},
    }, "new")
    applied, restart = reloadable_changes(old, new)
    assert applied == ["node.log_level", "swarm.initial_peers", "training.threads",
                       "volunteer.busy_cpu_percent", "volunteer.run_windows"]
    assert restart == ["api.port", "swarm.run_id", "task.options", "training.lr"]


def test_path_fields_compare_by_value() -> None:
    old = parse_config({"node": {"state_dir": "/var/lib/p2ptrain"}}, "old")
    new = parse_config({"node": {"state_dir": "/var/lib/p2ptrain-2"}}, "new")
    assert reloadable_changes(old, new) == ([], ["node.state_dir"])


def test_merge_reloadable_takes_only_reloadable_fields() -> None:
    from p2ptrain.daemon.reload import merge_reloadable

    old = parse_config({"training": {"threads": 1, "lr": 0.001, "max_epochs": 5}}, "old")
    new = parse_config({"training": {"threads": 2, "lr": 0.5, "max_epochs": 9},
                        "volunteer": {"busy_cpu_percent": 30}, "swarm": {"run_id": "other"}}, "new")
    merged = merge_reloadable(old, new)
    assert (merged.training.threads, merged.training.max_epochs) == (2, 9)
    assert merged.volunteer.busy_cpu_percent == 30
    assert merged.training.lr == 0.001 and merged.swarm.run_id == old.swarm.run_id  # need a restart: kept
    assert reloadable_changes(old, merged)[1] == []
