"""Reachability: decided from what libp2p announces and the node's settings, never from an address's mere presence."""

from __future__ import annotations

import pytest

from p2ptrain.config.schema import ConfigError, parse_config
from p2ptrain.status import Reachability
from p2ptrain.swarm.reach import ReachablePeerWatch, decide, missing_announced

PEER = "/p2p/QmPeer"
LAN = "/ip4/192.168.1.20/tcp/41400"
CIRCUIT = "/ip4/203.0.113.5/tcp/41400/p2p/QmRelay/p2p-circuit"


def test_a_lan_address_alone_is_unknown_not_direct() -> None:
    reach = decide([LAN, "/ip4/127.0.0.1/tcp/41400"], client_mode=False)
    assert reach.state == Reachability.UNKNOWN
    assert reach.address == LAN
    assert "forward its port" in reach.line() and "swarm.announce_addrs" in reach.line()


def test_a_circuit_address_is_relayed_and_is_the_address_to_dial() -> None:
    reach = decide([LAN, CIRCUIT], client_mode=False)
    assert (reach.state, reach.address) == (Reachability.RELAYED, CIRCUIT)
    assert CIRCUIT in reach.line()


def test_an_announced_address_libp2p_announces_is_public() -> None:
    announced = "/ip4/203.0.113.9/tcp/41400"
    reach = decide([LAN, announced + PEER, CIRCUIT], client_mode=False, announce=[announced])
    assert (reach.state, reach.address) == (Reachability.PUBLIC, announced + PEER)
    assert missing_announced([LAN, announced + PEER], [announced]) == []


def test_an_announced_address_libp2p_does_not_announce_is_reported_missing() -> None:
    announced = "/ip4/203.0.113.9/tcp/41400"
    assert decide([LAN], client_mode=False, announce=[announced]).state == Reachability.UNKNOWN
    assert missing_announced([LAN], [announced]) == [announced]


def test_client_mode_is_client_whatever_the_addresses() -> None:
    assert decide([CIRCUIT], client_mode=True).state == Reachability.CLIENT
    assert decide([], client_mode=False).state == Reachability.UNKNOWN


@pytest.mark.parametrize(("addr", "message"), [
    ("/ip4/0.0.0.0/tcp/41400", "not a wildcard"),
    ("/ip4/203.0.113.9/tcp/0", "explicit port"),
])
def test_announce_addrs_must_be_dialable(addr: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"swarm.announce_addrs.*{message}"):
        parse_config({"swarm": {"announce_addrs": [addr]}}, "node.toml", environ={})


def test_relays_must_name_their_peer() -> None:
    with pytest.raises(ConfigError, match="swarm.relays"):
        parse_config({"swarm": {"relays": ["/ip4/203.0.113.5/tcp/41400"]}}, "node.toml", environ={})


def test_a_peer_that_connected_back_makes_the_node_public_at_the_address_it_dialled() -> None:
    reach = decide([LAN], client_mode=False, dialable=True, dialed="198.51.100.7:41400")
    assert (reach.state, reach.address) == (Reachability.PUBLIC, "/ip4/198.51.100.7/tcp/41400")
    joinable = decide([CIRCUIT + PEER, LAN + PEER], client_mode=False, dialable=True, dialed="198.51.100.7:41400")
    assert joinable.address == "/ip4/198.51.100.7/tcp/41400" + PEER  # an address to join with


def test_a_peer_that_could_not_connect_makes_the_node_a_client_even_with_a_relay_address() -> None:
    reach = decide([LAN, CIRCUIT], client_mode=False, dialable=False, dialed="198.51.100.7")
    assert (reach.state, reach.address) == (Reachability.CLIENT, "198.51.100.7")
    assert "could not connect to 198.51.100.7" in reach.line() and "swarm.announce_addrs" in reach.line()


def test_an_announced_address_outranks_a_dial_back_that_found_another() -> None:
    announced = "/ip4/203.0.113.9/tcp/41400"
    reach = decide([announced + PEER], client_mode=False, announce=[announced], dialable=True, dialed="10.0.0.2:1")
    assert reach.address == announced + PEER


def test_no_answer_leaves_what_libp2p_shows() -> None:
    assert decide([LAN, CIRCUIT], client_mode=False, dialable=None).state == Reachability.RELAYED


def test_the_watch_speaks_once_after_its_grace_and_once_when_a_reachable_peer_is_back() -> None:
    watch = ReachablePeerWatch(grace=20.0)
    assert watch.observe(reachable=1, training=3, now=0.0) is None  # a reachable peer: nothing to say
    assert watch.observe(reachable=0, training=2, now=1.0) is None  # not yet: a record can miss one read
    assert watch.observe(reachable=1, training=3, now=5.0) is None  # it was weather
    assert watch.observe(reachable=0, training=2, now=6.0) is None
    stranded = watch.observe(reachable=0, training=2, now=26.0)
    assert stranded is not None and "at least one reachable peer" in stranded and "of 2 seen training" in stranded
    assert watch.observe(reachable=0, training=1, now=60.0) is None  # said already
    back = watch.observe(reachable=1, training=3, now=61.0)
    assert back is not None and "averaging resumes" in back
    assert watch.observe(reachable=1, training=3, now=62.0) is None
