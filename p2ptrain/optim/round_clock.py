"""DiLoCo's shared round clock: a round ends at the same wall-clock time for every peer, however fast.

With a fixed number of inner steps per peer, a peer at a quarter of the others' speed reaches the
end of its round long after them; their matchmaking finds nobody, each applies only its own
pseudo-gradient and the replicas drift apart.  Instead (the idea of dynamic local updates in
Async Local-SGD, and of hivemind's own sample-counted epochs) a round here ends when the swarm has
processed ``inner_steps x inner_batch_size`` sequences for every peer *of the fastest peer's
speed* (:func:`p2ptrain.trust.pace.effective_peers`): a round lasts about as long as ``inner_steps``
inner steps of the fastest peer, whoever else is in the swarm.  Every peer reports its samples and
its rate through the progress tracker (:mod:`p2ptrain.averaging.progress`), every peer sees the
same swarm totals and the same estimated end time (in DHT time), and every peer stops its inner
steps then.  The fastest peer does about
``inner_steps`` inner steps of ``inner_batch_size``; a slower one trains proportionally fewer
samples, in smaller inner steps (:func:`micro_batches_per_inner_step`), so it too makes about
``inner_steps`` of them; the all-reduce weights each contribution by its samples.  With equal
peers it is the classic fixed-H DiLoCo.  This module holds the arithmetic a peer does with
the clock: its inner-step size, its LR schedule's position, the round its group was ending.

Why the fastest peer's pace: with the round counted per *average* peer, a peer at a quarter of
the speed doubles a two-peer round's samples while adding only a quarter to the swarm's rate, so
the swarm makes far fewer outer steps per second than the fast peer alone, and reaches the same
loss later than the fast peer alone (docs/benchmarks.md, "Tried and dropped").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from p2ptrain.trust.verdicts import MAX_EPOCH

logger = logging.getLogger(__name__)


def micro_batches_per_inner_step(configured: int, own_rate: float, pace: float) -> int:
    """How many micro-batches this peer's inner step takes: the configured number scaled by its share
    of the swarm's pace, rounded up (a peer within 5% of the pace keeps the configured size), at
    least one; the configured number while either rate is unknown.

    Every peer then makes about ``inner_steps`` inner steps a round, however fast.  With the
    configured inner batch, a peer at a quarter of the pace would make a quarter of the steps, and
    the sample-weighted average of a five-step trajectory with a twenty-five-step one shortens the
    fast peer's outer step, so the slow peer's samples barely repay what they cost.  With inner steps
    as many as the fast peer's, its trajectory is about as long, and its samples make the swarm reach
    the fast peer's solo loss sooner than that peer alone (``benchmarks.hetero``; docs/benchmarks.md).
    Rounded up, with a 5% margin: the fastest peer's own rate, measured live, reads a little below
    the pace it published, and must keep the configured size.
    """
    if configured <= 1 or not (math.isfinite(own_rate) and own_rate > 0) or not (math.isfinite(pace) and pace > 0):
        return max(1, configured)
    return max(1, min(configured, math.ceil(configured * own_rate / pace - 0.05)))


def group_round(gathered: Mapping[Any, Any], own: Any) -> int | None:
    """The round the other members of a DiLoCo group said they were ending (each sends its round
    number with its part): the lower median of their claims in ``0..MAX_EPOCH``, so no one member's
    number decides it in a group of three or more; None when no member sent a usable one.

    Matchmaking knows nothing of rounds: a peer whose view of the swarm lagged can end round N after
    the others have moved on, and its round-N control then assembles with their round N+1.  The
    group's round is how it finds out (see :meth:`p2ptrain.optim.diloco.DiLoCoOptimizer._settle_round`).
    """
    claims = sorted(value for peer, value in gathered.items() if peer != own and isinstance(value, int)
                    and not isinstance(value, bool) and 0 <= value <= MAX_EPOCH)
    return claims[(len(claims) - 1) // 2] if claims else None


def met_the_next_round(group: Any, own: Any, epoch: int) -> bool:
    """Whether the round a DiLoCo peer ended as ``epoch`` averaged with a group ending the round after
    it (``group``: what each member sent, by peer): it ended its round late (its view of the swarm
    lagged), and the swarm is a round further than it counts."""
    theirs = group_round(group, own) if isinstance(group, Mapping) else None
    if theirs != epoch + 1:
        return False
    logger.info("our round %d averaged with the swarm's round %d: going on in round %d with it",
                epoch, theirs, theirs + 1)
    return True


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
