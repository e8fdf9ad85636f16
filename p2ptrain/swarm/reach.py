"""How other peers reach this node: the decision from what libp2p reports, and the one line that says it.

The decision used to be guessed from address strings in the daemon, and every node with an address
claimed to be dialled directly, NATed or not.  Here a node is ``public`` only when an address it
announces (``swarm.announce_addrs``, e.g. a forwarded port) is among the addresses libp2p listens on
and announces, ``relayed`` when libp2p holds a circuit relay reservation (an address through
``/p2p-circuit``), ``client`` in client mode (dials out, accepts nothing) and ``unknown`` otherwise:
nothing has shown that a peer can dial it.
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
            return "reachability: client; this node dials out only and averages through reachable peers"
        where = f" (listening on {self.address})" if self.address else ""
        return (f"reachability: unknown{where}; if peers cannot dial this node, forward its port and set "
                "swarm.announce_addrs, or set swarm.client_mode")


def decide(maddrs: Sequence[str], *, client_mode: bool, announce: Sequence[str] = ()) -> Reach:
    """What ``maddrs`` (the node's visible multiaddrs) and its settings say about its reachability."""
    if client_mode:
        return Reach(Reachability.CLIENT)
    relayed = [addr for addr in maddrs if "/p2p-circuit" in addr]
    announced = [addr for addr in maddrs if announce and any(addr.startswith(a.rstrip("/")) for a in announce)]
    if announced:
        return Reach(Reachability.PUBLIC, announced[0])
    if relayed:
        return Reach(Reachability.RELAYED, relayed[0])
    direct = [addr for addr in maddrs if not addr.startswith(_LOOPBACK)] or list(maddrs)
    return Reach(Reachability.UNKNOWN, direct[0] if direct else "")


def missing_announced(maddrs: Sequence[str], announce: Sequence[str]) -> list[str]:
    """The announced addresses libp2p does not announce (so peers will not learn them)."""
    return [a for a in announce if not any(addr.startswith(a.rstrip("/")) for addr in maddrs)]
