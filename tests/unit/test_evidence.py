"""What the peer checks take other peers' word from: bound records, peers met in averaging, the trusted view;
and how much of a round was really averaged, measured by the hardened reducer."""

from __future__ import annotations

import asyncio

import torch

from p2ptrain.averaging.allreduce import RobustTensorPartReducer
from p2ptrain.averaging.robust_reduce import AllReduceReport, ReduceRule
from p2ptrain.optim.round_stats import RoundOutcome, RoundSummary, classify
from p2ptrain.status import PeerRecord
from p2ptrain.trust.evidence import PeerEvidence, trusted_view
from p2ptrain.trust.swarm_view import summarize
from tests.support.clock import ManualClock


def _record(peer: str, epoch: int, rate: float = 10.0, state: str = "training",
            val_loss: float | None = 3.0) -> PeerRecord:
    return PeerRecord(peer_id=peer, state=state, epoch=epoch, samples_per_second=rate, val_loss=val_loss,
                      published_at=1.0)


def test_reports_come_from_met_peers_when_any_are_among_the_records():
    clock = ManualClock()
    evidence = PeerEvidence(clock=clock, met_seconds=60.0, is_gated=lambda peer: peer == "banned")
    records = [_record("a", 40), _record("b", 41), _record("sybil1", 5), _record("sybil2", 5),
               _record("banned", 7), _record("fresh", 0, state="syncing")]
    evidence.update_records(records, {b"ka": "a"}, dht_peers=["b", "banned", "fresh"])
    evidence.initial_peers = frozenset({"a"})
    assert evidence.records_seen.is_set() and evidence.bound_keys() == {b"ka": "a"}
    # Nobody met yet: the peers we joined through report; then two or more peers on the network (in the
    # DHT's routing table); made-up identities (sybil1/2) have no node anyone talked to.
    assert evidence.peer_epochs() == {"a": 40}
    evidence.initial_peers = frozenset()
    assert evidence.peer_epochs() == {}  # one peer on the network alone decides nothing
    evidence.update_records(records, {b"ka": "a"}, dht_peers=["a", "b", "banned", "fresh"])
    assert evidence.peer_epochs() == {"a": 40, "b": 41}
    evidence.met_in_round(["a"])
    assert evidence.peer_epochs() == {"a": 40}  # identities we averaged with outrank the rest
    assert evidence.peer_val_losses() == {"a": 3.0}
    assert evidence.trusted_peers() == {"a"}
    clock.now += 61.0
    assert evidence.met_peers() == set() and len(evidence.peer_epochs()) == 2  # met long ago: forgotten


def test_the_view_shown_drops_absurd_claims_and_counts_no_excluded_peer():
    peers = (_record("me", 50, rate=20.0), _record("a", 51, rate=25.0), _record("b", 49, rate=15.0),
             _record("sybil", 999_999, rate=30.0), _record("fast-liar", 50, rate=1e7), _record("offender", 50))
    view = summarize(peers, rejected_total=3)
    assert view.swarm_samples_per_second > 1e7  # what the raw records would show
    shown, dropped = trusted_view(view, own_peer="me", own_epoch=50, own_rate=20.0, met={"a"},
                                  is_gated=lambda peer: peer == "offender")
    assert dropped == 2 and {p.peer_id for p in shown.peers} == {"me", "a", "b", "offender"}
    assert shown.swarm_samples_per_second == 60.0 and shown.global_epoch == 51  # the offender counts in no total
    assert shown.rejected_records_total == 5
    # A fresh node (epoch 0, nobody met) has nothing to judge epochs by: it shows what the records say.
    fresh, dropped = trusted_view(view, own_peer="new", own_epoch=0, own_rate=0.0, met=set())
    assert dropped == 0 and len(fresh.peers) == len(peers)


def test_a_round_where_a_peers_parts_are_missing_is_partial():
    """Three senders, one of them never sends: the reducer measures 2/3 received and the round is partial."""
    async def reduce() -> RobustTensorPartReducer:
        reducer = RobustTensorPartReducer([torch.Size([4]), torch.Size([4])], 3, rule=ReduceRule(), local_sender=0,
                                          on_reject=lambda index, why: None)
        reducer.on_sender_failed(2)  # the third peer's parts never arrive
        results = await asyncio.gather(*(reducer.accumulate_part(sender, part, torch.ones(4) * (sender + 1))
                                         for sender in (0, 1) for part in (0, 1)))
        assert all(torch.allclose(r, torch.full((4,), 1.5)) for r in results)
        return reducer

    reducer = asyncio.run(reduce())
    measured = AllReduceReport(averager="grad", group_size=3, peers=("me", "p1", "p2"), senders=3,
                             contributions_expected=reducer.num_parts * 3,
                             contributions_received=reducer.contributions_accepted, results_expected=8,
                             results_received=8, rejected=(), clipped=0, ok=True, finished_at=0.0)
    assert measured.averaged_fraction == 2 / 3
    report = RoundSummary(ok=True, duration=1.0, group_size=measured.group_size, peers_online=3,
                         received_fraction=measured.averaged_fraction)
    assert classify(report.bounded()) is RoundOutcome.PARTIAL
    full = RoundSummary(ok=True, duration=1.0, group_size=3, peers_online=3, received_fraction=1.0)
    assert classify(full) is RoundOutcome.OK
