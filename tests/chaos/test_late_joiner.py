"""Scenario 3 - late joiners with a larger state: a donor dies while a joiner downloads, and several
joiners arrive at once."""

from __future__ import annotations

import time

import pytest

from p2ptrain.waiting import wait_until
from tests.chaos.conftest import CHAOS_TRAINING
from tests.chaos.helpers import log_text, training

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

#: ~1.8M parameters: ~22 MB of parameters + optimizer state to transfer.
LARGER_TASK = {"d_model": 192, "n_layers": 4, "n_heads": 4}
SYNC_BOUND = 10.0 + CHAOS_TRAINING["load_state_timeout"] * CHAOS_TRAINING["load_state_attempts"] + 30.0


def test_late_joiners_sync_despite_a_dying_donor(make_node, chaos_report):
    d1, d2 = make_node("d1", task=LARGER_TASK), make_node("d2", task=LARGER_TASK)
    d1.start()
    addrs = d1.join_addrs()[:1]
    d2.start(join=addrs)
    for node in (d1, d2):
        node.wait_for(lambda s: s.averaging_rounds_ok_total >= 1, 150, "an averaging round")
    addrs2 = d2.join_addrs()[:1]

    j1 = make_node("j1", task=LARGER_TASK)
    started = time.monotonic()
    j1.start(join=addrs + addrs2)
    # The node's loop is blocked while it downloads (no fresh snapshot), so its log tells when it starts.
    wait_until(lambda: "downloading state from peers" in log_text(j1), 90, "the state download to start",
               interval=0.05)
    d1.kill()  # the donor dies while the joiner is downloading
    killed_after = time.monotonic() - started
    synced = training(j1, SYNC_BOUND)
    j1_sync = time.monotonic() - started
    assert synced.state_downloads_total >= 1, j1.report()
    swarm_epoch = d2.status().local_epoch
    assert synced.local_epoch >= swarm_epoch - 2, (synced.local_epoch, swarm_epoch)
    j1.wait_for(lambda s: s.rounds_averaged >= 1, 90, "a contribution after joining")
    log = log_text(j1)
    # hivemind names a donor it could not download from, then tries the next one.
    mid_transfer = "Failed to download state from" in log

    # Several joiners at once, all served by the one remaining donor pair.
    joiners = [make_node(f"j{i}", task=LARGER_TASK) for i in (2, 3)]
    crowd_start = time.monotonic()
    for node in joiners:
        node.start(join=addrs2)
    crowd = {node.name: training(node, SYNC_BOUND + 30) for node in joiners}
    crowd_seconds = time.monotonic() - crowd_start
    for name, status in crowd.items():
        assert status.state_downloads_total >= 1, name
    assert d2.running, d2.report()
    for node in [d2, j1, *joiners]:
        node.wait_for(lambda s: s.rounds_averaged >= 1 and s.seconds_since_progress is not None
                      and s.seconds_since_progress < 10, 90, "training with the crowd")
    chaos_report.record(
        "3_late_joiner", parameters=1_800_000, donor_killed_after_seconds=round(killed_after, 1),
        dead_donor_tried_then_another=mid_transfer, joiner_seconds_to_training=round(j1_sync, 1),
        sync_bound_seconds=SYNC_BOUND, downloads_failed_j1=synced.state_downloads_failed_total,
        crowd_joiners=len(joiners), crowd_seconds_to_training=round(crowd_seconds, 1),
    )
