"""A node's owned-run plan (before the DHT starts) and keeper (after), against an in-memory DHT."""

from __future__ import annotations

import dataclasses
import re
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from p2ptrain.config.schema import ConfigError, TaskSection, TrainingSection, parse_config
from p2ptrain.dhtkeys import manifest_key, members_key
from p2ptrain.run.invite import issue_invite
from p2ptrain.run.manifest import new_manifest, read_manifest_file
from p2ptrain.run.manifest_store import ManifestStore
from p2ptrain.run.owner import OwnerKey
from p2ptrain.swarm.identity import ensure_identity, peer_id_of_identity
from p2ptrain.swarm.manifest_source import SourceUnavailable, fetch_before_join
from p2ptrain.swarm.ownedrun import RunKeeper, apply_run_flags, prepare_run
from p2ptrain.swarm.run_entries import publish_manifest

OTHER = "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"
NOW = 1_800_000_000.0
LATER = NOW + 2 * 86400


class MemoryDHT:
    """hivemind.DHT's store/get/run_coroutine over a dict, answering at once."""

    def __init__(self) -> None:
        self.data: dict[str, dict[Any, Any]] = {}
        self.gets = 0
        self.coroutines: list[Any] = []

    @staticmethod
    def _done(value: Any) -> Future:
        future: Future = Future()
        future.set_result(value)
        return future

    def store(self, key, value, expiration_time, subkey=None, return_future=False):
        self.data.setdefault(key, {})[subkey] = SimpleNamespace(value=value, expiration_time=expiration_time)
        return self._done(True) if return_future else True

    def get(self, key, latest=False, return_future=False):
        self.gets += 1
        found = SimpleNamespace(value=dict(self.data[key])) if key in self.data else None
        return self._done(found) if return_future else found

    def run_coroutine(self, coro, return_future=False):
        self.coroutines.append(coro)
        return 0


@pytest.fixture(scope="module")
def owner():
    key = OwnerKey.generate()
    return key, new_manifest(key, "owned", TaskSection(d_model=64), TrainingSection(lr=3e-4))


def _write(tmp_path: Path, manifest) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(manifest.to_toml())
    return path


def _config(tmp_path: Path, **swarm) -> Any:
    return parse_config({"node": {"state_dir": str(tmp_path / "state")},
                         "swarm": {k: str(v) for k, v in swarm.items()}}, "node.toml")


def test_plain_runs_have_no_plan(tmp_path):
    assert prepare_run(_config(tmp_path), tmp_path / "id.key") is None


def test_manifest_file_gives_the_merged_config(tmp_path, owner):
    _, manifest = owner
    plan = prepare_run(_config(tmp_path, manifest=_write(tmp_path, manifest)), tmp_path / "id.key")
    assert plan is not None and plan.ref == manifest.ref and plan.manifest == manifest
    assert plan.config.task.d_model == 64 and plan.config.training.lr == 3e-4
    assert plan.config.swarm.run_id == manifest.ref.run_id and plan.authorizer is None
    assert plan.dht_kwargs() == {} and plan.gate.policy == "open" and len(plan.validators) == 1


def test_reference_only_sets_the_run_id_and_waits_for_the_swarm(tmp_path, owner):
    _, manifest = owner
    plan = prepare_run(_config(tmp_path, run=manifest.ref), tmp_path / "id.key")
    assert plan.manifest is None and plan.config.swarm.run_id == manifest.ref.run_id
    assert plan.config.task.d_model == 128  # merged once the manifest arrives


@pytest.mark.parametrize("case", ["other-run", "invite-only", "open-with-invite", "expired", "wrong-peer",
                                  "no-identity", "run-id", "invite-without-run"])
def test_bad_combinations_are_one_line_and_write_nothing(tmp_path, owner, case):
    key, manifest = owner
    identity = tmp_path / "identity" / "id.key"
    identity.parent.mkdir()
    ensure_identity(identity)
    me = peer_id_of_identity(identity)
    private = dataclasses.replace(manifest, policy="invite").signed(key)
    swarm: dict[str, Any]
    if case == "other-run":
        other = OwnerKey.generate().ref("owned")
        swarm, message = {"run": other, "manifest": _write(tmp_path, manifest)}, r"is the manifest of run owned@"
    elif case == "invite-only":
        swarm, message = {"manifest": _write(tmp_path, private)}, r"^swarm\.invite: run owned@\w+ .* is invite-only"
    elif case == "open-with-invite":
        swarm = {"manifest": _write(tmp_path, manifest), "invite": issue_invite(key, manifest.ref, me, 1, now=LATER)}
        message = r"^swarm\.invite: run owned@\w+ .* is open to everyone; remove swarm\.invite"
    elif case == "expired":
        swarm = {"manifest": _write(tmp_path, private), "invite": issue_invite(key, manifest.ref, me, 1, now=NOW)}
        message = r"^swarm\.invite: invite for peer \w+ expired on"
    elif case == "wrong-peer":
        swarm = {"run": manifest.ref, "invite": issue_invite(key, manifest.ref, OTHER, 1, now=LATER)}
        message = rf"^swarm\.invite: invite is for peer {OTHER}, not {me}"
    elif case == "no-identity":
        identity = tmp_path / "missing.key"
        swarm = {"run": manifest.ref, "invite": issue_invite(key, manifest.ref, OTHER, 1, now=LATER)}
        message = r"^swarm\.invite: is for peer \w+, but this node has no identity yet"
    elif case == "invite-without-run":  # was a plain run, the invite silently ignored
        swarm = {"invite": issue_invite(key, manifest.ref, me, 1, now=LATER)}
        message = (r"^swarm\.invite: an invite admits a node to an owned run, and this config names none: it needs "
                   r"swarm\.run \(the run's reference; or --run REF\) or swarm\.manifest$")
    else:
        swarm = {"run": manifest.ref, "run_id": "something-else"}
        message = r"^swarm\.run_id: this node's config says 'something-else' but run owned@"
    with pytest.raises(ConfigError, match=message) as caught:
        prepare_run(_config(tmp_path, **swarm), identity, now=LATER)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "state").exists()


def test_invited_node_gets_an_authorizer_and_admits_itself(tmp_path, owner):
    key, manifest = owner
    private = dataclasses.replace(manifest, policy="invite").signed(key)
    identity = tmp_path / "id.key"
    ensure_identity(identity)
    me = peer_id_of_identity(identity)
    plan = prepare_run(_config(tmp_path, manifest=_write(tmp_path, private),
                               invite=issue_invite(key, manifest.ref, me, 1)), identity)
    assert plan.authorizer is not None and plan.dht_kwargs() == {"authorizer": plan.authorizer}
    assert plan.gate.policy == "invite" and plan.gate(me) and not plan.gate(OTHER)


def test_a_version_that_revokes_this_node_is_checked_with_the_swarm_first(tmp_path, owner, capsys):
    """Only a newer version can readmit a revoked node: the plan asks the swarm for one (no manifest
    yet, its own invite not refused), and config check says the node may end there."""
    from p2ptrain.cli.main import main
    from p2ptrain.swarm.identity import identity_path

    key, manifest = owner
    identity = identity_path(tmp_path / "state")
    identity.parent.mkdir()
    ensure_identity(identity)
    me = peer_id_of_identity(identity)
    revoked = dataclasses.replace(manifest, policy="invite", version=2, revoked=(me,)).signed(key)
    invite = issue_invite(key, manifest.ref, me, 1)
    for swarm in ({"manifest": _write(tmp_path, revoked)}, {"run": manifest.ref}):
        if "run" in swarm:
            ManifestStore(tmp_path / "state", manifest.ref).save(revoked)
        plan = prepare_run(_config(tmp_path, invite=invite, **swarm), identity)
        assert plan.manifest is None and plan.authorizer is not None and plan.gate(me)
        assert re.fullmatch(rf"swarm\.invite: this node \({me}\) was banned or its invite revoked in run owned@\w+ "
                            r"\(manifest version 2, file .*\)", plan.excluded_by or ""), plan.excluded_by
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[swarm]\nrun = "{manifest.ref}"\n'
                      f'invite = "{invite}"\n')
    assert main(["config", "check", str(config)]) == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was banned or its invite revoked" in err and "--unrevoke" in err, err


def test_keeper_fetches_merges_follows_updates_and_members(tmp_path, owner):
    key, manifest = owner
    private = dataclasses.replace(manifest, policy="invite").signed(key)
    identity = tmp_path / "id.key"
    ensure_identity(identity)
    me = peer_id_of_identity(identity)
    plan = prepare_run(_config(tmp_path, run=manifest.ref, invite=issue_invite(key, manifest.ref, me, 1)), identity)
    dht, now = MemoryDHT(), [NOW]
    keeper = RunKeeper(plan, dht, clock=lambda: now[0], poll_every=10.0)
    with pytest.raises(SourceUnavailable, match=r"no valid manifest of run owned@\w+ found in the swarm within 0s"):
        keeper.join(threading.Event(), timeout=0.0)

    publish_manifest(dht, private)
    config = keeper.join(threading.Event(), timeout=5.0)
    assert config.task.d_model == 64 and keeper.manifest == private
    assert keeper.status()["manifest_version"] == 1 and keeper.status()["admission_policy"] == "invite"
    keeper.check_fingerprint("0123456789abcdef")  # no fingerprint recorded: nothing to compare

    assert keeper.poll() is None  # publishes and starts lookups
    assert members_key(manifest.ref.run_id) in dht.data  # our own invite, for the others' gates
    dht.store(members_key(manifest.ref.run_id), issue_invite(key, manifest.ref, OTHER, 1, now=NOW), NOW + 60,
              subkey=OTHER)
    v2 = dataclasses.replace(private, version=2, training={**private.training, "lr": 1e-4},
                             revoked=(), fingerprint="0123456789abcdef").signed(key)
    publish_manifest(dht, v2)
    now[0] += 11
    keeper.poll()  # starts the next lookups (the first ones found only version 1 and us)
    offer = keeper.poll()
    assert offer is not None and offer.accepted and offer.change is not None and offer.change.live
    assert plan.gate(OTHER) and plan.gate(me)
    with pytest.raises(ConfigError, match="model fingerprint ffffffffffffffff differs from run owned@"):
        keeper.check_fingerprint("ffffffffffffffff")

    v3 = dataclasses.replace(v2, version=3, revoked=(OTHER,)).signed(key)
    publish_manifest(dht, v3)
    now[0] += 11
    keeper.poll()
    offer = keeper.poll()
    assert offer is not None and offer.change.fields == ["admission.revoked"]
    assert not plan.gate(OTHER) and plan.gate(me)
    told = [c for c in dht.coroutines if getattr(c, "func", None) is not None and c.func.__name__ == "_store_on"]
    assert len(told) == 1 and told[0].args[0] == [OTHER]  # handed the manifest that revokes it, once
    keeper._refresh_gate()
    assert len([c for c in dht.coroutines if getattr(c, "func", None) is not None
                and c.func.__name__ == "_store_on"]) == 1


def test_command_line_flags_win_over_the_config(tmp_path, owner):
    _, manifest = owner
    config = _config(tmp_path, run="other@" + "a" * 26)
    flagged = apply_run_flags(config, str(manifest.ref), tmp_path / "m.toml")
    assert flagged.swarm.run == str(manifest.ref) and flagged.swarm.manifest == tmp_path / "m.toml"
    assert apply_run_flags(config, None, None) is config
    with pytest.raises(ConfigError, match=r"^--run: not a run reference: 'nope'"):
        apply_run_flags(config, "nope", None)


def test_the_owner_s_node_takes_up_an_updated_manifest_file_and_publishes_it(tmp_path, owner, caplog):
    key, manifest = owner
    path = _write(tmp_path, manifest)
    plan = prepare_run(_config(tmp_path, manifest=path), tmp_path / "id.key")
    dht, now = MemoryDHT(), [NOW]
    keeper = RunKeeper(plan, dht, clock=lambda: now[0], poll_every=10.0)
    keeper.join(threading.Event(), timeout=1.0)
    assert keeper.poll() is None and keeper.status()["manifest_version"] == 1

    path.with_name("bad.toml").write_text(manifest.to_toml().replace("lr = 0.0003", "lr = 0.3"))
    path.with_name("bad.toml").replace(path)  # a hand-edited file: refused, the running version kept
    now[0] += 11
    assert keeper.poll() is None and keeper.status()["manifest_version"] == 1
    assert keeper.status()["manifests_ignored_total"] == 1
    assert "keeping manifest version 1: manifest" in caplog.text

    v2 = dataclasses.replace(manifest, version=2, training={**manifest.training, "lr": 1e-4}, banned=(OTHER,))
    path.with_name("v2.toml").write_text(v2.signed(key).to_toml())
    path.with_name("v2.toml").replace(path)  # what p2ptrain run update does
    now[0] += 11
    offer = keeper.poll()
    assert offer is not None and offer.change is not None and "training.lr" in offer.change.fields
    assert keeper.is_excluded(OTHER) and not plan.gate(OTHER)
    keeper.poll()  # published on the next pass, not after the usual re-publish period
    entries = dht.data[manifest_key(manifest.ref.run_id)]
    assert any(subkey.startswith("2:") for subkey in entries)


def test_status_counts_every_kind_of_refusal(tmp_path, owner):
    _, manifest = owner
    plan = prepare_run(_config(tmp_path, manifest=_write(tmp_path, manifest)), tmp_path / "id.key")
    validator = plan.validators[0]
    validator.counter.reject("signature", b"forged", b"manifest")
    validator.fingerprint_counter.reject("unbound", b"ffff", b"1")
    plan.gate.count_refusal()
    status = RunKeeper(plan, MemoryDHT()).status()
    assert status["run_entries_refused_total"] == 1 and status["fingerprint_entries_refused_total"] == 1
    assert status["averaging_refused_total"] == 1 and status["dht_requests_refused_total"] == 0
    assert status["run_ref"] == str(manifest.ref) and status["admission_policy"] == "open"


def test_a_reload_compares_only_local_settings_in_an_owned_run(tmp_path, owner):
    from p2ptrain.daemon.reload import reloadable_changes
    from p2ptrain.swarm.ownedrun import keep_run_settings

    _, manifest = owner
    path = _write(tmp_path, manifest)
    running = prepare_run(_config(tmp_path, manifest=path), tmp_path / "id.key").config
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text\n" * 100)
    reread = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "swarm": {"manifest": str(path)},
                           "training": {"threads": 3}, "task": {"data_path": str(corpus)}}, "node.toml")
    applied, needs_restart = reloadable_changes(running, keep_run_settings(reread, running))
    assert applied == ["training.threads"] and needs_restart == ["task.data_path"]


def test_an_invited_newcomer_knows_the_members_before_it_first_averages(tmp_path, owner):
    key, manifest = owner
    private = dataclasses.replace(manifest, policy="invite").signed(key)
    identity = tmp_path / "id.key"
    ensure_identity(identity)
    me = peer_id_of_identity(identity)
    plan = prepare_run(_config(tmp_path, run=manifest.ref, invite=issue_invite(key, manifest.ref, me, 1)), identity)
    dht = MemoryDHT()
    publish_manifest(dht, private)
    dht.store(members_key(manifest.ref.run_id), issue_invite(key, manifest.ref, OTHER, 1), NOW + 60, subkey=OTHER)
    assert not plan.gate(OTHER)
    RunKeeper(plan, dht).join(threading.Event(), timeout=5.0)
    assert plan.gate(OTHER) and plan.gate(me)
    assert me in dht.data[members_key(manifest.ref.run_id)]  # announced at once, for the others' gates


def test_an_outdated_manifest_file_is_not_built_with_when_the_swarm_has_a_newer_version(tmp_path, owner, caplog):
    caplog.set_level("INFO")
    key, manifest = owner
    plan = prepare_run(_config(tmp_path, manifest=_write(tmp_path, manifest)), tmp_path / "id.key")
    v2 = dataclasses.replace(manifest, version=2, task={**manifest.task, "d_model": 32}).signed(key)  # not live
    dht = MemoryDHT()
    publish_manifest(dht, v2)
    keeper = RunKeeper(plan, dht)
    config = keeper.join(threading.Event(), timeout=5.0)
    assert keeper.manifest == v2 and config.task.d_model == 32  # built with v2: no restart to take it up
    assert keeper.poll() is None  # and nothing left to apply
    assert any("the swarm holds a newer manifest than this node started with" in m for m in caplog.messages)


def test_the_newest_accepted_version_outlives_a_restart(tmp_path, owner):
    key, manifest = owner
    path = _write(tmp_path, manifest)
    config = _config(tmp_path, manifest=path)
    (tmp_path / "state").mkdir()
    dht = MemoryDHT()
    keeper = RunKeeper(prepare_run(config, tmp_path / "id.key"), dht, poll_every=0.0)
    keeper.join(threading.Event(), timeout=1.0)
    stored = tmp_path / "state" / f"{manifest.ref.run_id}.manifest.toml"
    assert read_manifest_file(stored, manifest.ref) == manifest  # kept once the node runs
    v2 = dataclasses.replace(manifest, version=2, training={**manifest.training, "lr": 1e-4}).signed(key)
    publish_manifest(dht, v2)
    keeper.poll()
    assert keeper.poll() is not None and read_manifest_file(stored).version == 2
    assert not list((tmp_path / "state").glob(".*.tmp"))

    # Restarted with the same (now outdated) file: version 2 it is, and version 1 is never taken back.
    plan = prepare_run(config, tmp_path / "id.key")
    assert plan.manifest == v2 and plan.config.training.lr == 1e-4
    restarted = RunKeeper(plan, MemoryDHT())
    restarted.join(threading.Event(), timeout=1.0)
    assert not restarted.tracker.offer(manifest).accepted and restarted.manifest == v2
    assert ManifestStore(tmp_path / "state", manifest.ref).save(manifest) is False
    assert read_manifest_file(stored).version == 2


def test_a_stored_manifest_that_does_not_verify_is_ignored_with_a_warning(tmp_path, owner, caplog):
    _, manifest = owner
    state = tmp_path / "state"
    state.mkdir()
    stored = state / f"{manifest.ref.run_id}.manifest.toml"
    stored.write_text(manifest.to_toml().replace("lr = 0.0003", "lr = 0.3"))
    plan = prepare_run(_config(tmp_path, manifest=_write(tmp_path, manifest)), tmp_path / "id.key")
    assert plan.manifest == manifest
    assert "ignoring the stored manifest of run owned@" in caplog.text and "signature does not verify" in caplog.text
    assert ManifestStore(state, manifest.ref).save(manifest) and read_manifest_file(stored) == manifest


def test_the_owner_s_own_node_in_an_invite_run_is_told_how_to_invite_itself(tmp_path, owner):
    key, manifest = owner
    private = dataclasses.replace(manifest, policy="invite").signed(key)
    path = _write(tmp_path, private)
    key.save(tmp_path / "owner.key")  # the run's directory, as p2ptrain run init leaves it
    with pytest.raises(ConfigError, match=rf"^swarm\.invite: run owned@\w+ \(manifest version 1\) is invite-only, its "
                                          rf"owner's nodes too: invite this node with p2ptrain run invite {path} "
                                          r"PEER_ID \(PEER_ID: what p2ptrain run peer-id --config"):
        prepare_run(_config(tmp_path, manifest=path), tmp_path / "id.key")


class _ClockStop:
    """A stop event whose waits advance a fake clock instead of sleeping."""

    def __init__(self) -> None:
        self.now, self.waits = 0.0, []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


@pytest.mark.parametrize("failure", [None, "unreachable", "refused"])
def test_the_one_line_join_retries_joining_and_looking_up_within_the_bootstrap_timeout(owner, failure):
    from hivemind.p2p import P2PDaemonError

    _, manifest = owner
    stop, dht = _ClockStop(), MemoryDHT()
    dht.shutdown = lambda: None

    def factory(**kwargs: Any) -> Any:
        if failure == "unreachable":
            raise P2PDaemonError("failed to connect to bootstrap peers")
        if failure == "refused":
            raise RuntimeError("DHTNode bootstrap failed: none of the initial_peers responded to a ping.")
        return dht

    def fetch() -> Any:
        return fetch_before_join(manifest.ref, ["/ip4/127.0.0.1/tcp/1/p2p/" + OTHER], timeout=8.0, stop=stop,
                                 dht_factory=factory, clock=stop.clock)

    if failure is None:
        dht.get = _counting(dht, publish_at=3, manifest=manifest)
        assert fetch() == manifest
        assert stop.waits == [1.0, 2.0]  # looked up again with backoff until the manifest was there
        return
    with pytest.raises(SourceUnavailable) as caught:
        fetch()
    how = "answered our DHT requests" if failure == "refused" else "answered"
    assert str(caught.value).startswith(f"no initial peer {how} after 5 attempts in 8s (swarm.bootstrap_timeout); "
                                        "tried /ip4/127.0.0.1/tcp/1/p2p/")
    assert ("may be invite-only" in str(caught.value)) == (failure == "refused")
    assert stop.waits == [1.0, 2.0, 4.0, 1.0]  # the last one cut to end at the deadline


def _counting(dht: MemoryDHT, *, publish_at: int, manifest: Any) -> Any:
    """``dht.get`` that finds nothing until its ``publish_at``-th call, when the manifest appears."""
    get = dht.get

    def counted(key, latest=False, return_future=False):
        if dht.gets + 1 == publish_at:
            publish_manifest(dht, manifest)
        return get(key, latest=latest, return_future=return_future)

    return counted


def test_the_one_line_join_names_a_swarm_without_a_manifest(owner):
    _, manifest = owner
    stop, dht = _ClockStop(), MemoryDHT()
    dht.shutdown = lambda: None
    with pytest.raises(SourceUnavailable, match=rf"^no valid manifest of run {re.escape(str(manifest.ref))} found "
                                                r"in the swarm within 8s$"):
        fetch_before_join(manifest.ref, ["/ip4/127.0.0.1/tcp/1/p2p/" + OTHER], timeout=8.0, stop=stop,
                          dht_factory=lambda **kwargs: dht, clock=stop.clock)
    assert dht.gets == 5 and stop.waits == [1.0, 2.0, 4.0, 1.0]
