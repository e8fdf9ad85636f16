"""Credit Sybils against live nodes: a freeloader and a helper identity claim an epoch far ahead and a
large number of samples, vouching for each other, and never train.  The honest nodes credit them with
nothing, and neither the swarm's total nor its epoch moves."""

from __future__ import annotations

import pytest

from p2ptrain.waiting import wait_until
from tests.chaos.hostile_records import CreditSybils
from tests.integration.conftest import TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

AHEAD = 9_000
CLAIM = 10**9


def test_freeloader_and_helper_identity_are_credited_nothing_and_inflate_no_total(make_node) -> None:
    a, b = make_node("a", task=TINY_TASK), make_node("b", task=TINY_TASK)
    a.start()
    b.start(join=a.join_addrs()[:1])
    for node in (a, b):
        node.wait_for(lambda s: s.averaging_rounds_ok_total >= 2, 150, "two averaging rounds")
    honest = {a.status().peer_id, b.status().peer_id}
    # A's samples per epoch at most 2 x (target_batch_size 48 + batch_size 8): the run's pace.
    pace = 2 * (48 + 8)
    sybils = CreditSybils(a.join_addrs(), a.run_id, epoch=lambda: a.status().local_epoch + AHEAD, samples=CLAIM,
                          fingerprint=a.status().model_fingerprint)
    try:
        # Both Sybil records in A's view, read at least twice since (a snapshot is taken every half second).
        wait_until(lambda: (v := a.peers()) is not None and set(sybils.peer_ids) <= {p.peer_id for p in v.peers}, 60,
                   "both Sybil records in A's swarm view", interval=1.0, detail=lambda: str(a.peers()))
        a.wait_for(lambda s: s.averaging_rounds_ok_total >= 4, 90, "two more averaging rounds")
        view, status = a.peers(), a.status()
        assert view is not None and status is not None
    finally:
        sybils.stop()
    credit = {p.peer_id: p.samples_contributed for p in view.peers}
    assert set(sybils.peer_ids) <= set(credit), credit
    # Their claims and their vouching for each other count for nothing: only rounds vouch.
    assert all(credit[peer] == 0 for peer in sybils.peer_ids), credit
    # B is credited what its parts carried into A's rounds, which A's record vouches for too.
    peer_b = b.status().peer_id
    assert peer_b in credit, (f"b missing from a's view {credit} (a rejected {status.rejected_records_total} records)\n"
                              f"{a.log_tail(40)}\n{b.log_tail(20)}")
    assert 0 < credit[peer_b] <= (status.global_epoch + 2) * pace, credit
    assert status.vouched_samples.get(peer_b, 0) > 0, status.vouched_samples
    # The swarm's total is the honest peers' credit; the claims are kept apart, each clipped at the pace.
    assert view.samples_contributed == sum(credit[peer] for peer in honest), credit
    assert view.samples_contributed < CLAIM // 1000
    assert view.samples_claimed >= 2 * min(CLAIM, pace)
    # The epoch shown is the optimizer's, not the one the Sybils agree on.
    assert status.global_epoch < status.local_epoch + 5 < AHEAD, (status.global_epoch, status.local_epoch)
    assert abs(view.global_epoch - status.global_epoch) <= 1  # read a moment apart
