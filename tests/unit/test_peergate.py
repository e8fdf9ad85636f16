"""The peer gate: a ban list shared with forked helpers, offence counts, run admission, one line per offence."""

from __future__ import annotations

import logging
import math
import os

import pytest
from hivemind.p2p import PeerID

from p2ptrain.trust.peergate import JUDGED_STRIKES, OFFENCE_KINDS, STRIKE_WINDOW_SECONDS, PeerGate, peer_name
from tests.support.clock import ManualClock

PEER = "QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"




def test_an_offence_bans_counts_and_logs_one_warning_naming_the_peer(caplog):
    clock = ManualClock()
    gate = PeerGate(default_ban_seconds=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="p2ptrain.trust.peergate"):
        gate.offend(PEER, "nonfinite_part", "part 3 has NaN")
    assert caplog.messages == [f"peer {PEER}: nonfinite_part (part 3 has NaN); excluded for 60s"]
    assert caplog.records[0].exc_info is None
    assert gate.is_gated(PEER) and not gate.is_gated("QmOther")
    assert gate.offence_counts()["nonfinite_part"] == 1 and sum(gate.offence_counts().values()) == 1
    [offender] = gate.offenders()
    assert offender.to_dict() == {"peer_id": PEER, "kind": "nonfinite_part", "reason": "part 3 has NaN",
                                  "offences": 1, "first_at": 1000.0, "last_at": 1000.0, "banned_until": 1060.0}
    clock.now = 1061.0
    assert not gate.is_gated(PEER)  # the ban expired; the record of it stays for the API
    assert gate.offenders()[0].offences == 1 and gate.offenders(include_expired=False) == []


def test_state_bans_last_the_run_and_peer_ids_in_any_form_match():
    gate = PeerGate()
    raw = PeerID.from_base58(PEER)
    gate.offend(raw.to_bytes(), "bad_state", "tensor 0 has NaN", ban_seconds=math.inf)
    assert gate.is_gated(PEER) and gate.is_gated(raw)
    assert gate.offenders()[0].banned_until is None and peer_name(raw) == PEER


def test_a_ban_made_in_a_forked_child_is_seen_by_the_parent_and_bumps_the_version():
    gate = PeerGate()
    before = gate.version
    pid = os.fork()
    if pid == 0:
        gate.offend(PEER, "nonfinite_part", "part 1 has NaN")
        os._exit(0)
    os.waitpid(pid, 0)
    assert gate.is_banned(PEER) and gate.version == before + 1
    assert gate.offence_counts()["nonfinite_part"] == 1


def test_repeat_offences_accumulate_and_a_full_list_evicts_the_soonest_to_expire():
    gate = PeerGate(capacity=3, default_ban_seconds=100)
    gate.offend("QmLong", "bad_state", "x", ban_seconds=math.inf)
    gate.offend("QmA", "bad_result", "x")
    gate.offend("QmA", "nonfinite_part", "y")
    assert next(o for o in gate.offenders() if o.peer_id == "QmA").offences == 2
    gate.offend("QmB", "bad_result", "x", ban_seconds=10)
    gate.offend("QmC", "bad_result", "x")
    names = {o.peer_id for o in gate.offenders()}
    assert names == {"QmLong", "QmA", "QmC"}  # QmB's ban ended first


def test_admission_predicate_gates_and_never_raises():
    gate = PeerGate(admission=lambda peer: peer == "QmInvited")
    assert not gate.is_gated("QmInvited") and gate.is_gated("QmStranger")

    def broken(peer: str) -> bool:
        raise RuntimeError("manifest unreadable")

    gate.set_admission(broken)
    assert gate.is_gated("QmInvited")  # a failing check keeps peers out rather than crash
    gate.set_admission(None)
    assert not gate.is_gated("QmStranger")


def test_unknown_offence_kind_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown offence kind 'typo'"):
        PeerGate().offend(PEER, "typo", "x")
    assert "bad_state" in OFFENCE_KINDS


def test_a_judged_offence_excludes_only_on_the_third_round_with_one(caplog):
    """A part far from the others can come from an honest peer now and then: refused each time, the
    peer is excluded on its third round with one (parts of one round count once); a quiet spell
    starts the count again.  A non-finite average is certain: excluded at once."""
    clock = ManualClock()
    gate = PeerGate(default_ban_seconds=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="p2ptrain.trust.peergate"):
        for _ in range(5):  # five parts of one round
            gate.offend(PEER, "oversized_part", "norm 30 > 25")
        assert not gate.is_banned(PEER)
        clock.now += STRIKE_WINDOW_SECONDS + 1  # a quiet spell: the count starts again
        for round_ in range(JUDGED_STRIKES):
            assert not gate.is_banned(PEER), round_
            clock.now += 2.0
            gate.offend(PEER, "oversized_part", "norm 30 > 25")
    assert gate.is_banned(PEER)
    assert gate.offence_counts()["oversized_part"] == 5 + JUDGED_STRIKES
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"peer {PEER}: oversized_part (norm 30 > 25); excluded for 60s"]
    other = "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"
    gate.offend(other, "bad_result", "returned NaN or inf", certain=True)
    assert gate.is_banned(other)


def test_a_sender_refused_several_times_a_second_still_collects_its_strikes():
    """The gap between strikes runs from the last counted strike, not from the last offence: rounds
    a fraction of a second apart (a fast swarm, parts and results refused in one round) must not keep
    a liar one strike short for ever."""
    clock = ManualClock()
    gate = PeerGate(default_ban_seconds=60, clock=clock)
    offences = 0
    while not gate.is_banned(PEER):
        gate.offend(PEER, "oversized_part", "norm 30 > 25")
        offences += 1
        clock.now += 0.4
        assert offences <= 10, "never excluded"
    # strikes at 0.0, 1.2 and 2.4 s: the seventh offence
    assert offences == 7


def test_two_offenders_in_turn_each_collect_their_own_strikes():
    """Two liars refused in alternate rounds: neither may take the other's place on the list (and with it
    its strikes), so both are excluded on their third round with one."""
    clock = ManualClock()
    gate = PeerGate(default_ban_seconds=60, clock=clock)
    other = "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"
    for _ in range(JUDGED_STRIKES):
        for peer in (PEER, other):
            assert not gate.is_banned(peer)
            clock.now += 2.0
            gate.offend(peer, "oversized_part", "norm 30 > 25")
    assert gate.is_banned(PEER) and gate.is_banned(other)
    assert {o.peer_id: o.offences for o in gate.offenders()} == {PEER: JUDGED_STRIKES, other: JUDGED_STRIKES}


def test_a_full_list_keeps_live_bans_and_forgets_the_strike_holder_heard_from_least_recently():
    clock = ManualClock()
    gate = PeerGate(capacity=3, default_ban_seconds=100, clock=clock)
    gate.offend("QmBanned", "bad_state", "x", ban_seconds=math.inf)
    gate.offend("QmOld", "oversized_part", "x")  # one strike, not excluded
    clock.now += 2.0
    gate.offend("QmRecent", "oversized_part", "x")
    clock.now += 2.0
    gate.offend("QmNew", "oversized_part", "x")
    assert {o.peer_id for o in gate.offenders()} == {"QmBanned", "QmRecent", "QmNew"}
    clock.now += STRIKE_WINDOW_SECONDS + 1  # strikes that old count no more: their slots are free again
    gate.offend("QmLater", "oversized_part", "x")
    assert len(gate.offenders()) == 3 and gate.is_banned("QmBanned")
