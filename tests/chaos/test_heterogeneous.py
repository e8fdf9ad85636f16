"""Scenario 10 - a slow volunteer in DiLoCo: one node held to a quarter of a core next to a full one.

The shared round clock ends every round at the same moment for both, so the slow node takes part
in the rounds (its fewer samples weighted as such) instead of falling behind, and the two models
stay together.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time

import pytest
import torch

from p2ptrain.config.schema import parse_config
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.model.load import consensus_weights
from p2ptrain.tasks.loader import build_task
from p2ptrain.waiting import WaitTimeout, wait_until
from tests.chaos.conftest import TINY_TASK
from tests.chaos.helpers import training

TIMEOUT = 240
#: ``alone``: the slow node's quarter core is a share of a machine nothing else is loading.
pytestmark = [pytest.mark.chaos, pytest.mark.alone, pytest.mark.timeout(TIMEOUT)]
#: What the test's waits may take together: the rest of TIMEOUT is for stopping the nodes, reading
#: their checkpoints and tearing down, so a slow run ends in an assertion naming the wait that ran
#: out rather than in the timeout's kill.
WAITS = TIMEOUT - 45.0

ROUNDS = 5
#: Rounds of 1-2 s on the two-core machine (6,400 sequences at the fast node's 3,000-5,000 a second):
#: well over the slow node's inner step and the matchmaking window.  At 150 inner steps rounds took
#: under half a second once both nodes averaged every round in full, and the slow node could end a
#: round behind the fast one when it stopped.
DILOCO = {"mode": "diloco", "inner_steps": 400, "inner_batch_size": 16, "averaging_timeout": 10.0,
          "validate_every": 600.0}
#: The benchmark (benchmarks/hetero.py) holds the issue's 2% on a real model; the tiny model of
#: the chaos suite ends its last round at a point where a few inner steps weigh more.
MAX_SPREAD = 0.05
#: The two models' distance, as a share of the distance they moved from the initial model.
MAX_APART = 0.5
#: A quarter of one core, as a share of this machine.
QUARTER_CORE_PERCENT = 25.0 / (os.cpu_count() or 1)
#: The line a node logs when it stops: its rounds since it started, by outcome.
RUN_SUMMARY = re.compile(r"averaging this run: \d+ rounds?, (\d+) full, (\d+) partial")
#: Every way a node logs a DiLoCo round that did not average (scheduling, starting, ending alone or
#: late, failing).
FAILED_ROUND = re.compile(r"could not schedule the DiLoCo round|"
                          r"DiLoCo round \d* ?(could not start|never ended|failed|ended alone)")


def _fresh_task():
    """The scenario's task as every node builds it: the same initial model."""
    config = parse_config({"task": TINY_TASK}, "test")
    return build_task(config.task, config.training, peer_seed=0)


def _validation_loss(state: dict) -> float:
    """Of the swarm's model the node holds (DiLoCo: the outer parameters of the last round)."""
    task = _fresh_task()
    task.model.load_state_dict(consensus_weights(task.model, state))
    task.model.eval()
    with torch.no_grad():
        losses = [float(task.loss_fn(task.model, batch)) for batch in task.validation_batches()]
    return sum(losses) / len(losses)


def _apart_over_travelled(states: dict[str, dict]) -> float:
    """How far apart the two swarm models are, as a share of how far the first moved from the initial
    one (all parameters as one vector; replicas that never averaged end about as far apart as they moved)."""
    model = _fresh_task().model
    start = {name: value.detach().clone() for name, value in model.state_dict().items()}
    one, other = (consensus_weights(model, state) for state in states.values())
    names = [name for name, value in start.items() if value.is_floating_point()]
    apart = sum(float((one[n] - other[n]).pow(2).sum()) for n in names) ** 0.5
    travelled = sum(float((one[n] - start[n]).pow(2).sum()) for n in names) ** 0.5
    return apart / travelled


class _Budget:
    """One budget for a test's waits: each gets what is left of it, at most its own bound."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def left(self, bound: float) -> float:
        return max(1.0, min(bound, self.end - time.monotonic()))


def test_a_slow_peer_takes_part_in_the_rounds_and_the_models_agree(make_node, chaos_report):
    budget = _Budget(WAITS)
    fast = make_node("fast", training=DILOCO, volunteer={"max_cpu_percent": 0.0})  # a full peer
    slow = make_node("slow", training=DILOCO, volunteer={"max_cpu_percent": QUARTER_CORE_PERCENT})
    fast.start()
    slow.start(join=fast.join_addrs()[:1])
    for node in (fast, slow):
        training(node, budget.left(60))
    slow.wait_for(lambda s: s.averaging_rounds_ok_total + s.averaging_rounds_partial_total >= 1, budget.left(60),
                  "the slow node's first averaged round")
    # From here on, ROUNDS more rounds; both stop on their own at the same one (training.max_epochs,
    # raised at run time by a SIGHUP reload).
    before = {node.name: node.status() for node in (fast, slow)}
    stop_epoch = max(status.local_epoch for status in before.values()) + ROUNDS
    for node in (fast, slow):
        node.overrides = {**node.overrides, "training": {**node.overrides["training"], "max_epochs": stop_epoch}}
        node.write_config()
        node.signal(signal.SIGHUP)
    last = dict(before)  # each node's latest status, read until it exits

    def both_stopped() -> bool:
        for node in (fast, slow):
            if node.running and (seen := node.status(timeout=1.0)) is not None:
                last[node.name] = seen
        return not (fast.running or slow.running)

    with contextlib.suppress(WaitTimeout):
        wait_until(both_stopped, budget.left(120), "both nodes stopping at training.max_epochs", interval=0.2)
    codes = {node.name: node.wait(1) for node in (fast, slow)}
    for node in (fast, slow):
        if codes[node.name] is None:
            node.signal(signal.SIGTERM)
    running = [name for name, code in codes.items() if code is None]
    assert not running, (f"{running} not stopped at round {stop_epoch} within the {budget.seconds:.0f} s of "
                         f"waits this test allows; last rounds seen: "
                         f"{ {name: status.local_epoch for name, status in last.items()} }",
                         fast.report(), slow.report())
    assert codes == {"fast": 0, "slow": 0}, (fast.report(), slow.report())
    states = {n.name: CheckpointStore(n.state_dir / "checkpoints", keep=100).load_latest().state for n in (fast, slow)}
    losses = {name: _validation_loss(state) for name, state in states.items()}
    spread = abs(losses["fast"] - losses["slow"]) / min(losses.values())
    apart = _apart_over_travelled(states)
    logs = {n.name: n.log_path.read_text() for n in (fast, slow)}
    # Rounds that failed after the slow node was in (the last one may find its partner gone).
    failed = {name: len(FAILED_ROUND.findall(log.split("reload from SIGHUP", 1)[-1])) for name, log in logs.items()}
    # Rounds the slow node averaged in, full or partial, as it counted them when it stopped (rounds
    # last a second or two here: its last status read may be a round or two behind).
    summaries = RUN_SUMMARY.findall(logs["slow"])
    assert summaries, slow.report()
    full, partial = (int(n) for n in summaries[-1])
    joined = full + partial - before["slow"].averaging_rounds_ok_total - before["slow"].averaging_rounds_partial_total
    samples = {name: int(state["samples_processed"]) for name, state in states.items()}
    chaos_report.record("10_heterogeneous_diloco", rounds=ROUNDS, slow_cpu_percent=round(QUARTER_CORE_PERCENT, 2),
                        samples=samples, failed_rounds=failed, slow_rounds_joined=joined, val_loss=losses,
                        val_loss_spread=round(spread, 4), models_apart_over_travelled=round(apart, 4))
    assert states["fast"]["epoch"] == states["slow"]["epoch"] == stop_epoch
    # The slow node trains at a fraction of the fast one's rate, yet averages in (almost) every round.
    assert samples["slow"] < samples["fast"], samples
    assert failed["fast"] <= 1 and failed["slow"] <= 1, failed
    assert joined >= ROUNDS - 1, (joined, before["slow"])
    # One replica together with the other: far closer to it than to where training started.  A failed
    # round (at most one, above) leaves the models one local outer step apart, and when that was the
    # last round, the validation losses of the tiny model can differ by more than MAX_SPREAD.
    assert apart <= MAX_APART, apart
    if failed["fast"] == failed["slow"] == 0:
        assert spread <= MAX_SPREAD, losses
