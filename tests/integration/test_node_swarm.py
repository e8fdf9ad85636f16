"""The node end to end: real hivemind peers as separate processes on 127.0.0.1, each with a real CLI."""

from __future__ import annotations

import json
import random
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

from p2ptrain.config.schema import EX_CONFIG, NodeConfig
from p2ptrain.data.assign import owned_shards
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.tasks.loader import build_task
from p2ptrain.waiting import wait_until
from tests.integration.conftest import FAST_TRAINING, TINY_TASK
from tests.support.nodeapi import node_client, node_token
from tests.support.processes import descendants

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _training(node, timeout=90.0):
    return node.wait_for(lambda s: s.state == "training", timeout, "TRAINING state")


def _initial_parameters(task_section: dict | None = None) -> dict[str, torch.Tensor]:
    config = NodeConfig.model_validate({"task": task_section or {}})
    task = build_task(config.task, config.training, peer_seed=0)
    return {name: value.detach().clone() for name, value in task.model.state_dict().items()}


def _jsonl_corpus(root: Path, files: int = 12) -> str:
    """A glob of small JSONL shards (one is held out for validation): a pass takes each node seconds."""
    root.mkdir()
    rng = random.Random(0)
    words = ("def", "return", "self", "value", "index", "shard", "swarm", "peer", "epoch", "round", "sample", "data",
             "node", "train", "model", "loss")
    for i in range(files):
        lines = (json.dumps({"text": " ".join(rng.choice(words) for _ in range(10)), "id": j}) for j in range(30))
        (root / f"part-{i:02d}.jsonl").write_text("\n".join(lines) + "\n")
    return str(root / "*.jsonl")


def _final_checkpoint(node):
    loaded = CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest()
    assert loaded is not None, f"{node.name} wrote no checkpoint:\n{node.report()}"
    return loaded.state


def test_two_nodes_average_and_agree(make_node, tmp_path):
    """Also, on a JSONL glob: the nodes read disjoint shares of a pass, the swarm's coverage of a pass
    reaches 100%, and the samples the nodes report contributed add up to what they trained but the
    round still in flight."""
    task = {**TINY_TASK, "data_path": _jsonl_corpus(tmp_path / "corpus")}
    a, b = make_node("a", task=task), make_node("b", task=task)
    a.start()
    b.start(join=a.join_addrs()[:1])
    for node in (a, b):
        node.wait_for(lambda s: s.averaging_rounds_ok_total >= 3 and s.data_pass >= 1, 150,
                      "three successful averaging rounds and a pass over the data")
    # Coverage, as A's swarm view has it from both nodes' records: some pass read through.
    # The records also carry the swarm's rate (the first may go out before a node has measured its own).
    view = wait_until(lambda: (v := a.peers()) is not None and v.data_last_pass_coverage == 1.0
                      and all(p.samples_contributed > 0 for p in v.peers) and len(v.peers) == 2
                      and v.swarm_samples_per_second > 0 and v, 60,
                      "a pass 100% covered in A's view", interval=1.0, detail=lambda: str(a.peers()))
    assert view.shards_total == 11 and view.samples_contributed == sum(p.samples_contributed for p in view.peers)
    assert view.peers_online == 2
    # B's own view is refreshed on its 5 s record timer, so it may still hold one record here.
    b.wait_for(lambda s: s.last_round_group_size == 2 and s.peers_online == 2, 30, "both nodes in B's view")
    # The relay figures come from each node's p2p daemon: read, and off (relays are off on loopback).
    assert all(node.status().relay_active is False for node in (a, b))
    # Disjoint shares: while both train, each reads only the shards rendezvous hashing gives it.  A pass
    # begun before the other node's record was in view is shared out among the peers seen then (the
    # tiny corpus takes a node through a pass in well under a second): wait for one begun after.
    ids = {node.name: node.status().peer_id for node in (a, b)}
    for node in (a, b):
        begun = node.status().data_pass
        node.wait_for(lambda s, begun=begun: s.data_pass > begun, 90, "a pass begun with both nodes in view")
    for node in (a, b):
        before = node.status().checkpoint_writes_ok_total
        node_client(node, node_token(node)).control("checkpoint")
        node.wait_for(lambda s, before=before: s.checkpoint_writes_ok_total > before, 30, "a checkpoint")
    shard_ids = build_task(NodeConfig.model_validate({"task": task}).task, NodeConfig().training,
                           peer_seed=0).train_batches.shard_ids
    for node in (a, b):
        position = _final_checkpoint(node)["data_position"]
        assert position["pass"] >= 1, position  # pass 0 began before the other node was in view
        mine = set(owned_shards(position["pass"], shard_ids, list(ids.values()), ids[node.name]))
        reading = set(position["done"]) | {shard for shard, _, _ in position["lanes"] if shard}
        assert reading and reading <= mine, (node.name, position["pass"], sorted(reading - mine))
    # Both stop right after the same averaged step: raise max_epochs at run time (SIGHUP reload).
    stop_epoch = max(a.status().local_epoch, b.status().local_epoch) + 3
    for node in (a, b):
        node.overrides = {**node.overrides, "training": {**node.overrides["training"], "max_epochs": stop_epoch}}
        node.write_config()
        node.signal(signal.SIGHUP)
    assert a.wait(90) == 0, a.report()
    assert b.wait(90) == 0, b.report()
    state_a, state_b = _final_checkpoint(a), _final_checkpoint(b)
    assert state_a["epoch"] == state_b["epoch"] == stop_epoch
    initial = _initial_parameters(task)
    for name, tensor in state_a["model"].items():
        assert torch.isfinite(tensor).all(), name
        travelled = (tensor - initial[name]).norm()
        apart = (tensor - state_b["model"][name]).norm()
        # On a loaded machine some all-reduce parts time out (hivemind then averages what arrived)
        # and parameter averaging runs in the background, so replicas are not bit-identical; they
        # must still be far closer to each other than to where training started (independent
        # runs end up further apart than either moved).
        assert apart <= 0.25 * travelled, f"{name}: replicas {apart:.2e} apart after moving {travelled:.2e}"
    # Credit: the samples the nodes report contributed add up to the swarm's: every epoch of the swarm
    # holds at least target_batch_size samples (hivemind's rule), a little more while its peers have
    # not seen the target reached; per node, what trained but is not settled is the round in flight at
    # the stop, the epoch in progress and what each state download threw away (joining, falling behind).
    logs = (a.log_path.read_text(), b.log_path.read_text())
    downloads = sum(log.count("downloaded the swarm's state") + log.count("adopted the state of") for log in logs)
    trained = state_a["samples_processed"] + state_b["samples_processed"]
    contributed = state_a["samples_contributed"] + state_b["samples_contributed"]
    settled = contributed + state_a["samples_not_averaged"] + state_b["samples_not_averaged"]
    target = FAST_TRAINING["target_batch_size"]
    per_round = settled / (stop_epoch - 1)
    assert target <= per_round < 2 * target, (settled, stop_epoch)
    assert 0 <= trained - settled <= (2 + downloads) * per_round, (trained, contributed, settled, per_round,
                                                                    downloads)
    assert contributed >= settled - 2 * per_round, (trained, contributed, settled, per_round)
    assert sorted(state_a["contributors"]) == sorted(ids.values())


def test_sigkill_of_one_node_does_not_stop_the_others(make_node):
    a, b, c = make_node("a"), make_node("b"), make_node("c")
    a.start()
    addrs = a.join_addrs()[:1]
    b.start(join=addrs)
    c.start(join=addrs)
    c.wait_for(lambda s: s.rounds_averaged >= 1, 150, "a round averaged with the others")
    c.kill(whole_tree=False)  # the process only: its helpers must go by themselves (the leak check sees them)
    assert c.wait(10) is not None
    before = a.status().local_epoch
    a.wait_for(lambda s: s.local_epoch >= before + 3, 120, "three more epochs after the kill")
    b.wait_for(lambda s: s.local_epoch >= before + 3, 60, "three more epochs after the kill")


def test_sigterm_checkpoints_and_a_restart_resumes_epoch_and_data_position(make_node):
    a = make_node("a")
    a.start()
    _training(a)
    a.wait_for(lambda s: s.local_epoch >= 2, 90, "epoch 2")
    node_pid = a.process.pid
    started = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.wait(30) == 0, a.report()
    assert time.monotonic() - started < 30
    first = _final_checkpoint(a)
    assert first["epoch"] >= 2
    log = a.log_path.read_text()
    assert "TRAINING -> STOPPING" in log and "checkpoint written" in log
    assert not [pid for pid, cmd in descendants().items() if str(a.workdir) in cmd or "p2pd" in cmd], \
        f"processes left by node {node_pid}"
    # Restarted, it goes on from there and stops by itself three epochs later.
    a.overrides = {"training": {"max_epochs": first["epoch"] + 3}}
    a.write_config()
    a.start()
    resumed = _training(a)
    assert resumed.local_epoch >= first["epoch"]
    assert a.wait(120) == 0, a.report()
    second = _final_checkpoint(a)
    assert second["epoch"] == first["epoch"] + 3
    consumed = second["samples_processed"] - first["samples_processed"]
    position_1, position_2 = first["data_position"], second["data_position"]
    assert position_2["pass"] == position_1["pass"]  # a short run stays inside one pass over the data
    # The stream went on exactly where the checkpoint left it: one window per sequence trained since.
    assert position_2["windows"] - position_1["windows"] == consumed > 0, (position_1, position_2, consumed)
    log = a.log_path.read_text()
    assert "resumed from checkpoint" in log and "starting pass" not in log


def test_node_with_another_model_is_refused(make_node):
    a = make_node("a")
    a.start()
    addrs = a.join_addrs()[:1]
    _training(a)
    other = make_node("other", task={"d_model": 64})
    other.start(join=addrs)
    assert other.wait(90) == EX_CONFIG, other.report()
    log = other.log_path.read_text()
    refusal = [line for line in log.splitlines() if "differs from run" in line]
    assert refusal, log
    fingerprint = a.status().model_fingerprint
    assert fingerprint in refusal[0]
    assert a.status().averaging_rounds_ok_total == 0


def test_sigterm_while_still_joining_is_a_clean_stop(make_node):
    with socket.socket() as probe:  # a port nobody listens on: the initial peer never answers
        probe.bind(("127.0.0.1", 0))
        dead = f"/ip4/127.0.0.1/tcp/{probe.getsockname()[1]}/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"
    a = make_node("a", swarm={"bootstrap_timeout": 120.0})
    a.start(join=[dead])
    wait_until(lambda: "no initial peer answered" in a.log_path.read_text(), 60, "bootstrap retry log line",
               interval=0.5)
    a.signal(signal.SIGTERM)
    assert a.wait(30) == 0, a.report()
    log = a.log_path.read_text()
    assert "stopped before joining the swarm (SIGTERM)" in log and "Traceback" not in log
