"""Find lost peers again: after a partition or a long outage, nobody else would.

hivemind's DHT drops a peer from its routing table once requests to it fail, and never asks for it
again; two halves of a swarm that lost their link therefore stay two swarms after the link comes
back.  :class:`Rejoiner` remembers every peer this node's DHT has known (and the initial peers it
is configured with, reloads included) and, every ``period`` seconds, pings the ones that are missing
from the routing table.
A ping that gets through puts both ends back into each other's routing tables (libp2p dials the
peer from the addresses it learned earlier), and training progress flows again.

The memory is bounded (``MAX_REMEMBERED`` peers, each forgotten ``FORGET_AFTER`` seconds after it
was last seen) and so is each pass (``MAX_PINGS`` pings, each cut off after ``PING_TIMEOUT``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

MAX_REMEMBERED = 64
FORGET_AFTER = 600.0
MAX_PINGS = 16
PING_TIMEOUT = 5.0


async def _rejoin_pass(dht: Any, node: Any, missing: Sequence[str], initial: Sequence[str]) -> tuple[list[str], int]:
    """Runs inside the DHT process: ping ``missing`` peers (and dial ``initial`` multiaddrs).

    Returns the routing table's peer IDs after the pass and how many lost peers answered.
    """
    from hivemind.p2p import PeerID
    from multiaddr import Multiaddr

    async def ping(peer_id: PeerID, maddr: str | None) -> bool:
        try:
            if maddr is not None:  # an initial peer we may never have reached: dial its address first
                await asyncio.wait_for(node.p2p._client.connect(peer_id, [Multiaddr(maddr)]), PING_TIMEOUT)
            return await asyncio.wait_for(node.protocol.call_ping(peer_id), PING_TIMEOUT) is not None
        except Exception:  # an unreachable peer is the normal case here
            return False

    table = node.protocol.routing_table
    targets: dict[str, tuple[PeerID, str | None]] = {}
    for maddr in initial:
        try:
            peer_id = PeerID.from_base58(Multiaddr(maddr).value_for_protocol("p2p"))
        except Exception:
            continue
        if peer_id not in table and peer_id != node.peer_id:
            targets.setdefault(peer_id.to_base58(), (peer_id, maddr))
    for text in missing:
        peer_id = PeerID.from_base58(text)
        if peer_id not in table:
            targets.setdefault(text, (peer_id, None))
    answers = await asyncio.gather(*(ping(pid, maddr) for pid, maddr in list(targets.values())[:MAX_PINGS]))
    return [pid.to_base58() for pid in table.peer_id_to_uid], sum(answers)


class Rejoiner:
    """A thread that keeps the node's DHT in touch with every peer it has met (see module docstring)."""

    def __init__(self, dht: Any, initial_peers: Callable[[], Sequence[str]], period: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``initial_peers`` is asked on every pass, so peers added by a config reload are dialled too."""
        self.dht = dht
        self.initial_peers = initial_peers
        self.period = period
        self.clock = clock
        self.remembered: dict[str, float] = {}
        self.rejoined_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2ptrain-rejoin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=PING_TIMEOUT + 2)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.run_pass()
            except Exception as exc:  # the DHT shutting down under us, mostly
                logger.debug("rejoin pass failed: %r", exc)

    def run_pass(self) -> int:
        """One pass: ping the lost peers, remember the present ones; returns how many answered."""
        now = self.clock()
        self.remembered = {p: seen for p, seen in self.remembered.items() if now - seen < FORGET_AFTER}
        lost = sorted(self.remembered, key=self.remembered.__getitem__, reverse=True)
        present, answered = self.dht.run_coroutine(_PassCall(lost, self.initial_peers()))
        for peer_id in present:
            self.remembered[peer_id] = now
        if len(self.remembered) > MAX_REMEMBERED:
            newest = sorted(self.remembered.items(), key=lambda item: item[1], reverse=True)[:MAX_REMEMBERED]
            self.remembered = dict(newest)
        if answered:
            self.rejoined_total += answered
            logger.info("found %d lost peer(s) again", answered)
        return answered


class _PassCall:
    """A picklable ``run_coroutine`` callable (it crosses into the DHT process)."""

    def __init__(self, missing: Sequence[str], initial: Sequence[str]) -> None:
        self.missing, self.initial = list(missing), list(initial)

    async def __call__(self, dht: Any, node: Any) -> tuple[list[str], int]:
        return await _rejoin_pass(dht, node, self.missing, self.initial)
