"""``p2ptrain fetch --join ADDR --run REF OUT`` against a live swarm of two ``p2ptrain run`` nodes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.local.run import create_local_run
from p2ptrain.local.swarm import LOOPBACK_TRAINING
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.model.hfexport import gpt2_to_bytelm
from p2ptrain.model.load import build_model, consensus_weights
from p2ptrain.tasks.bytelm import ByteLM
from tests.integration.conftest import FAST_TRAINING, TINY_TASK
from tests.support.nodeapi import node_client, node_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: How far a downloaded tensor may be from the donor's, by ``training.state_compression`` (the state's
#: wire format): exact without compression, fp16's rounding (relative 2**-11) with it.
STATE_TOLERANCE = {"none": 0.0, "fp16": 2.0**-10}


#: Gradient mode with overlap off: a node's model is its optimizer's parameters (what it serves) right
#: after every step.  DiLoCo: the outer parameters (the agreed model) are served and checkpointed.
MODES = {"gradient": {"overlap": False}, "diloco": {"mode": "diloco", "inner_steps": 4, "inner_batch_size": 8}}


@pytest.mark.parametrize("mode", ["gradient", "diloco"])
def test_fetch_gives_the_state_of_a_node(make_node, tmp_path, mode):
    run = create_local_run(tmp_path / "run", "fetchrun",
                           {"task": TINY_TASK, "training": {**FAST_TRAINING, **MODES[mode]}})
    a = make_node("a", owned=True, args=("--run", str(run.ref), "--manifest", str(run.manifest_path)))
    a.start()
    join = a.join_addrs()[:1]
    b = make_node("b", owned=True, args=("--run", str(run.ref)))
    b.start(join=join)
    for node in (a, b):
        node.wait_for(lambda s: s.state == "training" and s.local_epoch >= 2, 120, "two epochs")
    # A paused node stays in the swarm and serves its state, which no longer changes: one state to compare.
    for node in (a, b):
        assert node_client(node, node_token(node)).request("POST", "/api/v1/control/pause").status == 202
    # Each pauses once its round in flight and the round it scheduled have ended: with the partner
    # pausing too, neither finds a group, and each round ends at its averaging timeout.
    bound = 3 * LOOPBACK_TRAINING["averaging_timeout"] + 10
    paused = {node.name: node.wait_for(lambda s: s.state == "paused", bound, "PAUSED") for node in (a, b)}

    out = tmp_path / "model"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "fetch", "--join", join[0], "--run", str(run.ref),
                           "--timeout", "60", str(out)], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    donor = config["run"]["fetched_from"]
    assert f"from peer {donor}" in done.stdout
    print(f"fetch took {took:.1f}s")
    by_peer = {status.peer_id: name for name, status in paused.items()}
    assert donor in by_peer, (donor, by_peer)
    # The fetcher published nothing: the nodes still see a swarm of two.
    view = a.peers()
    assert view is not None and {p.peer_id for p in view.peers} <= set(by_peer)

    for node in (a, b):
        node.signal(signal.SIGTERM)
    for node in (a, b):
        assert node.wait(60) == 0, node.report()
    source = {"a": a, "b": b}[by_peer[donor]]
    checkpoint = CheckpointStore(source.state_dir / "checkpoints", keep=100).load_latest()
    assert checkpoint is not None
    assert config["run"]["epoch"] == checkpoint.state["epoch"] == paused[source.name].local_epoch

    model = ByteLM(**config["model_args"])
    expected = consensus_weights(model, checkpoint.state)
    fetched = gpt2_to_bytelm(load_file(str(out / "model.safetensors")))  # the export is GPT-2's layout
    initial, _ = build_model(TaskSection(**config["task"]), TrainingSection(seed=config["training"]["seed"]))
    assert any(not torch.equal(value, fetched[name]) for name, value in initial.state_dict().items()), \
        "the fetched model is the initialisation every peer starts from"
    tolerance = STATE_TOLERANCE[run.manifest.training["state_compression"]]
    assert set(fetched) == set(expected)
    for name, tensor in fetched.items():
        assert torch.allclose(tensor, expected[name], rtol=tolerance, atol=0.0), name
    card = (out / "README.md").read_text()
    assert "| downloaded | from the swarm (`p2ptrain fetch`), peer " + donor in card
    # Samples and contributors: what the node it joined through vouches for from its rounds (the nodes
    # averaged with each other), and apart, labelled as claims, what the records claim.
    facts = config["run"]
    assert facts["reported_by"] >= 1 and facts["vouched_by"] == 1, facts
    assert facts["samples"] > 0 and facts["contributors"] >= 1 and facts["samples_claimed"] > 0, facts
    assert "| samples contributed (vouched for) | " in card and "| samples claimed (not vouched for) | " in card


def test_fetch_with_no_swarm_is_exit_69_and_writes_nothing(tmp_path):
    # A port nobody listens on: the join is refused at once, and retried until --timeout.
    addr = "/ip4/127.0.0.1/tcp/9/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"
    out = tmp_path / "model"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "fetch", "--join", addr, "--timeout", "5",
                           str(out)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 69, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"p2ptrain fetch: no peer answered within 5s (--timeout); tried {addr}; nothing written")
    assert "Traceback" not in done.stderr and not out.exists()
    assert time.monotonic() - started < 60  # start-up (torch, hivemind) plus the 5 s, on a loaded machine
