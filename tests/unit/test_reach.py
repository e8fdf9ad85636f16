"""Reachability: decided from what libp2p announces and the node's settings, never from an address's mere presence."""

from __future__ import annotations

import pytest

from p2ptrain.config.schema import ConfigError, parse_config
from p2ptrain.status import Reachability
from p2ptrain.swarm.reach import decide, missing_announced

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
