"""How other peers reach this node: the decision from what libp2p reports and what a peer found when
it dialled back, and the lines that say it.

A node is ``public`` when an address it announces (``swarm.announce_addrs``, e.g. a forwarded port)
is among the addresses libp2p listens on and announces, or when a peer it joined through opened a
connection to it (:mod:`p2ptrain.swarm.dialback`); ``client`` in client mode, and when the peers it
asked could not connect: it then averages as a client, through peers that can be dialled;
``relayed`` when libp2p holds a circuit relay reservation (an address through ``/p2p-circuit``);
``unknown`` when nothing has shown either way.  A client swarm needs at least one peer others can
dial: :class:`ReachablePeerWatch` says so, once, when none is online.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from p2ptrain.status import Reachability

_LOOPBACK = ("/ip4/127.", "/ip6/::1/")


@dataclass(frozen=True)
class Reach:
    """The decision and the address others dial ("" when there is none to give)."""

    state: Reachability
    address: str = ""

    def line(self) -> str:
        """The one INFO line: what the node is and what it means for the run."""
        if self.state == Reachability.PUBLIC:
            return f"reachability: public; peers dial {self.address}"
        if self.state == Reachability.RELAYED:
            return f"reachability: relayed; peers dial {self.address} (through a relay on a public peer)"
        if self.state == Reachability.CLIENT:
            tried = f" (a peer could not connect to {self.address})" if self.address else ""
            return (f"reachability: client{tried}; this node dials out only and averages through peers that "
                    "can be dialled; to accept connections, forward its TCP port to this machine and set "
                    "swarm.announce_addrs")
        where = f" (listening on {self.address})" if self.address else ""
        return (f"reachability: unknown{where}; if peers cannot dial this node, forward its port and set "
                "swarm.announce_addrs, or set swarm.client_mode")


def decide(maddrs: Sequence[str], *, client_mode: bool, announce: Sequence[str] = (),
           dialable: bool | None = None, dialed: str = "") -> Reach:
    """What ``maddrs`` (the node's visible multiaddrs), its settings and a peer's dial-back (``dialable``,
    at ``dialed``: the ``ip:port`` a peer connected to or the IP it tried) say about its reachability."""
    if client_mode or dialable is False:
        return Reach(Reachability.CLIENT, dialed)
    relayed = [addr for addr in maddrs if "/p2p-circuit" in addr]
    announced = [addr for addr in maddrs if announce and any(addr.startswith(a.rstrip("/")) for a in announce)]
    if announced:
        return Reach(Reachability.PUBLIC, announced[0])
    if dialable and dialed:
        return Reach(Reachability.PUBLIC, _as_multiaddr(dialed) + _peer_suffix(maddrs))
    if relayed:
        return Reach(Reachability.RELAYED, relayed[0])
    direct = [addr for addr in maddrs if not addr.startswith(_LOOPBACK)] or list(maddrs)
    return Reach(Reachability.UNKNOWN, direct[0] if direct else "")


def _as_multiaddr(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"/{'ip6' if ':' in host else 'ip4'}/{host}/tcp/{port}"


def _peer_suffix(maddrs: Sequence[str]) -> str:
    """``/p2p/<peer id>`` as the visible addresses end (so the address shown is one to join with), or ""."""
    direct = [addr for addr in maddrs if "/p2p-circuit" not in addr and "/p2p/" in addr]
    return direct[0][direct[0].rindex("/p2p/"):] if direct else ""


class ReachablePeerWatch:
    """Says, once, that a client node's rounds cannot happen: no peer that others can dial is training
    (an averaging group needs one to connect its clients), and once again when one is back.

    The first line waits for ``grace`` seconds of that state: a public peer's record missing from one
    read of the swarm view, or not yet published at start, is weather, not news.
    """

    def __init__(self, grace: float = 10.0) -> None:
        self._grace = grace
        self._since: float | None = None
        self._said = False

    def observe(self, reachable: int, training: int, now: float) -> str | None:
        """The line to log when the state changes (None: nothing to say).  ``reachable``: peers training
        that others can dial; ``training``: peers training, this node included; ``now``: a monotonic clock."""
        if reachable > 0:
            self._since = None
            if not self._said:
                return None
            self._said = False
            return f"a peer that others can dial is training again ({reachable} of {training}): averaging resumes"
        if self._since is None:
            self._since = now
        if self._said or now - self._since < self._grace:
            return None
        self._said = True
        return (f"no peer that others can dial is training (of {training} seen training, all clients): averaging "
                "needs at least one reachable peer in the run (a public machine, or a forwarded port with "
                "swarm.announce_addrs); training goes on locally until one joins")


def missing_announced(maddrs: Sequence[str], announce: Sequence[str]) -> list[str]:
    """The announced addresses libp2p does not announce (so peers will not learn them)."""
    return [a for a in announce if not any(addr.startswith(a.rstrip("/")) for addr in maddrs)]
