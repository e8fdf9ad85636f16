"""Scenario 5 - bootstrap peers gone: the first of two initial peers is dead; then all of them are."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from hivemind.p2p import PeerID

from tests.chaos.helpers import log_text, training

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


def _dead_addr(port: int) -> str:
    """A well-formed multiaddr of a peer that does not exist (nothing listens on ``port``)."""
    peer = PeerID(b"\x12\x20" + hashlib.sha256(os.urandom(16)).digest()).to_base58()  # a sha2-256 multihash
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"


def test_joins_through_second_peer_and_fails_cleanly_when_all_are_dead(make_node, chaos_report):
    a = make_node("a")
    a.start()
    alive = a.join_addrs()[0]
    dead = [_dead_addr(1), _dead_addr(9)]
    # Both start at once: one must join through the live peer, the other must give up cleanly.
    b = make_node("b")
    lost = make_node("lost", swarm={"bootstrap_timeout": 8.0})
    started = time.monotonic()
    b.start(join=[dead[0], alive])
    lost.start(join=dead)
    code = lost.wait(90)
    gave_up_after = time.monotonic() - started
    joined = training(b, 120)
    joined_after = time.monotonic() - started
    assert joined.peers_online >= 1
    b.wait_for(lambda s: s.peers_online == 2, 60, "both peers in b's swarm view")

    log = log_text(lost)
    assert code == 1, log
    final = log.strip().splitlines()[-1]
    assert final.startswith("p2ptrain: no initial peer answered after") and "bootstrap_timeout" in final, final
    assert "Traceback" not in log, log
    retries = [line for line in log.splitlines() if "no initial peer answered (attempt" in line]
    delays = [float(line.rsplit("retrying in ", 1)[1].rstrip("s")) for line in retries]
    assert len(delays) >= 2 and delays[1] > delays[0], delays  # exponential backoff
    chaos_report.record("5_bootstrap", seconds_to_training_via_second_peer=round(joined_after, 1),
                        all_dead_exit_code=code, all_dead_seconds_to_exit=round(gave_up_after, 1),
                        retry_delays_seconds=delays, final_line=final)
