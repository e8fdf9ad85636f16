"""What the node tells the outside world, and asks of it, at each point of its life.

The node calls these methods and nothing else outside training: :class:`NodeHooks` does nothing
(a bare node, a test), ``daemon.service.ServiceHooks`` wires them to the HTTP API, the DHT peer
records, systemd and the volunteer policy.  Data flows one way: hooks get read-only facts (the
latest snapshot holder, the DHT handle) and hand back values (a pause reason, a swarm view, a
reloaded config) that the node applies itself; no hook ever sees or changes the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import NodeConfig
from p2ptrain.daemon.control import ControlQueue
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.status import LatestSnapshot, PauseReason, SwarmView


@dataclass(frozen=True)
class NodeOutlets:
    """What a node offers its services before it joins: where snapshots, logs and control go."""

    state_dir: Path
    latest: LatestSnapshot
    """Published by the node only; services read it."""
    logs: LogRing
    control: ControlQueue
    """Services only submit to it; the node drains it between steps."""


@dataclass(frozen=True)
class SwarmPresence:
    """What a node is in the swarm once it has joined."""

    dht: Any
    run_id: str
    peer_id: str
    #: The node's :class:`p2ptrain.trust.evidence.PeerEvidence` (None: its peer checks are off); the peer
    #: records read are handed to it.
    evidence: Any = None


class NodeHooks:
    """No-op hooks. Override what you need; every method must return quickly and never raise."""

    def starting(self, outlets: NodeOutlets) -> None:
        """The node has its state directory and is about to join the swarm."""

    def record_validators(self, run_id: str) -> list[Any]:
        """hivemind record validators for the DHT (signed peer records)."""
        return []

    def joined(self, presence: SwarmPresence) -> bool:
        """Joined the swarm; the model is built and synced next.  True when peer records are read from
        now on (and handed to ``presence.evidence``): the node then waits for a first view of them."""
        return False

    def ready(self, presence: SwarmPresence) -> None:
        """Joined and synced: training starts now."""

    def progress(self) -> None:
        """One local step completed."""

    def idle(self) -> None:
        """One pass of the loop while deliberately not training (paused): the loop itself is alive."""

    def long_operation(self, seconds: float) -> None:
        """A blocking operation of up to ``seconds`` is about to run (state download, checkpoint)."""

    def policy_pause_reason(self) -> PauseReason:
        """Whether the machine's owner wants the node paused right now (schedule, busy machine)."""
        return PauseReason.NONE

    def swarm_view(self) -> SwarmView | None:
        """The swarm as the peer records describe it (None: no records are read)."""
        return None

    def reload(self, current: NodeConfig) -> NodeConfig | None:
        """SIGHUP: read the configuration again.  Returns the config to run with from now on (the
        node applies what can change at run time), or None to keep ``current``."""
        return None

    def stopping(self) -> None:
        """The node is shutting down (called once, whatever the reason)."""
