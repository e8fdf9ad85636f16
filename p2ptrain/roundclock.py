"""DiLoCo's shared round clock: a round ends at the same wall-clock time for every peer, however fast.

With a fixed number of inner steps per peer, a peer at a quarter of the others' speed reaches the
end of its round long after them; their matchmaking finds nobody, each applies only its own
pseudo-gradient and the replicas drift apart.  Instead (the idea of dynamic local updates in
Async Local-SGD, and of hivemind's own sample-counted epochs) a round here ends when the swarm has
processed ``inner_steps x inner_batch_size`` sequences *per peer on average*: every peer reports
its samples through hivemind's progress tracker, every peer sees the same swarm total and the
same estimated end time (in DHT time), and every peer stops its inner steps then.  A fast peer
does more inner steps than ``inner_steps``, a slow one fewer, and the all-reduce weights each
pseudo-gradient by its samples.  With equal peers it is the classic fixed-H DiLoCo.
"""

from __future__ import annotations

from typing import Any

import torch
from hivemind.optim.progress_tracker import GlobalTrainingProgress, ProgressTracker

from p2ptrain.robustprogress import RobustProgressTracker


class _RoundTarget:
    """Put before a hivemind progress tracker: its target grows with the number of training peers.

    ``per_peer_samples`` is the round length of one average peer; the tracker's target (and so its
    estimated end of round, ``estimated_next_update_time``) is that times the peers reporting
    progress (client-mode peers train too; paused peers withdraw their entry and do not count).
    """

    target_batch_size: int

    def __init__(self, *args: Any, per_peer_samples: int, **kwargs: Any) -> None:
        self.per_peer_samples = per_peer_samples
        super().__init__(*args, target_batch_size=per_peer_samples, **kwargs)  # type: ignore[call-arg]

    def _set_round_target(self, num_peers: int) -> None:
        self.target_batch_size = self.per_peer_samples * max(1, num_peers)


class SwarmRoundTracker(_RoundTarget, ProgressTracker):
    """hivemind's progress tracker (every entry counts, the highest epoch wins) with the round target."""

    def _parse_swarm_progress_data(self, metadata: Any) -> GlobalTrainingProgress:
        peers = [entry for entry in metadata.values() if getattr(entry, "value", None) is not None] \
            if isinstance(metadata, dict) else []
        self._set_round_target(len(peers))
        return super()._parse_swarm_progress_data(metadata)


class RobustRoundTracker(_RoundTarget, RobustProgressTracker):
    """:class:`p2ptrain.robustprogress.RobustProgressTracker` (bound, gated entries; an epoch several
    peers agree on) with the round target counted over the peers it believes."""


def schedule_position(epoch: int, inner_step: int, inner_steps: int) -> int:
    """Where the inner LR schedule stands: the same for every peer at the same point of a round,
    however many inner steps it manages (a fast peer stays at the round's last position)."""
    return max(0, epoch) * inner_steps + min(max(0, inner_step), inner_steps - 1)


def set_schedule_position(scheduler: torch.optim.lr_scheduler.LambdaLR, position: int) -> None:
    """Jump a LambdaLR to ``position`` in O(1) (``scheduler.step()`` in a loop is O(position))."""
    scheduler.last_epoch = position
    lrs = [base * factor(position) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports
