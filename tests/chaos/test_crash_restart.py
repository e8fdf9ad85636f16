"""Scenario 2 - a node dies while an averaging round is in flight; scenario 4 - the whole swarm
restarts from its checkpoints."""

from __future__ import annotations

import signal
import time

import pytest

from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.waiting import wait_until
from tests.chaos.conftest import AVERAGING_TIMEOUT
from tests.chaos.helpers import statuses, training

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


def test_crash_during_averaging_round(make_node, chaos_report):
    a, b, c = make_node("a"), make_node("b"), make_node("c")
    a.start()
    addrs = a.join_addrs()[:1]
    b.start(join=addrs)
    c.start(join=addrs)
    c.wait_for(lambda s: s.rounds_averaged >= 1 and s.peers_online == 3, 150,
               "a successful round in a swarm of three")
    in_flight = wait_until(lambda: (s := c.status(timeout=1.0)) is not None and s.round_in_flight and s,
                           60, "a round in flight", interval=0.05)
    epoch = in_flight.local_epoch
    before = {n.name: s for n, s in ((n, n.status()) for n in (a, b)) if s is not None}
    c.kill()
    killed_at = time.monotonic()
    assert c.wait(10) is not None
    finished: dict[str, float] = {}
    for node in (a, b):
        def moved_on(s, name=node.name):
            start = before[name]
            ended = s.averaging_rounds_ok_total + s.averaging_rounds_partial_total + s.averaging_rounds_failed_total
            return (ended > start.averaging_rounds_ok_total + start.averaging_rounds_partial_total
                    + start.averaging_rounds_failed_total and s.local_epoch > epoch)
        node.wait_for(moved_on, 2 * AVERAGING_TIMEOUT + 10, "the in-flight round to end")
        finished[node.name] = time.monotonic() - killed_at
    # Nobody is left stuck: both go on averaging with each other.
    for node in (a, b):
        status = node.wait_for(lambda s: s.local_epoch >= epoch + 3 and s.seconds_since_progress is not None
                               and s.seconds_since_progress < 5, 60, "three more epochs")
    after = statuses([a, b])
    chaos_report.record(
        "2_crash_in_round", killed_at_epoch=epoch, samples_accumulated_at_kill=in_flight.samples_accumulated,
        seconds_to_end_round={k: round(v, 1) for k, v in finished.items()},
        bound_seconds=2 * AVERAGING_TIMEOUT + 10,
        rounds_failed_after={k: s.averaging_rounds_failed_total - before[k].averaging_rounds_failed_total
                             for k, s in after.items()},
        last_group_size=status.last_round_group_size,
    )


def test_whole_swarm_restart_from_checkpoints(make_node, chaos_report):
    nodes = [make_node(name) for name in ("a", "b", "c")]
    nodes[0].start()
    addrs = nodes[0].join_addrs()[:1]
    for node in nodes[1:]:
        node.start(join=addrs)
    for node in nodes:
        node.wait_for(lambda s: s.rounds_averaged >= 2, 150, "two averaging rounds")
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(60) == 0, node.report()
    saved = {}
    for node in nodes:
        loaded = CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest()
        assert loaded is not None, node.report()
        saved[node.name] = loaded.state
    top_epoch = max(s["epoch"] for s in saved.values())

    restarted = time.monotonic()
    nodes[0].start()
    addrs = nodes[0].join_addrs()[:1]
    for node in nodes[1:]:
        node.start(join=addrs)
    resumed = {node.name: training(node, 120) for node in nodes}
    back_in = time.monotonic() - restarted
    for node in nodes:
        assert resumed[node.name].local_epoch >= saved[node.name]["epoch"], node.report()
        assert resumed[node.name].samples_processed_total >= saved[node.name]["samples_processed"]
        assert "resumed from checkpoint" in node.log_path.read_text()
    for node in nodes:
        node.wait_for(lambda s: s.rounds_averaged >= 1 and s.local_epoch > top_epoch, 120,
                      "a round after the restart")
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(60) == 0, node.report()
    lost_samples = 0
    for node in nodes:
        loaded = CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest()
        assert loaded is not None
        first, second = saved[node.name], loaded.state
        consumed = second["samples_processed"] - first["samples_processed"]
        assert consumed > 0
        p1, p2 = first["data_position"], second["data_position"]
        assert p2["pass"] >= p1["pass"], (node.name, p1, p2)
        if p1["pass"] == p2["pass"]:
            # The data stream went on exactly where the checkpoint left it: nothing skipped, nothing repeated.
            lost_samples += abs((p2["windows"] - p1["windows"]) - consumed)
            assert p2["windows"] - p1["windows"] == consumed, (node.name, p1, p2, consumed)
    chaos_report.record(
        "4_whole_swarm_restart", epochs_before={k: s["epoch"] for k, s in saved.items()},
        epochs_after_restart={k: s.local_epoch for k, s in resumed.items()},
        epochs_lost={k: max(0, saved[k]["epoch"] - s.local_epoch) for k, s in resumed.items()},
        samples_lost=lost_samples, seconds_until_all_training=round(back_in, 1),
    )
