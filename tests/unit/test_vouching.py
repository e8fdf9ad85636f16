"""Credit a stranger cannot mint: what rounds vouch for, how a view credits peers with it, and how the
figures travel in records."""

from __future__ import annotations

import dataclasses

import pytest
from hivemind.utils import MSGPackSerializer

from p2ptrain.averaging.robust_reduce import AllReduceReport, RoundReports
from p2ptrain.config.schema import SwarmSection
from p2ptrain.daemon.snapshot import StatusBoard, TrainingFigures
from p2ptrain.optim.defences import Defences
from p2ptrain.optim.protocol import GlobalProgress
from p2ptrain.status import LatestSnapshot, PeerRecord, StatusSnapshot, SwarmView
from p2ptrain.swarm.identity import IdentityKey
from p2ptrain.swarm.recordcheck import MAX_RECORD_BYTES, credit_problem
from p2ptrain.swarm.records import to_wire
from p2ptrain.trust import vouching
from p2ptrain.trust.credit import CreditLedger
from p2ptrain.trust.swarm_credit import credited_view
from p2ptrain.trust.vouching import MAX_RECORD_VOUCHES, Vouchers, VouchLedger, vouched_credit


def _report(ok: bool = True, **changes: object) -> AllReduceReport:
    report = AllReduceReport(averager="grad", group_size=4, peers=("me", "b", "c", "liar"), senders=4,
                         contributions_expected=8, contributions_received=6, results_expected=10, results_received=10,
                         rejected=(("liar", "oversized_part", "norm"),), clipped=0, ok=ok, finished_at=1.0,
                         weights=(("me", 48.0), ("b", 40.0), ("c", 56.0), ("liar", 48.0)))
    return dataclasses.replace(report, **changes)


def test_a_round_vouches_only_for_the_peers_this_node_averaged_with_at_the_weight_it_accepted() -> None:
    assert _report().shares("me") == {"b": 40.0, "c": 56.0}  # not ourselves, not the peer refused
    assert _report(ok=False).shares("me") == {}  # a failed round averaged nobody
    assert _report(weights=()).shares("me") == {}  # a client-mode node reduces nothing: it sees no weights


def test_every_round_the_defences_drain_feeds_the_ledger() -> None:
    ledger = VouchLedger()
    defences = Defences.from_config(SwarmSection(), vouches=ledger)
    assert defences is not None
    defences.rounds.put(_report())
    defences.rounds.put(_report(weights=(("b", 8.0), ("c", 1e-3))))
    assert defences.take_round("me") is not None
    assert ledger.vouched() == {"b": 48, "c": 56}
    assert defences.evidence.met_peers() == {"b", "c"}
    # What it vouches for, and whose signed figures count: the peers it joined through, not excluded now.
    defences.joined_through(["c", "liar"])
    defences.gate.offend("liar", "nonfinite_part", "nan", certain=True)
    assert defences.vouchers() == Vouchers(direct={"b": 48, "c": 56}, anchors=frozenset({"c"}))
    # A fetcher's bundle averages with nobody: its rounds feed no ledger.
    lone = Defences.from_config(SwarmSection())
    assert lone is not None and lone.vouchers().direct == {}
    lone.rounds = RoundReports()
    lone.rounds.put(_report())
    assert lone.take_round("me") is not None


def test_the_ledger_counts_what_rounds_carried_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = VouchLedger()
    ledger.add_round({"a": 10.5, "b": float("nan"), "c": float("inf"), "d": -4.0, "e": 0.0})
    ledger.add_round({"a": 10.5, "f": 3.0})
    assert ledger.vouched() == {"a": 21, "f": 3}
    ledger.add_round({"g": 30.0, "h": 21.0})
    assert ledger.largest(2) == {"g": 30, "a": 21}  # the largest, ties by peer ID
    monkeypatch.setattr(vouching, "MAX_VOUCHED_PEERS", 2)
    ledger.add_round({"i": 1.0})
    assert set(ledger.vouched()) == {"g", "a"}  # a long run forgets the least vouched for first


def _peer(name: str, claim: int = 0, epoch: int = 12, vouched: tuple[tuple[str, int], ...] = ()) -> PeerRecord:
    return PeerRecord(peer_id=name, state="training", epoch=epoch, samples_contributed=claim, vouched=vouched)


#: A freeloader and a helper identity: an epoch 9,000 ahead, a million samples claimed each, and each
#: vouching for the other; an honest peer "b" this node averaged with; "c", which only the peer this node
#: joined through ("anchor") averaged with, and which vouches for the anchor in turn.
SYBILS = (_peer("freeloader", 10**6, 9_012, (("helper", 10**6),)),
          _peer("helper", 10**6, 9_012, (("freeloader", 10**6),)))
HONEST = (_peer("me", 480), _peer("b", 500), _peer("anchor", 600, vouched=(("c", 300), ("freeloader", 50))),
          _peer("c", 700, vouched=(("anchor", 250),)))


def test_only_what_someone_this_node_believes_vouches_for_counts_never_a_claim() -> None:
    vouchers = Vouchers(direct={"b": 440, "anchor": 120}, anchors=frozenset({"anchor"}))
    credit = vouched_credit(HONEST + SYBILS, vouchers, own_peer="me")
    assert credit == {"me": 480,  # our own ledger's figure, as our record has it
                      "b": 440,  # what its parts carried into our rounds, not its claim of 500
                      "anchor": 600,  # the peer we joined through: its word, as for what it vouches for
                      "c": 300,  # what the peer we joined through vouches for, not its claim of 700
                      "freeloader": 50,  # the anchor averaged with it once; the helper's figure counts for nothing
                      "helper": 0}
    # Without the anchor's word, neither it nor "c" (which vouches for it) is credited anything.
    alone = vouched_credit(HONEST + SYBILS, Vouchers(direct={"b": 440}), own_peer="me")
    assert alone == {"me": 480, "b": 440, "anchor": 0, "c": 0, "freeloader": 0, "helper": 0}
    # Had the operator joined through the freeloader, its word would count: the operator's choice.
    assert vouched_credit(SYBILS, Vouchers(anchors=frozenset({"freeloader"})))["helper"] == 10**6


def test_a_view_credits_vouched_samples_at_the_runs_pace_and_keeps_the_claims_apart() -> None:
    view = SwarmView(peers=HONEST + SYBILS, global_epoch=9_012)  # the records' majority: the Sybils agree
    vouchers = Vouchers(direct={"b": 440, "freeloader": 10**6}, anchors=frozenset({"anchor"}))
    credited = credited_view(view, 100, "me", vouchers=vouchers, swarm_epoch=12)
    by_id = {p.peer_id: p.samples_contributed for p in credited.peers}
    # Even a vouched-for figure is clipped at (swarm epoch + 1 + 1) epochs of at most 100 samples.
    assert by_id == {"me": 480, "b": 440, "anchor": 600, "c": 300, "freeloader": 1_400, "helper": 0}
    assert credited.samples_contributed == sum(by_id.values())
    assert credited.samples_claimed == 480 + 500 + 600 + 700 + 2 * 1_400  # claims, each clipped the same way
    assert credited.global_epoch == 12  # the optimizer's epoch, not the one the records agree on


def test_the_board_shows_sybils_no_credit_and_the_optimizers_epoch() -> None:
    latest, ledger = LatestSnapshot(), CreditLedger()
    board = StatusBoard(latest, 48, clock=lambda: 10.0, wall_clock=lambda: 1000.0)
    board.view, board.credit_bound = lambda: SwarmView(peers=HONEST + SYBILS, global_epoch=9_012), lambda: 100
    board.credit, board.note_contributors = ledger.figures, ledger.note_contributors
    board.training = lambda: TrainingFigures(epoch=12)
    board.progress = lambda: GlobalProgress(epoch=11, known=True)
    board.identity = dataclasses.replace(board.identity, peer_id="me")
    ledger.vouches.add_round({"b": 440.0})
    board.vouchers, board.vouched = lambda: Vouchers(direct=ledger.vouches.vouched()), ledger.vouches.largest
    ledger.epoch_closed(480, round_started=False, alone=True)
    board.publish()
    swarm, status = latest.swarm(), latest.status()
    assert {p.peer_id: p.samples_contributed for p in swarm.peers if p.samples_contributed} == {"me": 480, "b": 440}
    assert swarm.samples_contributed == 920 and status.global_epoch == swarm.global_epoch == 12
    assert status.vouched_samples == {"b": 440} and ledger.contributors == 2
    # The node's own record carries what it vouches for.
    assert PeerRecord.from_status(status).vouched == (("b", 440),)


def test_a_record_carries_its_vouched_figures_bounded_and_within_the_record_size() -> None:
    identity = IdentityKey.generate()
    vouched = {IdentityKey.generate().peer_id: 10**12 + i for i in range(MAX_RECORD_VOUCHES + 3)}
    status = StatusSnapshot(peer_id=identity.peer_id, samples_contributed_total=10**12, taken_at=1.0,
                            vouched_samples=vouched, data_past_pass_shards=(9,) * 7, data_shards_total=10**6,
                            data_source="f" * 32)
    wire = to_wire(PeerRecord.from_status(status))
    assert len(wire["vouched"]) == MAX_RECORD_VOUCHES and credit_problem(wire) == ""
    assert PeerRecord.from_dict(wire).vouched == tuple((peer, count) for peer, count in wire["vouched"])
    full = {**wire, "identity_key": identity.public_key, "key_proof": b"x" * 256, "model_fingerprint": "f" * 16}
    assert len(MSGPackSerializer.dumps(full)) < MAX_RECORD_BYTES
    assert to_wire(PeerRecord(vouched=(("", 5), ("x" * 65, 5), ("QmOk", -3))))["vouched"] == [["QmOk", 0]]


@pytest.mark.parametrize("vouched", [
    "QmA", [["QmA", 1]] * (MAX_RECORD_VOUCHES + 1), [["QmA"]], [["QmA", -1]], [["QmA", 1.5]], [["QmA", True]],
    [[7, 1]], [["", 1]], [["x" * 65, 1]], [["QmA", 10**16]],
])
def test_malformed_vouched_figures_refuse_the_record(vouched: object) -> None:
    assert credit_problem({"vouched": vouched}).startswith("vouched is not a list")
    # Reading such a record back (the API's JSON) never raises: pairs that are not (text, count) are dropped.
    assert all(isinstance(peer, str) and isinstance(count, int)
               for peer, count in PeerRecord.from_dict({"peer_id": "QmA", "vouched": vouched}).vouched)
