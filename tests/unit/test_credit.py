"""Credit: which samples count as contributed, how a swarm view credits its peers' claims, and the
bounds a record's credit and coverage fields must keep."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from p2ptrain.daemon.history import LossCurve
from p2ptrain.daemon.snapshot import DataFigures, data_figures
from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.status import PeerRecord, StatusSnapshot, SwarmView
from p2ptrain.swarm.recordcheck import MAX_SHARDS, credit_problem
from p2ptrain.swarm.records import to_wire
from p2ptrain.trust.credit import MAX_AWAITING, CreditFigures, CreditLedger
from p2ptrain.trust.swarm_credit import coverage_of, credited_view, epoch_samples_bound


def _round(ok: bool, group: int = 2) -> RoundSummary:
    return RoundSummary(ok=ok, duration=1.0, group_size=group if ok else 0, peers_online=2, received_fraction=1.0)


def test_samples_count_once_their_round_averaged_them_with_another_peer() -> None:
    stats = SwarmStats()
    stats.epoch_closed(48, round_started=True, alone=False)
    assert stats.credit.figures() == CreditFigures(contributed=0, not_averaged=0, awaiting=48)
    stats.record_round(_round(True), 100)
    stats.epoch_closed(40, round_started=True, alone=False)
    stats.record_round(_round(False), 100)  # a failed round: the update stayed on this node
    stats.epoch_closed(56, round_started=True, alone=False)
    assert stats.credit.figures() == CreditFigures(contributed=48, not_averaged=40, awaiting=56)
    # A completed round whose group was this node alone averaged with nobody.
    stats.record_round(_round(True, group=1), 100)
    assert stats.credit.figures() == CreditFigures(contributed=48, not_averaged=96, awaiting=0)


def test_an_epoch_without_a_round_counts_only_when_nobody_else_was_training() -> None:
    ledger = CreditLedger()
    ledger.epoch_closed(48, round_started=False, alone=True)  # the first node, before the others come
    ledger.epoch_closed(48, round_started=False, alone=False)  # peers online, yet no round: local only
    assert ledger.figures() == CreditFigures(contributed=48, not_averaged=48)


def test_rounds_settle_epochs_in_the_order_they_closed_and_stray_outcomes_change_nothing() -> None:
    ledger = CreditLedger()
    ledger.round_ended(averaged=True)  # no epoch handed over (a zero-weight round): nothing to credit
    for samples in (10, 20):
        ledger.epoch_closed(samples, round_started=True, alone=False)
    ledger.round_ended(averaged=False)
    ledger.round_ended(averaged=True)
    assert ledger.figures() == CreditFigures(contributed=20, not_averaged=10)
    # Outcomes that never come (a round left at shutdown) do not pile up for ever.
    for _ in range(MAX_AWAITING + 2):
        ledger.epoch_closed(1, round_started=True, alone=False)
    assert ledger.figures().awaiting == MAX_AWAITING and ledger.figures().not_averaged == 12


def test_the_ledger_survives_a_checkpoint_and_ignores_garbage_in_one() -> None:
    ledger = CreditLedger()
    ledger.epoch_closed(30, round_started=False, alone=True)
    ledger.note_contributors(["peer-a", "peer-b", "peer-a"])
    ledger.vouches.add_round({"peer-a": 24.0})
    saved = ledger.checkpoint_fields()
    assert saved == {"samples_contributed": 30, "samples_not_averaged": 0, "contributors": ["peer-a", "peer-b"],
                     "vouched": {"peer-a": 24}}
    restored = CreditLedger()
    restored.restore(saved)
    assert restored.figures().contributed == 30 and restored.contributors == 2
    assert restored.vouches.vouched() == {"peer-a": 24}
    odd = CreditLedger()
    odd.restore({"samples_contributed": -5, "samples_not_averaged": True, "contributors": "peer-a",
                 "vouched": {"peer-a": -3, "peer-b": True, 7: 5, "peer-c": "many"}})
    assert odd.figures() == CreditFigures() and odd.contributors == 0 and odd.vouches.vouched() == {}


def _peer(name: str, samples: int = 0, epoch: int = 10, **data: object) -> PeerRecord:
    return PeerRecord(peer_id=name, state="training", epoch=epoch, samples_contributed=samples, **data)


def test_a_peer_is_credited_at_most_what_the_run_allows_for_its_epoch() -> None:
    training = SimpleNamespace(mode="gradient", batch_size=8, target_batch_size=48)
    bound = epoch_samples_bound(training)
    assert bound == 112
    view = SwarmView(peers=(_peer("a", 400), _peer("b", 500), _peer("liar", 10**14, epoch=10**6)), global_epoch=10)
    credited = credited_view(view, bound)
    by_id = {p.peer_id: p.samples_contributed for p in credited.peers}
    assert by_id["a"] == 400 and by_id["b"] == 500
    # Its epoch counts as at most one past the swarm's: (11 + 1) epochs' worth.
    assert by_id["liar"] == 12 * bound
    assert credited.samples_contributed == 900 + 12 * bound
    assert credited_view(view, 0).samples_contributed == 500 + 400 + 10**14  # no bound: taken as claimed
    diloco = SimpleNamespace(mode="diloco", batch_size=8, inner_steps=10, inner_batch_size=32, target_batch_size=1)
    assert epoch_samples_bound(diloco) == 16 * 10 * 32


def test_coverage_sums_the_shares_of_a_pass_across_peers_and_lagging_peers() -> None:
    data = {"data_source": "abc", "shards_total": 10}
    peers = (
        _peer("a", data_pass=1, shards_consumed=2, past_pass_shards=(6,), **data),  # already in the next pass
        _peer("b", data_pass=0, shards_consumed=3, **data),
        _peer("c", data_pass=0, shards_consumed=1, **data),
    )
    # The swarm's pass is the lower median: pass 0, read by b and c and (all of its share) by a.
    assert coverage_of(peers) == (0, 1.0, None, 10)
    everyone_on = tuple(dataclasses.replace(p, data_pass=1, shards_consumed=1, past_pass_shards=p.past_pass_shards
                                            or (2,)) for p in peers)
    assert coverage_of(everyone_on) == (1, 0.3, 1.0, 10)  # last pass: 6 + 2 + 2 read of 10
    # Passes drift apart: a peer two passes ahead still reports what it read in the swarm's passes.
    drifted = (_peer("fast", data_pass=4, shards_consumed=1, past_pass_shards=(5, 6, 4), **data),
               _peer("slow", data_pass=2, shards_consumed=3, past_pass_shards=(6,), **data))
    assert coverage_of(drifted) == (2, 0.9, 1.0, 10)  # pass 2: 3 + 6; pass 1: 6 + 4 read
    gone = (_peer("far", data_pass=40, shards_consumed=1, past_pass_shards=(5,), **data), drifted[1])
    assert coverage_of(gone)[1] == 0.3  # too far ahead to report pass 2: only what is known counts


def test_coverage_ignores_other_shard_lists_and_is_never_over_one() -> None:
    mine = {"data_source": "mine", "shards_total": 4}
    peers = (
        _peer("me", data_pass=3, shards_consumed=4, **mine),
        _peer("greedy", data_pass=3, shards_consumed=4, **mine),
        _peer("x", data_pass=9, shards_consumed=7, data_source="other", shards_total=8),
        _peer("y", data_pass=9, shards_consumed=7, data_source="other", shards_total=8),
        _peer("plain"),  # data that is not sharded
    )
    assert coverage_of(peers, own_peer="me") == (3, 1.0, 0.0, 4)
    assert coverage_of(peers)[3] == 8  # without an own record: the list most peers read
    assert coverage_of((_peer("plain"),)) == (0, None, None, 0)


@pytest.mark.parametrize("fields, problem", [
    ({}, ""),
    ({"samples_contributed": 10, "shards_total": 5, "shards_consumed": 5, "past_pass_shards": [2, 5],
      "data_pass": 3, "data_source": "ab" * 8}, ""),
    ({"samples_contributed": -1}, "samples_contributed"),
    ({"samples_contributed": 2.5}, "samples_contributed"),
    ({"samples_contributed": True}, "samples_contributed"),
    ({"samples_contributed": 10**16}, "samples_contributed"),
    ({"shards_total": MAX_SHARDS + 1}, "shards_total"),
    ({"shards_total": 3, "shards_consumed": 4}, "more shards"),
    ({"past_pass_shards": [1]}, "more shards"),
    ({"shards_total": 9, "past_pass_shards": [1] * 8}, "past_pass_shards"),
    ({"shards_total": 9, "past_pass_shards": [1, -1]}, "past_pass_shards"),
    ({"shards_total": 9, "past_pass_shards": "1"}, "past_pass_shards"),
    ({"data_source": "x" * 33}, "data_source"),
    ({"data_source": 7}, "data_source"),
])
def test_record_credit_fields_are_bounded(fields: dict[str, object], problem: str) -> None:
    found = credit_problem(fields)
    assert (problem in found and bool(found)) if problem else found == ""


def test_a_nodes_record_carries_its_credit_and_data_position_in_strict_types() -> None:
    status = StatusSnapshot(peer_id="me", samples_contributed_total=480, data_pass=2, data_shards_consumed=3,
                            data_past_pass_shards=(5, 6), data_shards_total=6, data_source="0123456789abcdef",
                            taken_at=1.0)
    wire = to_wire(PeerRecord.from_status(status))
    assert (wire["samples_contributed"], wire["data_pass"], wire["shards_consumed"], wire["past_pass_shards"],
            wire["shards_total"], wire["data_source"]) == (480, 2, 3, [5, 6], 6, "0123456789abcdef")
    assert credit_problem(wire) == ""
    assert PeerRecord.from_dict(wire) == PeerRecord.from_status(status)


def test_data_figures_come_from_a_coverage_stream_and_zero_otherwise() -> None:
    coverage = SimpleNamespace(pass_number=2, consumed=("a", "b"), shards_total=9, failed_records_total=5,
                               bad_records_total=7, skipped_total=1, malformed_total=2)
    stream = SimpleNamespace(coverage=lambda: coverage, source="src", past_pass_shards=lambda: (3, 4))
    assert data_figures(stream) == DataFigures(2, 2, (3, 4), 9, "src", records_failed=5, records_without_text=7,
                                               shards_skipped=3)
    assert data_figures(object()) == DataFigures()

    def broken() -> object:
        raise RuntimeError("a user stream's bug")

    assert data_figures(SimpleNamespace(coverage=broken)) == DataFigures()


def test_loss_curve_keeps_one_point_per_new_epoch_and_thins_evenly_when_full() -> None:
    curve = LossCurve(points=8)
    for epoch in range(100):
        curve.add(epoch, 5.0 - epoch / 100)
        curve.add(epoch, 1.0)  # a second value for the same epoch is not a new point
    curve.add(100, float("nan"))
    epochs = curve.epochs
    assert len(epochs) <= 8 and epochs[0] == 0 and epochs[-1] >= 100 - 16
    steps = {b - a for a, b in zip(epochs, epochs[1:], strict=False)}
    assert len(steps) == 1  # evenly spaced over the run
    assert curve.values[0] == 5.0


def test_the_board_publishes_a_credited_view_its_own_credit_and_the_contributors_it_saw() -> None:
    from p2ptrain.daemon.snapshot import StatusBoard, TrainingFigures
    from p2ptrain.status import LatestSnapshot

    latest, ledger = LatestSnapshot(), CreditLedger()
    board = StatusBoard(latest, 48, clock=lambda: 10.0, wall_clock=lambda: 1000.0)
    view = SwarmView(peers=(_peer("me", 96, epoch=2), _peer("liar", 10**12, epoch=2), _peer("idle", 0)),
                     global_epoch=2)
    board.view, board.credit_bound = lambda: view, lambda: 100
    board.credit, board.note_contributors = ledger.figures, ledger.note_contributors
    board.training = lambda: TrainingFigures(epoch=2)
    board.identity = dataclasses.replace(board.identity, peer_id="me")
    ledger.epoch_closed(96, round_started=False, alone=True)
    board.publish()
    swarm, status = latest.swarm(), latest.status()
    assert {p.peer_id: p.samples_contributed for p in swarm.peers} == {"me": 96, "liar": 300, "idle": 0}
    assert swarm.samples_contributed == 396  # the liar at (2 + 1) epochs x 100
    assert status.samples_contributed_total == 96
    assert ledger.contributors == 2  # "idle" contributed nothing
