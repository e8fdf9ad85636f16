"""A manifest merged into a node config: run-wide settings from the owner, local ones from the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.config.schema import ConfigError, NodeConfig, parse_config
from p2ptrain.run.manifest import load_manifest, new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.run.runconfig import apply_settings, merge_manifest


@pytest.fixture(scope="module")
def manifest():
    owner = parse_config({"task": {"d_model": 64, "n_heads": 2}, "training": {"lr": 3e-4, "mode": "diloco",
                                                                              "inner_steps": 50}}, "owner")
    return new_manifest(OwnerKey.generate(), "merge-run", owner.task, owner.training)


def test_empty_volunteer_config_takes_the_run_settings_and_keeps_local_ones(manifest, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n" * 100)
    local = parse_config({"training": {"threads": 2, "max_epochs": 7}, "node": {"state_dir": "/tmp/x"},
                          "task": {"data_path": str(corpus)}}, "node.toml")
    merged = merge_manifest(local, manifest)
    assert merged.task.d_model == 64 and merged.task.n_heads == 2
    assert merged.training.lr == 3e-4 and merged.training.mode == "diloco" and merged.training.inner_steps == 50
    assert merged.training.threads == 2 and merged.training.max_epochs == 7
    assert merged.node.state_dir == Path("/tmp/x") and str(merged.task.data_path) == str(corpus)
    assert merged.swarm.run_id == manifest.ref.run_id and merged.swarm.run == str(manifest.ref)


def test_values_the_config_leaves_out_or_that_agree_are_not_contradictions(manifest):
    local = parse_config({"training": {"inner_steps": 50}, "task": {"d_model": 64}}, "node.toml")
    merged = merge_manifest(local, manifest)  # lr left out; inner_steps and d_model agree
    assert merged.training.lr == 3e-4


@pytest.mark.parametrize(("data", "environ", "field"), [
    ({"training": {"lr": 1e-3}}, {}, "training.lr"),  # the default, but said explicitly
    ({}, {"P2PTRAIN_TASK__D_MODEL": "128"}, "task.d_model"),
    ({"swarm": {"run_id": "p2ptrain-default"}}, {}, "swarm.run_id"),
])
def test_an_explicit_value_equal_to_the_default_still_contradicts(manifest, data, environ, field):
    local = parse_config(data, "node.toml", environ)
    with pytest.raises(ConfigError, match=rf"^{field}: this node's config says .* remove {field} from"):
        merge_manifest(local, manifest)


@pytest.mark.parametrize(("section", "values", "message"), [
    ("training", {"lr": 0.01}, r"^training\.lr: this node's config says 0\.01 but run merge-run@\w+ "
                               r"\(manifest version 1\) says 0\.0003; remove training\.lr from the node config$"),
    ("task", {"d_model": 256, "n_heads": 4}, r"^task\.d_model: .* says 256 but .* says 64"),
    ("task", {"entrypoint": "pkg.mod:fn"}, r"^task\.entrypoint: .* says 'pkg.mod:fn' but .* says None"),
    ("training", {"inner_steps": 7}, r"^training\.inner_steps: .* says 7 but .* says 50"),
    ("swarm", {"run_id": "another-run"}, r"^swarm\.run_id: .* says 'another-run' but .* says 'merge-run-"),
    ("swarm", {"run": "merge-run@" + "a" * 26}, r"^swarm\.run: .* says 'merge-run@a+' but"),
])
def test_explicit_contradictions_name_both_values(manifest, section, values, message):
    local = parse_config({section: values}, "node.toml")
    with pytest.raises(ConfigError, match=message):
        merge_manifest(local, manifest)


def test_machine_local_task_settings_stay_out_and_local_data_is_each_node_s(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("owner's text\n" * 100)
    owner = parse_config({"task": {"data_path": str(corpus), "cache_dir": "/owner/cache", "buffer_mb": 512,
                                   "cache_max_mb": 100, "download_timeout": 5.0, "d_model": 64, "n_heads": 2}},
                         "owner.toml")
    manifest = new_manifest(OwnerKey.generate(), "local-data", owner.task, owner.training)
    assert manifest.local_data and manifest.task["data_path"] is None and manifest.task["d_model"] == 64
    assert not {"cache_dir", "buffer_mb", "cache_max_mb", "download_timeout"} & set(manifest.task)
    assert "/owner" not in manifest.to_toml() and str(corpus) not in manifest.to_toml()

    mine = tmp_path / "mine.txt"
    mine.write_text("volunteer's copy\n" * 100)
    local = parse_config({"task": {"data_path": str(mine), "cache_dir": str(tmp_path / "cache"), "buffer_mb": 8}},
                         "node.toml")
    merged = merge_manifest(local, manifest)
    assert merged.task.data_path == str(mine) and merged.task.cache_dir == tmp_path / "cache"
    assert merged.task.buffer_mb == 8 and merged.task.cache_max_mb == 0 and merged.task.d_model == 64
    with pytest.raises(ConfigError, match=r"^task\.data_path: run local-data@\w+ \(manifest version 1\) trains on "
                                          r"data each node keeps itself .*: set task\.data_path in this node's"):
        merge_manifest(parse_config({}, "node.toml"), manifest)
    gone = NodeConfig.model_validate({"task": {"data_path": str(tmp_path / "gone.txt")}})  # not load-checked
    with pytest.raises(ConfigError, match=r"^task\.data_path: .*gone\.txt does not exist \(the data of run "):
        merge_manifest(gone, manifest)


def test_data_at_a_url_is_the_run_s_for_every_node(tmp_path):
    url = "https://data.example.org/shards/SHA256SUMS"
    owner = parse_config({"task": {"data_path": url}}, "owner.toml")
    manifest = new_manifest(OwnerKey.generate(), "url-data", owner.task, owner.training)
    assert manifest.task["data_path"] == url and not manifest.local_data
    assert merge_manifest(parse_config({}, "node.toml"), manifest).task.data_path == url
    mine = tmp_path / "mine.txt"
    mine.write_text("x\n" * 10)
    with pytest.raises(ConfigError, match=r"^task\.data_path: this node's config says '.*mine\.txt' but run url-data"):
        merge_manifest(parse_config({"task": {"data_path": str(mine)}}, "node.toml"), manifest)
    edited = apply_settings(manifest, ["task.local_data=true"])
    assert edited.local_data and edited.task["data_path"] is None
    assert apply_settings(edited, [f"task.data_path={url}"]).local_data is False


def test_the_manifest_carries_the_data_index_digest_to_every_node(tmp_path):
    digest = "ab" * 32
    url = "https://data.example.org/shards/SHA256SUMS"
    owner = parse_config({"task": {"data_path": url, "data_index_sha256": digest}}, "owner.toml")
    key = OwnerKey.generate()
    manifest = new_manifest(key, "pinned-data", owner.task, owner.training)
    assert f'data_index_sha256 = "{digest}"' in manifest.to_toml()
    assert load_manifest(manifest.to_toml(), "m", manifest.ref) == manifest
    assert merge_manifest(parse_config({}, "node.toml"), manifest).task.data_index_sha256 == digest
    with pytest.raises(ConfigError, match=rf"^task\.data_index_sha256: this node's config says '{'cd' * 32}' but "):
        merge_manifest(parse_config({"task": {"data_index_sha256": "cd" * 32}}, "node.toml"), manifest)
    # A run created without one renders as before: the field is left out, not written empty.
    plain = new_manifest(key, "pinned-data", parse_config({"task": {"data_path": url}}, "o").task, owner.training)
    assert "data_index_sha256" not in plain.to_toml()


def test_apply_settings_edits_run_wide_fields_only(manifest):
    edited = apply_settings(manifest, ["training.lr=1e-4", "training.target_batch_size = 512",
                                       "task.options={ a = 1 }", "training.overlap=false"])
    assert edited.training["lr"] == 1e-4 and edited.training["target_batch_size"] == 512
    assert edited.task["options"] == {"a": 1} and edited.training["overlap"] is False
    assert edited.signature == manifest.signature  # unsigned until the caller re-signs it


@pytest.mark.parametrize(("assignment", "message"), [
    ("training.threads=4", r"--set training\.threads: a local setting"),
    ("task.cache_dir=/tmp/c", r"--set task\.cache_dir: a local setting"),
    ("task.buffer_mb=8", r"--set task\.buffer_mb: a local setting"),
    ("task.data_path=/home/me/corpus", r"--set task\.data_path: the manifest names the run's data by http\(s\)"),
    ("task.local_data=1", r"--set task\.local_data: expected true or false"),
    ("training.nope=1", r"--set training\.nope: unknown key"),
    ("task.nope=1", r"--set task\.nope: unknown key"),
    ("swarm.run_id=x", r"--set swarm\.run_id: only task\.\* and training\.\*"),
    ("training.lr", r"expected SECTION\.FIELD=VALUE"),
    ("training.lr=-1", r"--set training\.lr: Input should be greater than 0"),
    ("task.n_heads=3", r"--set task: .*n_heads \(3\) must divide d_model"),
    ("training.mode=sideways", r"--set training\.mode: Input should be 'gradient' or 'diloco'"),
])
def test_bad_settings_are_one_line(manifest, assignment, message):
    with pytest.raises(ConfigError, match=message):
        apply_settings(manifest, [assignment])
