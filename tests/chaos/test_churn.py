"""Scenario 1 - churn: nodes are killed (SIGKILL / SIGTERM) and replaced every few seconds.

The swarm must never stall longer than two averaging timeouts, the global epoch only goes up,
and the survivors end with finite parameters that agree.  The anchor node (never killed, it is
everyone's bootstrap peer) has its RSS (node + helpers) sampled over the whole run, and must not
grow by more than ``RSS_GROWTH_BOUND_MIB`` between the first and the last third of it.

The CI run churns for ``P2PTRAIN_CHURN_SECONDS`` (40); the soak (``pytest -m soak``) for
``P2PTRAIN_SOAK_SECONDS`` (900), which is where a slow leak would show.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

from p2ptrain.config.schema import NodeConfig
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.tasks.loader import build_task
from tests.chaos.conftest import AVERAGING_TIMEOUT, TINY_TASK
from tests.chaos.helpers import rss_bytes, statuses, training

CHURN_SECONDS = float(os.environ.get("P2PTRAIN_CHURN_SECONDS", "40"))
SOAK_SECONDS = float(os.environ.get("P2PTRAIN_SOAK_SECONDS", "900"))
CHURN_EVERY = 10.0
SWARM_SIZE = 4
#: Epochs between the swarm's parameter averages, which heal the drift of partial rounds; the test
#: ends just after the first one the last newcomer takes part in, so it is shorter than the default.
REPAIR_EVERY = 4
#: Mean RSS of the last third of the run minus that of the first third (node + p2pd + helpers).
RSS_GROWTH_BOUND_MIB = 64.0


def _final_params(node):
    loaded = CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest()
    assert loaded is not None, f"{node.name} wrote no checkpoint:\n{node.report()}"
    return loaded.state


@pytest.mark.chaos
@pytest.mark.timeout(CHURN_SECONDS + 360)
def test_churn_keeps_training_and_replicas_agree(make_node, chaos_report):
    run_churn(make_node, chaos_report, "1_churn", CHURN_SECONDS)


@pytest.mark.soak
@pytest.mark.timeout(SOAK_SECONDS + 360)
def test_churn_soak_keeps_memory_flat(make_node, chaos_report):
    run_churn(make_node, chaos_report, "1_churn_soak", SOAK_SECONDS)


def run_churn(make_node, chaos_report, scenario: str, churn_seconds: float) -> None:
    seed = int(os.environ.get("P2PTRAIN_CHAOS_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    def make_churn_node(name: str):
        return make_node(name, training={"average_state_every": REPAIR_EVERY})

    anchor = make_churn_node("anchor")
    anchor.start()
    addrs = anchor.join_addrs()[:1]
    others = [make_churn_node(f"n{i}") for i in range(SWARM_SIZE - 1)]
    for node in others:
        node.start(join=addrs)
    for node in [anchor, *others]:
        training(node, 120)

    started = time.monotonic()
    alive = list(others)
    serial = SWARM_SIZE - 1
    kills = {"SIGKILL": 0, "SIGTERM": 0}
    recover: list[float] = []
    pending_kill: float | None = None
    swarm_epoch, last_advance = 0, started
    max_stall = 0.0
    epoch_regressions = 0
    seen_epoch: dict[str, int] = {}
    rss: list[tuple[float, float]] = []
    samples_lost: list[int] = []
    epoch_start_samples: dict[str, tuple[int, int]] = {}
    next_churn = started + CHURN_EVERY
    while time.monotonic() - started < churn_seconds:
        now = time.monotonic()
        found = statuses([anchor, *alive])
        for name, status in found.items():
            if status.local_epoch < seen_epoch.get(name, 0):
                epoch_regressions += 1
            seen_epoch[name] = max(seen_epoch.get(name, 0), status.local_epoch)
            previous = epoch_start_samples.get(name)
            if previous is None or previous[0] != status.local_epoch:
                epoch_start_samples[name] = (status.local_epoch, status.samples_processed_total)
        current = max((s.local_epoch for s in found.values()), default=swarm_epoch)
        if current > swarm_epoch:
            swarm_epoch, last_advance = current, now
            if pending_kill is not None:
                recover.append(now - pending_kill)
                pending_kill = None
        max_stall = max(max_stall, now - last_advance)
        rss.append((round(now - started, 1), round(rss_bytes(anchor.process.pid) / 2**20, 1)))
        if now >= next_churn:
            victim = rng.choice(alive)
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            last = found.get(victim.name)
            if last is not None and sig == signal.SIGKILL:
                # What the victim trained since its last epoch boundary was never averaged: lost.
                begin = epoch_start_samples.get(victim.name, (0, last.samples_processed_total))[1]
                samples_lost.append(last.samples_processed_total - begin)
            if sig == signal.SIGKILL:
                victim.kill()
            else:
                victim.signal(sig)
            kills[sig.name] += 1
            pending_kill = pending_kill or now
            alive.remove(victim)
            newcomer = make_churn_node(f"n{serial}")
            serial += 1
            join = addrs + [a for n in alive for a in (found[n.name].visible_maddrs[:1] if n.name in found else [])]
            newcomer.start(join=join)
            alive.append(newcomer)
            next_churn = now + CHURN_EVERY
        time.sleep(1.0)

    # Let the last newcomer finish joining, then stop everyone right after the same epoch.
    for node in alive:
        training(node, 120)
    for node in [anchor, *alive]:
        assert node.running, f"{node.name} died:\n{node.report()}"
    # Partial rounds during the churn leave the replicas apart; every REPAIR_EVERY epochs the swarm
    # averages parameters, which heals that drift.  Stop just after the first such repair that the
    # last newcomer takes part in.
    soon = max(s.local_epoch for s in statuses([anchor, *alive]).values()) + 3
    stop_epoch = (soon // REPAIR_EVERY + 1) * REPAIR_EVERY + 2
    for node in [anchor, *alive]:
        node.overrides = {**node.overrides, "training": {**node.overrides["training"], "max_epochs": stop_epoch}}
        node.write_config()
        node.signal(signal.SIGHUP)
    for node in [anchor, *alive]:
        assert node.wait(120) == 0, node.report()
    states = {node.name: _final_params(node) for node in [anchor, *alive]}
    initial = build_task(NodeConfig(task=TINY_TASK).task, NodeConfig().training, peer_seed=0).model.state_dict()
    worst_ratio = 0.0
    reference = states[anchor.name]["model"]
    for name, state in states.items():
        assert state["epoch"] >= stop_epoch - 1, (name, state["epoch"], stop_epoch)
        for key, tensor in state["model"].items():
            assert torch.isfinite(tensor).all(), f"{name}.{key} is not finite"
            travelled = float((reference[key] - initial[key]).norm())
            apart = float((tensor - reference[key]).norm())
            worst_ratio = max(worst_ratio, apart / max(travelled, 1e-12))
    rss_values = [value for _, value in rss]
    first_third = rss_values[: max(1, len(rss_values) // 3)]
    last_third = rss_values[-max(1, len(rss_values) // 3):]
    rss_growth = sum(last_third) / len(last_third) - sum(first_third) / len(first_third)
    chaos_report.record(
        scenario, seed=seed, churn_seconds=churn_seconds, swarm_size=SWARM_SIZE, kills=kills,
        joins=serial - (SWARM_SIZE - 1), max_stall_seconds=round(max_stall, 1),
        stall_bound_seconds=2 * AVERAGING_TIMEOUT, recover_seconds=[round(r, 1) for r in recover],
        epoch_regressions=epoch_regressions, epochs_during_churn=swarm_epoch, final_epoch=stop_epoch,
        samples_lost_per_sigkill=samples_lost, replica_spread_ratio=round(worst_ratio, 4),
        anchor_rss_mib=rss, anchor_rss_growth_mib=round(rss_growth, 1),
    )
    assert epoch_regressions == 0
    assert max_stall <= 2 * AVERAGING_TIMEOUT, f"swarm stalled {max_stall:.1f}s"
    assert worst_ratio <= 0.25, f"replicas {worst_ratio:.3f} of the distance travelled apart"
    assert rss_growth <= RSS_GROWTH_BOUND_MIB, f"anchor RSS grew {rss_growth:.1f} MiB over the run"
