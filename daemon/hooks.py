"""What the node tells the outside world, and asks of it, at each point of its life.

The node loop calls these methods and nothing else outside training: :class:`NodeHooks` does
nothing (a bare node, a test), ``daemon.service.ServiceHooks`` wires them to the HTTP API, the
DHT peer records, systemd and the volunteer policy.  Keeping that list here means the loop
never grows ``if api_enabled:`` branches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from p2ptrain.status import PauseReason, PeerRecord, SwarmView

if TYPE_CHECKING:
    from p2ptrain.daemon.node import Node


class NodeHooks:
    """No-op hooks. Override what you need; every method must return quickly and never raise."""

    #: Test-only fault injection: called on the model's gradients after each backward pass.
    corrupt_gradients: Callable[[torch.nn.Module], None] | None = None

    def starting(self, node: Node) -> None:
        """The node has its state directory and is about to join the swarm."""

    def record_validators(self, run_id: str) -> list[Any]:
        """hivemind record validators for the DHT (signed peer records)."""
        return []

    def ready(self, node: Node) -> None:
        """Joined and synced: training starts now."""

    def progress(self, node: Node) -> None:
        """One local step completed."""

    def idle(self, node: Node) -> None:
        """One pass of the loop while deliberately not training (paused): the loop itself is alive."""

    def long_operation(self, node: Node, seconds: float) -> None:
        """A blocking operation of up to ``seconds`` is about to run (state download, checkpoint)."""

    def policy_pause_reason(self, node: Node) -> PauseReason:
        """Whether the machine's owner wants the node paused right now (schedule, busy machine)."""
        return PauseReason.NONE

    def exchange_records(self, node: Node, own: PeerRecord) -> SwarmView:
        """Publish our record and return the swarm as the records describe it."""
        return node.swarm_view

    def reload(self, node: Node) -> None:
        """SIGHUP: re-read what can change at run time."""

    def stopping(self, node: Node) -> None:
        """The node is shutting down (called once, whatever the reason)."""
