"""The peer gate: a ban list shared with forked helpers, offence counts, run admission, one line per offence."""

from __future__ import annotations

import logging
import math
import os

import pytest
from hivemind.p2p import PeerID

from p2ptrain.peergate import OFFENCE_KINDS, PeerGate, peer_name

PEER = "QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_offence_bans_counts_and_logs_one_warning_naming_the_peer(caplog):
    clock = _Clock()
    gate = PeerGate(default_ban_seconds=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="p2ptrain.peergate"):
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
        gate.offend(PEER, "oversized_part", "norm 1e6 > 10")
        os._exit(0)
    os.waitpid(pid, 0)
    assert gate.is_banned(PEER) and gate.version == before + 1
    assert gate.offence_counts()["oversized_part"] == 1


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
