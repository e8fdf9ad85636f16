"""Rejoiner: a peer dropped from the DHT's routing table (as after a partition) is found again."""

from __future__ import annotations

from typing import Any

import hivemind
import pytest

from p2ptrain.swarm.rejoin import Rejoiner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False)


async def _forget_all(_dht: Any, node: Any) -> int:
    """What hivemind does to peers whose requests failed: they leave the routing table."""
    table = node.protocol.routing_table
    uids = list(table.uid_to_peer_id)
    for uid in uids:
        del table[uid]
    return len(uids)


async def _table(_dht: Any, node: Any) -> set[str]:
    return {peer_id.to_base58() for peer_id in node.protocol.routing_table.peer_id_to_uid}


@pytest.fixture
def two_dhts():
    first = hivemind.DHT(start=True, **LOOPBACK)
    second = hivemind.DHT(start=True, initial_peers=[str(a) for a in first.get_visible_maddrs()], **LOOPBACK)
    try:
        yield first, second
    finally:
        second.shutdown()
        first.shutdown()


def test_lost_peer_is_pinged_back_into_both_routing_tables(two_dhts) -> None:
    first, second = two_dhts
    rejoiner = Rejoiner(second, initial_peers=list)
    assert rejoiner.run_pass() == 0  # nothing lost yet: the pass only remembers who is there
    assert str(first.peer_id) in rejoiner.remembered

    assert first.run_coroutine(_forget_all) >= 1 and second.run_coroutine(_forget_all) >= 1
    assert second.run_coroutine(_table) == set()

    assert rejoiner.run_pass() == 1
    assert str(first.peer_id) in second.run_coroutine(_table)
    assert str(second.peer_id) in first.run_coroutine(_table)  # the ping told the other side too
    assert rejoiner.rejoined_total == 1


def test_initial_peer_is_dialled_by_address_when_never_reached(two_dhts) -> None:
    first, second = two_dhts
    second.run_coroutine(_forget_all)
    first_addrs = [str(a) for a in first.get_visible_maddrs()]
    rejoiner = Rejoiner(second, initial_peers=lambda: first_addrs)
    assert rejoiner.run_pass() == 1
    assert str(first.peer_id) in second.run_coroutine(_table)


def test_unreachable_peers_cost_a_bounded_pass() -> None:
    dht = hivemind.DHT(start=True, **LOOPBACK)
    try:
        dead = "/ip4/127.0.0.1/tcp/1/p2p/QmXijwFSu5YZDXdWmwK1iqEVZtWwyQy9jXc9cnzeAtd6hG"
        rejoiner = Rejoiner(dht, initial_peers=lambda: [dead, "not a multiaddr"])
        assert rejoiner.run_pass() == 0
    finally:
        dht.shutdown()
