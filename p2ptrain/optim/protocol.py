"""The contract between the node and its swarm optimizer (gradient averaging or DiLoCo).

The node loop, the trainer and the rollback guard talk to the optimizer through this protocol
and nothing else, so the loop can be tested with a fake and neither optimizer has to look like
hivemind's internals.  Both implementations (``p2ptrain.optim.gradient.GradientOptimizer`` and
``p2ptrain.optim.diloco.DiLoCoOptimizer``) are built by ``p2ptrain.optim.build.build_optimizer``.

Threading: every method is called from the node's training thread.  ``stats`` is the one
object other threads touch, and it locks for itself (see ``p2ptrain.optim.swarm_stats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from p2ptrain.config.schema import TrainingSection
from p2ptrain.optim.swarm_stats import SwarmStats


@dataclass(frozen=True)
class GlobalProgress:
    """What the swarm's progress looks like to this optimizer."""

    epoch: int = 0
    """The swarm's epoch (DiLoCo: outer round) as far as this optimizer believes it."""
    samples_accumulated: int = 0
    """Samples the swarm has accumulated toward the current epoch."""
    num_peers: int = 0
    """Peers reporting progress, this one included."""
    known: bool = False
    """Whether the swarm's progress has been read from the DHT at least once since start."""
    round_in_flight: bool = False
    """Whether this optimizer's averaging round is running now, in the background of the training
    (overlapped rounds; a round that blocks the training thread is never seen running)."""


@dataclass(frozen=True)
class GuardTargets:
    """What the non-finite rollback watches: tensors that must stay finite, and the torch
    optimizers whose per-parameter state is rolled back together with them."""

    tensors: list[torch.Tensor] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)


class SwarmOptimizer(Protocol):
    """What the node needs from a swarm optimizer."""

    stats: SwarmStats

    @property
    def local_epoch(self) -> int:
        """This node's epoch (DiLoCo: outer round)."""
        ...

    def global_progress(self) -> GlobalProgress:
        ...

    def step(self, batch_size: int) -> None:
        """Apply the gradients of one local micro-batch of ``batch_size`` samples."""
        ...

    def zero_grad(self) -> None:
        ...

    def load_state_from_peers(self) -> bool:
        """Download the swarm's state, bounded in time; True when one was adopted. Never raises."""
        ...

    def join_next_round(self, swarm_epoch: int) -> bool:
        """Catch up with a swarm one epoch ahead without a download, where the mode can (DiLoCo: take
        part in its next round); False, and nothing changed, when it cannot: then download."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume this optimizer: plain dicts, tensors and numbers."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`checkpoint_state` output (epoch, optimizer state, schedule)."""
        ...

    def step_aside(self) -> None:
        """Paused: make sure no peer waits for this node in a round."""
        ...

    def settle(self) -> None:
        """Paused, on each pass of the paused loop: apply averaging that has already landed, without
        waiting for any (a paused node still serves its state)."""
        ...

    def rejoin(self) -> None:
        """Resumed after a pause: be counted in the swarm's rounds again."""
        ...

    def guard_targets(self) -> GuardTargets:
        ...

    def flush(self) -> None:
        """Let any averaging still in flight land (bounded), e.g. before a final evaluation."""
        ...

    def apply_training(self, cfg: TrainingSection) -> None:
        """Adopt the run-wide settings a running node may change (a new manifest version, at an
        epoch boundary: lr and schedule, weight decay, max_grad_norm, target batch size, how often
        state is averaged; see ``p2ptrain.run.updates.LIVE_TRAINING``).  Keeps the optimizer's state."""
        ...

    def shutdown(self) -> None:
        ...
