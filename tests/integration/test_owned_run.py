"""Owned runs end to end: real ``p2ptrain run`` nodes on 127.0.0.1 following an owner-signed manifest.

A volunteer with an empty [task]/[training] joins with ``--join ADDR --run REF`` and trains with the
owner's settings, and one whose config contradicts the manifest ends before writing anything;
forged manifests and fingerprint entries are refused and counted; a manifest update (``p2ptrain
run update``) reaches running nodes; in an invite run a stranger with the right run id and model
is refused by the DHT (never reaching the averagers) while an invited node joins, and a revoked
peer is dropped and stops with exit 78; the averagers refuse a peer the gate does not admit; bad
manifests and invites end the node with one line and exit 78 before anything is written.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import hivemind
import pytest
import torch
from hivemind.averaging.averager import DecentralizedAverager
from hivemind.utils import get_dht_time

from p2ptrain.averaging.hardened import HardenedAverager
from p2ptrain.cli.main import main
from p2ptrain.config.schema import EX_CONFIG, TaskSection, TrainingSection
from p2ptrain.dhtkeys import fingerprint_key, manifest_key
from p2ptrain.local.run import create_local_run
from p2ptrain.local.swarm import LocalNode, local_node_config
from p2ptrain.run.manifest import LOCAL_TRAINING, new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.status import SwarmView
from p2ptrain.trust.admission import AdmissionGate
from p2ptrain.waiting import wait_until
from tests.integration.conftest import FAST_TRAINING, TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

RUN_SETTINGS = {"task": TINY_TASK, "training": {**FAST_TRAINING, "lr": 2e-3}}
LOOPBACK_DHT = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False,
                "check_if_identity_free": False}


def _owner_node(make_node, run, **swarm) -> LocalNode:
    """The owner's node: the manifest file, and (invite runs) its own invite."""
    node = make_node("owner", owned=True, args=("--run", str(run.ref), "--manifest", str(run.manifest_path)),
                     training={"validate_every": 5.0})
    if run.manifest.policy == "invite":
        node.overrides = {**node.overrides, "swarm": {"invite": run.invite(node.peer_id()), **swarm}}
    return node


def _figure(node: LocalNode, name: str) -> int:
    status = node.status()
    return getattr(status, name) if status is not None else 0


def test_one_line_join_forgeries_refused_and_a_live_update(make_node, tmp_path, capsys):
    run = create_local_run(tmp_path / "run", "openrun", RUN_SETTINGS)
    owner = _owner_node(make_node, run)
    owner.start()
    join = owner.join_addrs()[:1]
    volunteer = make_node("volunteer", owned=True, args=("--run", str(run.ref)))
    volunteer.start(join=join)
    own = tomllib.loads(volunteer.config_path.read_text())  # only local matters in its config
    assert "task" not in own and set(own.get("training", {})) <= set(LOCAL_TRAINING), own

    # A one-line join whose config contradicts the manifest (the default lr, set explicitly) ends
    # before it writes anything, and says where the other value came from.
    contrary = _run_node(tmp_path / "contrary", "--join", join[0], "--run", str(run.ref),
                         config="[training]\nlr = 0.001\n")
    last = contrary.stderr.strip().splitlines()[-1]
    assert contrary.returncode == EX_CONFIG and "Traceback" not in contrary.stderr, contrary.stderr
    assert re.search(rf"^p2ptrain: config error: training\.lr: this node's config says 0\.001 but run "
                     rf"{re.escape(str(run.ref))} \(manifest version 1\) says 0\.002", last), contrary.stderr
    assert not (tmp_path / "contrary" / "state").exists()

    status = volunteer.wait_for(lambda s: s.state == "training" and s.averaging_rounds_ok_total >= 1, 120,
                                "a round with the owner")
    assert (status.run_ref, status.manifest_version, status.admission_policy) == (str(run.ref), 1, "open")
    assert status.manifest_fingerprint == status.model_fingerprint == run.manifest.fingerprint
    assert status.run_id == run.ref.run_id and status.target_batch_size == FAST_TRAINING["target_batch_size"]

    assert main(["run", "show", str(run.ref), "--join", join[0]]) == 0  # from the live swarm
    assert "version      1" in capsys.readouterr().out

    forger_key = OwnerKey.generate()
    forged = dataclasses.replace(new_manifest(forger_key, "openrun", TaskSection(**TINY_TASK), TrainingSection(lr=9.0)),
                                 version=99).signed(forger_key)
    forger = hivemind.DHT(start=True, initial_peers=join, **LOOPBACK_DHT)
    try:
        forger.store(manifest_key(run.ref.run_id), forged.to_toml().encode(), get_dht_time() + 60, subkey="99:forged")
        forger.store(fingerprint_key(run.ref.run_id), 1.0, get_dht_time() + 60, subkey="ffffffffffffffff")
        nodes = (owner, volunteer)
        wait_until(lambda: sum(_figure(n, "run_entries_refused_total") for n in nodes) >= 1
                   and sum(_figure(n, "fingerprint_entries_refused_total") for n in nodes) >= 1, 30,
                   "the forged entries refused and counted")
    finally:
        forger.shutdown()
    assert all(n.status().manifest_version == 1 and n.status().state == "training" for n in nodes)

    assert main(["run", "update", str(run.manifest_path), "--set", "training.lr=5e-4"]) == 0
    applied = f"run {run.ref}: applied manifest version 2 at epoch"
    for node in nodes:
        node.wait_for(lambda s: s.manifest_version == 2, 60, "manifest version 2")
        wait_until(lambda node=node: applied in node.log_path.read_text(), 30, "version 2 applied")
    assert "training.lr 0.002 -> 0.0005; applied at the next epoch boundary" in volunteer.log_path.read_text()
    assert volunteer.status().state == "training"


@pytest.mark.timeout(240)
def test_the_owner_s_workflow_init_start_update_restart(make_node, tmp_path):
    """As the README has it: a node config with the run's settings, run init --from-config, the first
    node started with the config init wrote, updates of settings that config had (one applied live,
    one by the restart its exit 75 asks for), and the restarted node trains with the new version."""
    source = tmp_path / "node.toml"
    source.write_text(local_node_config(tmp_path / "own" / "state", "before-the-run", {
        "task": TINY_TASK, "training": {**RUN_SETTINGS["training"], "validate_every": 5.0}}))
    assert main(["run", "init", "own", "--from-config", str(source), "--dir", str(tmp_path / "own"),
                 "--fingerprint", "none"]) == 0
    manifest = tmp_path / "own" / "manifest.toml"
    owner = make_node("own", owned=True)  # its config: the one run init wrote, own/node.toml
    written = tomllib.loads(owner.config_path.read_text())  # the run's settings live in its manifest only
    assert "task" not in written and "lr" not in written.get("training", {}), owner.config_path.read_text()
    owner.start()
    owner.wait_for(lambda s: s.state == "training" and s.manifest_version == 1, 120, "training with version 1")

    assert main(["run", "update", str(manifest), "--set", "training.lr=3e-4"]) == 0
    owner.wait_for(lambda s: s.manifest_version == 2, 60, "manifest version 2")
    wait_until(lambda: "applied manifest version 2 at epoch" in owner.log_path.read_text(), 60, "the lr applied")
    assert main(["run", "update", str(manifest), "--set", "training.batch_size=4"]) == 0
    assert owner.wait(90) == 75, owner.report()
    assert "training.batch_size 8 -> 4 (needs a restart)" in owner.log_path.read_text()

    owner.start()  # what systemd does after exit 75
    status = owner.wait_for(lambda s: s.state == "training" and s.local_epoch >= 1, 120, "training after restart")
    assert status.manifest_version == 3 and owner.running
    log = owner.log_path.read_text()
    assert "config error" not in log and "this node's config says" not in log, owner.report()


# Three nodes in turn, each phase with its own deadline and message: the cap sits well above the
# phases' sum on a loaded machine, so a slow run fails in the phase that was slow, not in teardown.
@pytest.mark.timeout(300)
def test_invite_run_refuses_a_stranger_admits_the_invited_and_drops_the_revoked(make_node, tmp_path):
    run = create_local_run(tmp_path / "run", "private", RUN_SETTINGS, policy="invite")
    owner = _owner_node(make_node, run)
    owner.start()
    join = owner.join_addrs()[:1]
    invited = make_node("invited", owned=True, args=("--run", str(run.ref)))
    invited.overrides = {"swarm": {"invite": run.invite(invited.peer_id())}}
    invited.start(join=join)
    invited.wait_for(lambda s: s.state == "training" and s.averaging_rounds_ok_total >= 1, 120,
                     "a round with the owner")
    invited_id = invited.status().peer_id
    assert owner.status().admission_policy == "invite"
    averaging_refused_before = owner.status().averaging_refused_total

    # Right run id, right model and settings, but no invite: its DHT requests go unanswered.
    stranger = make_node("stranger", run_id=run.ref.run_id, task=TINY_TASK, training=RUN_SETTINGS["training"],
                         swarm={"bootstrap_timeout": 10.0})
    stranger_id = stranger.peer_id()
    stranger.start(join=join)
    assert stranger.wait(90) == 1, stranger.report()
    log = stranger.log_path.read_text()
    assert re.search(r"p2ptrain: no initial peer answered our DHT requests after \d+ attempts in 10s", log), log
    assert "SYNCING" not in log and "downloaded" not in log and "Traceback" not in log
    # Counted in the owner's DHT process; on a loaded machine a ping may also time out before it arrives.
    status = owner.wait_for(lambda s: s.dht_requests_refused_total >= 1, 30, "the stranger's requests refused")
    assert status.peers_online == 2 and status.last_round_group_size <= 2, status
    # Refused at the DHT, named once, and so never near the averagers: they refused nobody meanwhile.
    assert f"refusing DHT requests of peer {stranger_id} in invite run {run.ref}" in owner.log_path.read_text()
    assert status.averaging_refused_total == averaging_refused_before
    assert {p.peer_id for p in (owner.peers() or SwarmView()).peers} <= {status.peer_id, invited_id}

    refused_before = owner.status().dht_requests_refused_total
    assert main(["run", "update", str(run.manifest_path), "--revoke", invited_id]) == 0
    owner.wait_for(lambda s: s.manifest_version == 2, 60, "manifest version 2")
    # The revoked peer leaves the owner's swarm view, what it asks is refused (but for the manifest
    # that revoked it), and it stops for good.
    wait_until(lambda: invited_id not in {p.peer_id for p in (owner.peers() or SwarmView()).peers}, 10,
               "the revoked peer out of the swarm view")
    owner.wait_for(lambda s: s.dht_requests_refused_total > refused_before, 60, "the revoked peer refused")
    assert invited.wait(60) == EX_CONFIG, invited.report()
    assert (f"run {run.ref} (manifest version 2): this node ({invited_id}) was banned or its invite revoked"
            in invited.log_path.read_text())
    assert owner.status().state == "training"


def test_averagers_refuse_a_peer_the_gate_does_not_admit(tmp_path):
    """Checked directly on the averagers (ours, without the peer checks, against hivemind's own): no
    state served, no group formed, until admitted."""
    first = hivemind.DHT(start=True, **LOOPBACK_DHT)
    second = hivemind.DHT(start=True, initial_peers=[str(a) for a in first.get_visible_maddrs()], **LOOPBACK_DHT)
    gate = AdmissionGate("open")
    gate.update("open", (), [str(second.peer_id)])  # banned
    options = dict(prefix="gated", start=True, target_group_size=2, min_matchmaking_time=2.0, request_timeout=1.0)
    averagers = []
    try:
        guarded = HardenedAverager([torch.ones(4)], first, admission=gate, peer_checks=False, **options)
        averagers.append(guarded)
        outsider = DecentralizedAverager([torch.zeros(4)], second, **options)
        averagers.append(outsider)
        time.sleep(2.0)  # the guarded averager declares itself as a state donor
        assert outsider.load_state_from_peers(timeout=5.0) is None
        assert gate.refused_total >= 1
        started = gate.refused_total
        step = guarded.step(wait=False, timeout=6.0)
        with pytest.raises(Exception, match="could not find a group"):  # only the two of them, and one refuses
            outsider.step(timeout=6.0)
        with pytest.raises(Exception, match="could not find a group"):
            step.result(timeout=15.0)
        assert gate.refused_total > started

        gate.update("open", (), ())  # unbanned
        loaded = outsider.load_state_from_peers(timeout=5.0)
        assert loaded is not None and torch.equal(loaded[1][0], torch.ones(4))
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in (second, first):
            dht.shutdown()


def _run_node(tmp_path: Path, *flags: str, config: str = "") -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n{config}')
    return subprocess.run([sys.executable, "-m", "p2ptrain.cli", "run", "--config", str(path), *flags],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_a_tampered_manifest_or_a_wrong_invite_is_one_line_exit_78_and_nothing_written(tmp_path):
    run = create_local_run(tmp_path / "run", "strict", RUN_SETTINGS, fingerprint="none")
    tampered = tmp_path / "tampered.toml"
    tampered.write_text(run.manifest_path.read_text().replace("lr = 0.002", "lr = 0.003"))
    result = _run_node(tmp_path, "--manifest", str(tampered))
    assert result.returncode == EX_CONFIG, result.stderr
    assert result.stderr.count("\n") == 1 and "signature does not verify" in result.stderr, result.stderr
    assert not (tmp_path / "state").exists()

    private = create_local_run(tmp_path / "private", "strict", RUN_SETTINGS, policy="invite", fingerprint="none")
    invite = private.invite("QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3")
    result = _run_node(tmp_path, "--manifest", str(private.manifest_path),
                       config=f'[swarm]\ninvite = "{invite}"\n')
    assert result.returncode == EX_CONFIG, result.stderr
    assert result.stderr.count("\n") == 1 and "has no identity yet" in result.stderr, result.stderr
    assert not (tmp_path / "state").exists()
