"""Volunteers at home: one public node and two volunteers, each behind its own NAT router.

The topology is network namespaces made here (:func:`benchmarks.netns.nat_network`): a "WAN" bridge
with the public node at 10.214.0.1 and two routers that masquerade their home network and drop every
connection opened from the WAN, as a home router without forwarded ports does.  The volunteers run on
the default swarm settings (listening on every interface at the default port, relays on), joined to
the public node and nothing else; only the UPnP/NAT-PMP probe is off, as these routers have none.

What a volunteer must get without a NAT setting by hand: it finds out that it cannot be dialled (the
public node's dial-back fails) and says ``client``; it then takes part in full rounds with both
other peers; a restart behind its router does the same again; and when the public node is gone, it
says in one line that the run needs a peer that others can dial.  The public node, relays on, counts
what it relayed (nothing: the clients' rounds go over connections they open).
"""

from __future__ import annotations

import time

import pytest

from benchmarks.netns import NatNet, nat_network, nat_unavailable
from p2ptrain.local.swarm import LocalNode
from p2ptrain.status import StatusSnapshot
from tests.chaos.helpers import log_text, training

#: ``alone``: the share of full rounds is a timing figure (beside two other scenarios it fell to 9 in 10).
pytestmark = [pytest.mark.chaos, pytest.mark.alone, pytest.mark.timeout(420)]

_REASON = nat_unavailable()
PORT = 41400
#: The rounds counted in the window, and the share of them that must be full (all three peers).
WINDOW_ROUNDS = 12
FULL_SHARE = 0.9
STRANDED_LINE = "no peer that others can dial is training"
#: Rounds a few seconds apart, with a second to form each group: a full round needs all three peers
#: ready at once, which the chaos suite's sub-second epochs on a machine shared with other scenarios
#: do not give (this measures the NAT, not the machine's load).
NAT_TRAINING = {"target_batch_size": 1536, "matchmaking_time": 1.0}


def _in_namespace(make_node, name: str, netns: str, **swarm: object) -> LocalNode:
    node = make_node(name, swarm=swarm, training=NAT_TRAINING)
    node.netns = netns
    return node


def _volunteer(make_node, name: str, netns: str) -> LocalNode:
    # The swarm section's defaults, which the loopback harness overrides, put back as a volunteer has them.
    return _in_namespace(make_node, name, netns, listen_addrs=[f"/ip4/0.0.0.0/tcp/{PORT}"], auto_nat=True,
                         use_relay=True, use_auto_relay=True, nat_port_map=False)


def _rounds(status: StatusSnapshot) -> tuple[int, int]:
    """(full rounds, rounds this node took part in) so far."""
    full = status.averaging_rounds_ok_total
    return full, full + status.averaging_rounds_partial_total + status.averaging_rounds_failed_total


def _window(volunteers: list[LocalNode]) -> dict[str, tuple[int, int]]:
    """Full and all rounds of each volunteer over a window of at least :data:`WINDOW_ROUNDS` of its rounds."""
    start = {v.name: _rounds(v.status() or StatusSnapshot()) for v in volunteers}
    ended = {}
    for volunteer in volunteers:
        begun = start[volunteer.name][1]
        ended[volunteer.name] = _rounds(volunteer.wait_for(
            lambda s, b=begun: _rounds(s)[1] >= b + WINDOW_ROUNDS, 10 * WINDOW_ROUNDS, f"{WINDOW_ROUNDS} rounds"))
    return {name: (ended[name][0] - start[name][0], ended[name][1] - start[name][1]) for name in ended}


@pytest.mark.skipif(_REASON is not None, reason=_REASON or "-")
def test_volunteers_behind_nat_average_as_clients_and_say_when_no_reachable_peer_is_left(make_node, chaos_report):
    with nat_network(volunteers=2) as net:
        _scenario(make_node, chaos_report, net)


def _scenario(make_node, chaos_report, net: NatNet) -> None:
    # The public node relays for the run as a public node does by default (use_relay, relay_service).
    public = _in_namespace(make_node, "public", net.public_ns, listen_addrs=[f"/ip4/0.0.0.0/tcp/{PORT}"],
                           announce_addrs=[f"/ip4/{net.public_address}/tcp/{PORT}"], use_relay=True)
    volunteers = [_volunteer(make_node, f"home{i}", home) for i, home in enumerate(net.homes)]
    nodes: list[LocalNode] = [public, *volunteers]
    try:
        public.start()
        join = [a for a in public.join_addrs() if net.public_address in a]
        assert join, public.status()
        for volunteer in volunteers:
            volunteer.start(join=join)
        for node in nodes:
            training(node, 120)
        reach = {n.name: (n.status() or StatusSnapshot()).reachability for n in nodes}
        assert reach == {"public": "public", "home0": "client", "home1": "client"}, reach

        for node in nodes:
            node.wait_for(lambda s: s.peers_online == 3 and s.averaging_rounds_ok_total >= 1, 120,
                          "a full round with three peers")
        rounds = _window(volunteers)
        for name, (full, total) in rounds.items():
            assert full >= FULL_SHARE * total, f"{name}: {full} of {total} rounds full"
        epochs = [(n.status() or StatusSnapshot()).local_epoch for n in nodes]
        assert max(epochs) - min(epochs) <= 2, epochs
        # What the public node relayed is counted, from its p2p daemon's own counters.  Nothing here: the
        # clients average over connections they open themselves, and AutoNAT never finds a node public
        # on these private (RFC 1918) addresses, so libp2p keeps its relay service off.
        relay = public.status() or StatusSnapshot()
        assert relay.relay_active is False and relay.relay_bytes_total == 0, relay

        # A volunteer restarts behind its router: the same identity, the same verdict, rounds again.
        restarted = volunteers[0]
        assert restarted.stop(30) == 0
        restarted.start(join=join)
        before = _rounds(training(restarted, 120))[0]
        status = restarted.wait_for(lambda s: s.averaging_rounds_ok_total >= before + 2 and s.peers_online == 3,
                                    120, "two full rounds after its restart")
        assert status.reachability == "client"

        # The public node leaves: two clients cannot average with each other, and say so once.
        gone = time.monotonic()
        assert public.stop(30) == 0
        for volunteer in volunteers:
            volunteer.wait_for(lambda s, v=volunteer: STRANDED_LINE in log_text(v), 120,
                               "the line that the run needs a reachable peer")
        stranded_seconds = time.monotonic() - gone
        for volunteer in volunteers:
            assert log_text(volunteer).count(STRANDED_LINE) == 1
    finally:
        LocalNode.stop_all(nodes, timeout=10)
    chaos_report.record("nat_volunteers", full_rounds={k: f"{f}/{t}" for k, (f, t) in rounds.items()},
                        epochs=epochs, seconds_to_stranded_line=round(stranded_seconds, 1),
                        public_relay={"active": relay.relay_active, "bytes": relay.relay_bytes_total,
                                      "slots": relay.relay_reservations})
