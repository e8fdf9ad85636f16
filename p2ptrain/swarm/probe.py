"""Ask a few peers of a swarm what time it is and whether they can dial us back: ``p2ptrain doctor``'s
one look at the swarm.

It starts a throwaway DHT peer (a fresh identity, never the node's, so it runs beside a live node)
and sends each peer one hivemind DHT ping with ``validate``: the reply carries the peer's DHT clock
(``get_dht_time``, its wall clock), and ``validate`` makes the peer ping the sender back before it
answers.  The clock offset is the peer's time minus the middle of our request's round trip, so it
is good to half the round trip.  A peer that dials back over the connection our ping opened proves
only that our DHT answers; the peers that answered are then asked to open a new connection to the
probe's port (:mod:`p2ptrain.swarm.dialback`, the check a node makes at start), which is what a home
router without a forwarded port drops.

The DHT's creation does not ping the peers itself (hivemind would refuse to start with a clock
that is off by more than :data:`MAX_CLOCK_OFFSET`, which is what this probe is there to report).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import hivemind
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils import get_dht_time
from hivemind.utils.timed_storage import MAX_DHT_TIME_DISCREPANCY_SECONDS
from multiaddr import Multiaddr

from p2ptrain.swarm.dialback import Dialback, ask_dialback

logger = logging.getLogger(__name__)

#: The largest clock difference hivemind's DHT accepts from a peer it joins through (it refuses to
#: start beyond it), and so the largest a node may have.
MAX_CLOCK_OFFSET = float(MAX_DHT_TIME_DISCREPANCY_SECONDS)


@dataclass(frozen=True)
class PeerAnswer:
    """One peer's reply to the probe's ping (``offset`` None: it did not answer, ``error`` says why)."""

    peer: str
    offset: float | None = None
    """The peer's clock minus ours, seconds."""
    round_trip: float | None = None
    dialled_back: bool | None = None
    """Whether the peer reached our DHT when it pinged us back."""
    error: str = ""


@dataclass(frozen=True)
class SwarmProbe:
    """What the probe saw: an answer per peer, or ``error`` when its own DHT could not start."""

    answers: tuple[PeerAnswer, ...] = ()
    listen: tuple[str, ...] = ()
    error: str = ""
    dialback: Dialback = Dialback(None)
    """Whether a peer that answered could open a new connection to the probe's port (None: none could say)."""

    @property
    def answered(self) -> list[PeerAnswer]:
        return [answer for answer in self.answers if answer.offset is not None]


async def _ping_peers(peer_ids: Sequence[str], timeout: float, _dht: Any, node: Any) -> list[tuple[Any, ...]]:
    """Runs inside the DHT's process: one validating ping per peer, timed on the DHT clock."""

    async def ping(peer_id: str) -> tuple[Any, ...]:
        request = dht_pb2.PingRequest(peer=node.protocol.node_info, validate=True)
        sent = get_dht_time()
        try:
            response = await asyncio.wait_for(
                node.protocol.get_stub(PeerID.from_base58(peer_id)).rpc_ping(request, timeout=timeout), timeout)
        except Exception as exc:  # a peer that is gone, refuses or times out: one answer, not a crash
            return peer_id, None, None, None, f"{type(exc).__name__}: {str(exc)[:120]}".rstrip(": ")
        received = get_dht_time()
        if not response.dht_time:
            return peer_id, None, received - sent, bool(response.available), "the peer sent no clock"
        return peer_id, response.dht_time - (sent + received) / 2, received - sent, bool(response.available), ""

    return list(await asyncio.gather(*(ping(peer) for peer in peer_ids)))


def peer_id_of(maddr: str) -> str | None:
    """The ``/p2p/<id>`` of a multiaddr, or None."""
    try:
        return str(Multiaddr(maddr).value_for_protocol("p2p"))
    except Exception:  # py-multiaddr raises several unrelated exception types
        return None


def probe_swarm(peers: Sequence[str], listen: Sequence[str], *, timeout: float = 10.0,
                dht_options: dict[str, Any] | None = None,
                dht_factory: Callable[..., Any] = hivemind.DHT) -> SwarmProbe:
    """Ping each of ``peers`` (multiaddrs with ``/p2p/<id>``) from a throwaway DHT listening on ``listen``.

    Bounded by ``timeout`` for the pings (the DHT's start has its own bound, hivemind's
    ``wait_timeout``); never raises for the swarm's sake: what went wrong is in the result.
    """
    targets = [(maddr, peer_id_of(maddr)) for maddr in peers]
    named = [peer_id for _, peer_id in targets if peer_id]
    options = {"nat_port_map": False, "auto_nat": False, **(dht_options or {})}
    try:
        dht = dht_factory(initial_peers=list(peers), host_maddrs=list(listen), start=True,
                          ensure_bootstrap_success=False, strict=False, wait_timeout=timeout, **options)
    except Exception as exc:  # a port taken, a p2pd that would not start: the probe's own failure
        return SwarmProbe(error=f"cannot start a DHT peer on {', '.join(listen)}: {str(exc).splitlines()[-1][:200]}")
    try:
        listening = tuple(str(addr) for addr in dht.get_visible_maddrs())
        replies = dht.run_coroutine(functools.partial(_ping_peers, named, timeout)) if named else []
        answered = [reply[0] for reply in replies if reply[1] is not None]
        dialback = ask_dialback(dht, answered, listening) if answered else Dialback(None)
    except Exception as exc:
        return SwarmProbe(error=f"the probe's DHT failed: {str(exc).splitlines()[-1][:200]}")
    finally:
        dht.shutdown()
    by_id = {reply[0]: reply for reply in replies}
    answers = []
    for maddr, peer_id in targets:
        if peer_id is None:
            answers.append(PeerAnswer(maddr, error="no /p2p/<peer id> in the address"))
            continue
        _, offset, round_trip, dialled_back, error = by_id[peer_id]
        answers.append(PeerAnswer(maddr, offset, round_trip, dialled_back, error))
    return SwarmProbe(tuple(answers), listening, dialback=dialback)
