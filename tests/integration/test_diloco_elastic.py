"""DiLoCo stays elastic: a late peer syncs from the swarm and averages; a dead peer stalls nobody."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import FAST_TRAINING

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Rounds of ten one-micro-batch inner steps.
DILOCO = {"mode": "diloco", "inner_steps": 10, "inner_batch_size": FAST_TRAINING["batch_size"], "matchmaking_time": 0.5,
          "averaging_timeout": 8.0, "load_state_timeout": 20.0}


def test_late_peer_syncs_and_dead_peer_does_not_stall(make_node):
    a = make_node("a", training=DILOCO)
    a.start()
    alone = a.wait_for(lambda s: s.state == "training" and s.local_epoch >= 2, 120, "A alone past round 2")
    # Rounds a node trained alone, nobody else in the swarm, are the swarm's rounds: contributed.
    per_round = DILOCO["inner_steps"] * FAST_TRAINING["batch_size"]
    assert alone.samples_contributed_total >= 2 * per_round and alone.samples_not_averaged_total == 0, alone
    b = make_node("b", training=DILOCO)
    b.start(join=a.join_addrs()[:1])
    joined = b.wait_for(lambda s: s.state == "training", 120, "B training")
    assert joined.state_downloads_total >= 1, b.report()
    assert joined.local_epoch >= 2  # started from the swarm's round, not from scratch
    for node in (a, b):
        averaged = node.wait_for(lambda s: s.averaging_rounds_ok_total >= 2, 120, "two averaged DiLoCo rounds")
        assert averaged.samples_contributed_total > 0, averaged  # averaged rounds count too

    b.kill()
    before = a.status()
    assert before is not None
    started = time.monotonic()
    # Without B every round ends after at most averaging_timeout (plus the rounds' own compute).
    after = a.wait_for(lambda s: s.local_epoch >= before.local_epoch + 2, 60, "A two rounds past B's death")
    assert time.monotonic() - started < 2 * (DILOCO["averaging_timeout"] + 10)
    assert after.state == "training"
