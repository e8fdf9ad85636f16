"""A node in an owned run, with the loop's fakes and an in-memory DHT behind the real run keeper.

Covers the one-line join (settings from the fetched manifest), a manifest file or invite that is
bad (exit 78, nothing written), no manifest in the swarm (exit 1), manifest versions applied live
at an epoch boundary, a change that needs a restart (exit 75), a ban of this node (exit 78), the
swarm view without non-admitted peers, and the closed-swarm hint.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_node_loop import STEPS_PER_EPOCH, FakeBuilder, RecordingHooks
from test_ownedrun import MemoryDHT

from p2ptrain.config.schema import TaskSection, TrainingSection, parse_config
from p2ptrain.daemon.builder import NodeBuilder
from p2ptrain.daemon.node import Node
from p2ptrain.run.invite import issue_invite
from p2ptrain.run.manifest import new_manifest
from p2ptrain.run.manifest_store import ManifestStore
from p2ptrain.run.owner import OwnerKey
from p2ptrain.status import NodeState, PeerRecord, SwarmView
from p2ptrain.swarm.dht import PeersRefused
from p2ptrain.swarm.identity import ensure_identity, identity_path, peer_id_of_identity
from p2ptrain.swarm.manifest_source import SourceUnavailable
from p2ptrain.swarm.ownedrun import RunKeeper, prepare_run, settle
from p2ptrain.swarm.run_entries import fetch_manifest, publish_manifest
from tests.support.clock import ManualClock

SELF = "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF"
OTHER = "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"


@pytest.fixture(scope="module")
def owner() -> tuple[OwnerKey, Any]:
    key = OwnerKey.generate()
    return key, new_manifest(key, "owned", TaskSection(d_model=64), TrainingSection(lr=3e-4, target_batch_size=96))


def _next(manifest: Any, key: OwnerKey, **changes: Any) -> Any:
    return dataclasses.replace(manifest, version=manifest.version + 1, **changes).signed(key)


class OwnedBuilder(FakeBuilder):
    """The real plan and keeper; the keeper's DHT is in memory and polls on the fake clock."""

    def __init__(self, clock: ManualClock, dht: MemoryDHT, **kwargs: Any) -> None:
        super().__init__(clock, **kwargs)
        self.clock, self.dht = clock, dht

    def prepare(self, config: Any, state_dir: Path) -> Any:
        return prepare_run(config, identity_path(state_dir))

    fetch_manifest = NodeBuilder.fetch_manifest  # the real one, around the in-memory fetch below

    def _fetch_manifest(self, plan: Any, initial_peers: Any, stopper: Any) -> Any:
        """What the real builder does through a short-lived DHT, from the in-memory one."""
        found = fetch_manifest(self.dht, plan.ref)
        if found.manifest is None:
            raise SourceUnavailable(f"no valid manifest of run {plan.ref} found in the swarm within 0s")
        return settle(plan, found.manifest)

    def join(self, *args: Any, **kwargs: Any) -> Any:
        swarm = super().join(*args, **kwargs)
        swarm.peer_id = SELF  # a real peer ID: a manifest may name it
        return swarm

    def follow_run(self, plan: Any, swarm: Any) -> Any:
        self.keeper = RunKeeper(plan, self.dht, clock=self.clock, poll_every=0.5)
        return self.keeper


def _node(tmp_path: Path, dht: MemoryDHT, swarm: dict[str, Any], *, on_step: Any = None, **training: Any,
          ) -> tuple[Node, OwnedBuilder, RecordingHooks]:
    clock = ManualClock()
    builder = OwnedBuilder(clock, dht, on_step=on_step)
    hooks = RecordingHooks(clock)
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "api": {"enabled": False},
                           "swarm": {"bootstrap_timeout": 0.4, **swarm},
                           "training": {"validate_every": 1e6, **training}, "checkpoint": {"interval": 1e6}}, "test")
    node = Node(config, hooks=hooks, builder=builder, clock=clock, wall_clock=lambda: 1.7e9,  # type: ignore[arg-type]
                set_threads=lambda n: None, paused_wait=0.0)
    return node, builder, hooks


def test_one_line_join_trains_with_the_manifest_s_settings(tmp_path, owner, caplog):
    caplog.set_level("INFO")
    _, manifest = owner
    dht = MemoryDHT()
    publish_manifest(dht, manifest)
    node, builder, _ = _node(tmp_path, dht, {"run": str(manifest.ref)}, max_epochs=2)
    assert node.run() == 0
    used = builder.built_with["config"]
    assert used.task.d_model == 64 and used.training.lr == 3e-4 and used.swarm.run_id == manifest.ref.run_id
    assert builder.built_with["run"] is builder.keeper and builder.joined_with["plan"] is node.plan
    status = node.latest.status()
    assert (status.run_ref, status.manifest_version, status.admission_policy) == (str(manifest.ref), 1, "open")
    assert status.target_batch_size == 96 and status.run_id == manifest.ref.run_id
    assert f"run {manifest.ref}: manifest version 1, open run, model fingerprint not recorded" in caplog.messages


def test_no_manifest_in_the_swarm_is_exit_1_with_one_line(tmp_path, owner, capsys):
    _, manifest = owner
    node, _, _ = _node(tmp_path, MemoryDHT(), {"run": str(manifest.ref)})
    assert node.run() == 1
    err = capsys.readouterr().err
    assert err == f"p2ptrain: no valid manifest of run {manifest.ref} found in the swarm within 0s\n"


def _bad_manifest(tmp_path: Path, owner: Any, case: str) -> tuple[dict[str, Any], str]:
    key, manifest = owner
    text = manifest.to_toml()
    path = tmp_path / "manifest.toml"
    if case == "another-owner":
        other = OwnerKey.generate()
        forged = dataclasses.replace(manifest, owner_key=other.public_key).signed(other)
        path.write_text(forged.to_toml())
        message = rf"is the manifest of run owned@\w+, not {manifest.ref}"
        return {"run": str(manifest.ref), "manifest": str(path)}, message
    if case == "bad-signature":
        forged = dataclasses.replace(manifest, signature=OwnerKey.generate().sign(manifest.signing_bytes()))
        text, message = forged.to_toml(), r"signature does not verify \(changed after the owner signed it"
    elif case == "unknown-version":
        text, message = text.replace("format = 1", "format = 7"), r"format 7 is not supported by this p2ptrain"
    elif case == "missing-field":
        text, message = text.replace('\nmode = "gradient"', ""), r"training\.mode: required"
    elif case == "tampered-byte":
        text, message = text.replace("d_model = 64", "d_model = 96"), r"signature does not verify"
    path.write_text(text)
    return {"manifest": str(path)}, message


@pytest.mark.parametrize("case", ["another-owner", "bad-signature", "unknown-version", "missing-field", "tampered-byte",
                                  "expired-invite", "wrong-peer-invite"])
def test_a_bad_manifest_or_invite_is_exit_78_one_line_and_nothing_written(tmp_path, owner, capsys, case):
    key, manifest = owner
    if case.endswith("invite"):
        identity = tmp_path / "elsewhere" / "identity.key"
        identity.parent.mkdir()
        ensure_identity(identity)
        private = _next(manifest, key, policy="invite")
        (tmp_path / "private.toml").write_text(private.to_toml())
        peer = OTHER if case == "wrong-peer-invite" else peer_id_of_identity(identity)
        invite = issue_invite(key, manifest.ref, peer, 1, now=1.0 if case == "expired-invite" else None)
        swarm = {"manifest": str(tmp_path / "private.toml"), "invite": invite}
        message = "invite is for peer" if case == "wrong-peer-invite" else "expired on"
        state = tmp_path / "state"
    else:
        swarm, message = _bad_manifest(tmp_path, owner, case)
        state = tmp_path / "state"
    config = parse_config({"node": {"state_dir": str(state)}, "api": {"enabled": False}, "swarm": swarm}, "test")
    if case.endswith("invite"):  # the node's identity exists: only the invite is wrong
        state.mkdir()
        identity_path(state).write_bytes((tmp_path / "elsewhere" / "identity.key").read_bytes())
        before = sorted(p.name for p in state.iterdir())
    node = Node(config, hooks=RecordingHooks(ManualClock()), builder=NodeBuilder())
    assert node.run() == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("p2ptrain: ") and re.search(message, err), err
    if case.endswith("invite"):
        assert sorted(p.name for p in state.iterdir()) == before  # no lock, no API files, nothing
    else:
        assert not state.exists()


def test_a_new_learning_rate_is_applied_at_the_next_epoch_boundary(tmp_path, owner, caplog):
    caplog.set_level("INFO")
    key, manifest = owner
    dht = MemoryDHT()
    publish_manifest(dht, manifest)
    v2 = _next(manifest, key, training={**manifest.training, "lr": 1e-4, "target_batch_size": 128})

    def on_step(step: int) -> None:
        if step == 2:
            publish_manifest(dht, v2)
        if step == 6 * STEPS_PER_EPOCH:
            node.request_stop("test over")

    node, builder, _ = _node(tmp_path, dht, {"run": str(manifest.ref)}, on_step=on_step)
    assert node.run() == 0
    applied = builder.optimizer.applied
    assert len(applied) == 1 and applied[0].lr == 1e-4 and applied[0].target_batch_size == 128
    assert applied[0].validate_every == 1e6  # local settings stay the node's own
    assert node.current_config().training.lr == 1e-4 and node.latest.status().target_batch_size == 128
    assert node.latest.status().manifest_version == 2
    line = next(m for m in caplog.messages if m.startswith(f"run {manifest.ref}: applied manifest version 2"))
    assert int(line.rsplit(" ", 1)[1]) >= 1  # at an epoch boundary after the one it arrived in
    assert any("training.lr 0.0003 -> 0.0001" in m and "next epoch boundary" in m for m in caplog.messages)


@pytest.mark.parametrize(("change", "code", "message"), [
    ({"task": "d_model"}, 75, r"task\.d_model 64 -> 32 \(needs a restart\): stopping so that the restarted node"),
    ({"banned": (SELF,)}, 78, rf"this node \({SELF}\) was banned or its invite revoked by the run's owner"),
    ({"fingerprint": "0123456789abcdef"}, 78, r"model fingerprint f{16} differs from run owned@\w+'s model 0123"),
])
def test_manifest_versions_a_running_node_cannot_apply_stop_it(tmp_path, owner, capsys, change, code, message):
    key, manifest = owner
    dht = MemoryDHT()
    publish_manifest(dht, manifest)
    if "task" in change:
        change = {"task": {**manifest.task, "d_model": 32}}
    v2 = _next(manifest, key, **change)

    def on_step(step: int) -> None:
        if step == 3:
            publish_manifest(dht, v2)
        if step == 20 * STEPS_PER_EPOCH:
            node.request_stop("the update never arrived")

    node, builder, _ = _node(tmp_path, dht, {"run": str(manifest.ref)}, on_step=on_step)
    assert node.run() == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err
    assert builder.parts.checkpoints == 1 and builder.optimizer.applied == []  # stopped cleanly, nothing applied


def test_records_of_peers_the_run_does_not_admit_leave_the_swarm_view(tmp_path, owner):
    key, manifest = owner
    dht = MemoryDHT()
    publish_manifest(dht, _next(manifest, key, banned=(OTHER,)))
    node, _, hooks = _node(tmp_path, dht, {"run": str(manifest.ref)}, max_epochs=1)
    view = SwarmView(peers=(PeerRecord(peer_id=SELF, state=NodeState.TRAINING.value, samples_per_second=5.0),
                            PeerRecord(peer_id=OTHER, state=NodeState.TRAINING.value, samples_per_second=999.0)))
    hooks.swarm_view = lambda: view  # type: ignore[method-assign]
    assert node.run() == 0
    status = node.latest.status()
    assert status.records_not_admitted == 1 and status.peers_online == 1 and status.swarm_samples_per_second == 5.0
    assert [p.peer_id for p in node.latest.swarm().peers] == [SELF]


def test_a_closed_swarm_hints_that_the_run_may_be_invite_only(tmp_path, owner, monkeypatch):
    _, manifest = owner
    config = parse_config({"node": {"state_dir": str(tmp_path)}, "swarm": {"run": str(manifest.ref)}}, "test")
    plan = prepare_run(config, identity_path(tmp_path))

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PeersRefused("no initial peer answered our DHT requests after 3 attempts in 8s")

    monkeypatch.setattr("p2ptrain.daemon.builder.start_dht", refused)
    with pytest.raises(PeersRefused, match=rf"8s; run {manifest.ref} may be invite-only: ask its owner for an "
                                           r"invite for this node's peer ID \(p2ptrain run peer-id prints it\)"):
        NodeBuilder().join(plan.config, tmp_path, lambda: ["/ip4/127.0.0.1/tcp/1"], [], None, lambda: 0.0,  # type: ignore[arg-type]
                           plan=plan)


def test_an_invite_in_a_config_without_a_manifest_asks_for_the_identity_first(tmp_path, owner, capsys):
    key, manifest = owner
    invite = issue_invite(key, manifest.ref, OTHER, 1)
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")},
                           "swarm": {"run": str(manifest.ref), "invite": invite}}, "test")
    node = Node(config, hooks=RecordingHooks(ManualClock()), builder=NodeBuilder())
    assert node.run() == 78
    assert "has no identity yet" in capsys.readouterr().err and not (tmp_path / "state").exists()



def test_an_invite_without_a_run_ends_the_node_with_one_line_before_anything_is_written(tmp_path, owner, capsys):
    """It used to start a plain run (p2ptrain-default), the invite ignored."""
    key, manifest = owner
    invite = issue_invite(key, manifest.ref, OTHER, 1)
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "swarm": {"invite": invite}}, "test")
    node = Node(config, hooks=RecordingHooks(ManualClock()), builder=NodeBuilder())
    assert node.run() == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(r"p2ptrain: config error: swarm\.invite: .* it needs swarm\.run \(the "
                                             r"run's reference; or --run REF\) or swarm\.manifest$", err), err
    assert not (tmp_path / "state").exists()


def test_a_one_line_join_that_contradicts_the_manifest_ends_before_anything_is_written(tmp_path, owner, capsys):
    _, manifest = owner
    dht = MemoryDHT()
    publish_manifest(dht, manifest)
    node, builder, _ = _node(tmp_path, dht, {"run": str(manifest.ref)}, lr=1e-3)  # the default, set explicitly
    assert node.run() == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(rf"training\.lr: this node's config says 0\.001 but run {manifest.ref} "
                                              r"\(manifest version 1\) says 0\.0003", err), err
    assert not (tmp_path / "state").exists() and builder.joined_with == {}


def test_a_one_line_join_without_a_peer_to_ask_is_one_line_and_writes_nothing(tmp_path, owner, capsys):
    _, manifest = owner
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "swarm": {"run": str(manifest.ref)}}, "t")
    node = Node(config, hooks=RecordingHooks(ManualClock()), builder=NodeBuilder())
    assert node.run() == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "swarm.initial_peers: run owned@" in err and "--join ADDR" in err, err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("swarm_has", ["readmitting", "excluding", "nothing"])
def test_a_revoked_node_restarts_only_once_a_newer_version_readmits_it(tmp_path, owner, capsys, swarm_has):
    """The version a revoked node kept revokes it; only the swarm can say whether a newer one
    (run update --unrevoke) readmits it: asked first, and the node trains, or ends with one line."""
    key, manifest = owner
    state = tmp_path / "state"
    state.mkdir()
    ensure_identity(identity_path(state))
    own = peer_id_of_identity(identity_path(state))
    v2 = _next(manifest, key, policy="invite")
    v3 = _next(v2, key, revoked=(own,))
    (tmp_path / "manifest.toml").write_text(v2.to_toml())
    ManifestStore(state, manifest.ref).save(v3)  # kept when it stopped (exit 78)
    dht = MemoryDHT()
    if swarm_has != "nothing":
        publish_manifest(dht, _next(v3, key, revoked=()) if swarm_has == "readmitting" else v3)
    invite = issue_invite(key, manifest.ref, own, 1)
    node, builder, _ = _node(tmp_path, dht, {"manifest": str(tmp_path / "manifest.toml"), "invite": invite,
                                             "initial_peers": ["/ip4/127.0.0.1/tcp/1/p2p/" + OTHER]}, max_epochs=1)
    code = node.run()
    err = capsys.readouterr().err
    if swarm_has == "readmitting":
        assert code == 0, err
        assert node.latest.status().manifest_version == 4 and ManifestStore(state, manifest.ref).load().version == 4
        return
    assert code == 78 and err.count("\n") == 1, err
    assert re.search(rf"this node \({own}\) was banned or its invite revoked in run owned@\w+ \(manifest version 3",
                     err), err
    if swarm_has == "nothing":
        assert "no newer version that readmits it came from the swarm" in err, err
    assert builder.joined_with == {}


def test_a_node_whose_invite_expires_is_warned_once_ahead_and_stops_at_expiry(tmp_path, owner, capsys, caplog):
    """Its peers refuse an expired invite: it used to train on alone, unseen. The wall clock is the test's."""
    caplog.set_level("INFO")
    key, manifest = owner
    state = tmp_path / "state"
    state.mkdir()
    ensure_identity(identity_path(state))
    own = peer_id_of_identity(identity_path(state))
    (tmp_path / "manifest.toml").write_text(_next(manifest, key, policy="invite").to_toml())
    issued = time.time()
    invite = issue_invite(key, manifest.ref, own, 1, now=issued)  # 1 day: warned 2.4 hours ahead
    expires = int(issued) + 86400
    wall = [issued]

    def on_step(step: int) -> None:
        wall[0] = {3: expires - 3 * 3600, 6: expires - 2 * 3600, 9: expires - 3600, 12: expires + 1}.get(step, wall[0])
        if step == 20 * STEPS_PER_EPOCH:
            node.request_stop("the invite never expired")

    node, builder, _ = _node(tmp_path, MemoryDHT(), {"manifest": str(tmp_path / "manifest.toml"), "invite": invite},
                             on_step=on_step)
    node.wall_clock = lambda: wall[0]
    assert node.latest.status().invite_expires_at == 0.0
    assert node.run() == 78
    err = capsys.readouterr().err
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires))
    assert err == (f"p2ptrain: swarm.invite: this node's invite to run {manifest.ref} expired on {until}; its peers "
                   f"refuse it from now on: ask the run's owner for a new one (p2ptrain run invite {manifest.ref} "
                   f"{SELF}), put it in swarm.invite and start the node again\n")
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "expires on" in r.getMessage()]
    assert warnings == [f"swarm.invite: this node's invite to run {manifest.ref} expires on {until} (in 2.0 hours), "
                        f"and then the node stops: ask the run's owner for a new one (p2ptrain run invite "
                        f"{manifest.ref} {SELF}), put it in swarm.invite and start the node again"], warnings
    assert builder.parts.checkpoints == 1  # stopped cleanly
    assert node.latest.status().invite_expires_at == expires


@pytest.mark.parametrize("trusted", [False, True])
def test_a_manifest_naming_task_code_is_refused_with_exit_65_unless_trusted(tmp_path, owner, capsys, trusted):
    key, manifest = owner
    with_code = _next(manifest, key, task={**manifest.task, "entrypoint": "not_installed_task:build"})
    path = tmp_path / "manifest.toml"
    path.write_text(with_code.to_toml())
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "api": {"enabled": False},
                           "swarm": {"manifest": str(path)}, "training": {"max_epochs": 1}}, "test")
    clock = ManualClock()
    builder = OwnedBuilder(clock, MemoryDHT())
    node = Node(config, hooks=RecordingHooks(clock), builder=builder, clock=clock,  # type: ignore[arg-type]
                set_threads=lambda n: None, paused_wait=0.0, trust_task_code=trusted)
    if trusted:  # past the check: the fake builder never imports it, and the fake run ends as usual
        assert node.run() == 0
        assert builder.built_with["config"].task.entrypoint == "not_installed_task:build"
        return
    assert node.run() == 65
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'not_installed_task:build'" in err and "--trust-task-code" in err, err
    assert not (tmp_path / "state").exists()  # refused before anything is written


def test_the_node_s_own_entrypoint_in_the_manifest_needs_no_trust_flag(tmp_path, owner):
    key, manifest = owner
    with_code = _next(manifest, key, task={**manifest.task, "entrypoint": "own_task:build"})
    path = tmp_path / "manifest.toml"
    path.write_text(with_code.to_toml())
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "api": {"enabled": False},
                           "swarm": {"manifest": str(path)}, "task": {"entrypoint": "own_task:build"},
                           "training": {"max_epochs": 1}}, "test")
    clock = ManualClock()
    builder = OwnedBuilder(clock, MemoryDHT())
    node = Node(config, hooks=RecordingHooks(clock), builder=builder, clock=clock,  # type: ignore[arg-type]
                set_threads=lambda n: None, paused_wait=0.0)
    assert node.run() == 0
    assert builder.built_with["config"].task.entrypoint == "own_task:build"
