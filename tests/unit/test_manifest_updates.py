"""Manifest updates: live vs restart changes, and a tracker that never goes back to an older version."""

from __future__ import annotations

import dataclasses

import pytest

from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.errors import ConfigError
from p2ptrain.run.manifest import new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.run.runconfig import apply_settings
from p2ptrain.run.updates import ManifestTracker, classify

PEER = "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF"


@pytest.fixture(scope="module")
def key() -> OwnerKey:
    return OwnerKey.generate()


@pytest.fixture(scope="module")
def v1(key):
    return new_manifest(key, "upd", TaskSection(), TrainingSection(), clock=1_700_000_000)


def _next(manifest, key, *settings, **fields):
    edited = dataclasses.replace(apply_settings(manifest, settings), **fields)
    return dataclasses.replace(edited, version=manifest.version + 1, updated_at="2030-01-01T00:00:00Z").signed(key)


def test_lr_batch_and_bans_are_live(v1, key):
    v2 = _next(v1, key, "training.lr=3e-4", "training.target_batch_size=512", "training.average_state_every=4",
               banned=(PEER,), revoked=(PEER,))
    change = classify(v1, v2)
    assert change.live and change.restart_fields == []
    assert set(change.fields) == {"training.lr", "training.target_batch_size", "training.average_state_every",
                                  "admission.banned", "admission.revoked", "run.updated_at"}
    assert "training.lr 0.001 -> 0.0003" in change.describe()


@pytest.mark.parametrize(("settings", "fields", "restart"), [
    (("task.d_model=64",), {}, ["task.d_model"]),
    (("training.mode=diloco",), {}, ["training.mode"]),
    (("training.grad_compression=8bit",), {}, ["training.grad_compression"]),
    # The averagers' processes took these (and request timeouts derived from them) when built.
    (("training.matchmaking_time=1.0",), {}, ["training.matchmaking_time"]),
    (("training.averaging_timeout=60",), {}, ["training.averaging_timeout"]),
    (("task.entrypoint=pkg.mod:fn",), {}, ["task.entrypoint"]),
    ((), {"policy": "invite"}, ["admission.policy"]),
])
def test_model_task_mode_and_policy_changes_need_a_restart(v1, key, settings, fields, restart):
    change = classify(v1, _next(v1, key, *settings, **fields))
    assert not change.live and change.restart_fields == restart
    assert "(needs a restart)" in change.describe()


def test_fingerprint_first_recorded_is_live_changed_is_not(v1, key):
    v2 = _next(v1, key, fingerprint="0123456789abcdef")
    assert classify(v1, v2).live
    v3 = _next(v2, key, fingerprint="fedcba9876543210")
    assert classify(v2, v3).restart_fields == ["run.fingerprint"]


def test_tracker_accepts_newer_only_and_counts_the_rest(v1, key):
    tracker = ManifestTracker(v1.ref, v1)
    v2 = _next(v1, key, "training.lr=3e-4")
    assert tracker.offer(v1).accepted is False and tracker.ignored_total == 0  # a re-publication of what we hold
    result = tracker.offer(v2)
    assert result.accepted and result.change is not None and result.change.fields == ["run.updated_at",
                                                                                      "training.lr"]
    assert tracker.current is v2
    old = tracker.offer(v1)
    assert not old.accepted and old.reason == "manifest version 1 is not newer than the current version 2"
    same_version_other_content = _next(v1, key, "training.lr=1e-2")
    assert not tracker.offer(same_version_other_content).accepted
    assert tracker.ignored_total == 2 and tracker.current is v2


def test_tracker_ignores_forged_and_foreign_manifests(v1, key):
    tracker = ManifestTracker(v1.ref)
    assert tracker.current is None
    foreign = new_manifest(OwnerKey.generate(), "upd", TaskSection(), TrainingSection())
    result = tracker.offer(foreign)
    assert not result.accepted and "is the manifest of run upd@" in result.reason
    tampered = dataclasses.replace(v1, version=5)  # signature of version 1
    assert "signature does not verify" in tracker.offer(tampered).reason
    assert tracker.ignored_total == 2 and tracker.current is None
    assert tracker.offer(v1).accepted


def test_tracker_refuses_a_bad_initial_manifest(v1):
    with pytest.raises(ConfigError, match="signature does not verify"):
        ManifestTracker(v1.ref, dataclasses.replace(v1, version=3))
