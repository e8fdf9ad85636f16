"""DiLoCo's round target: a round's samples grow with the peers reporting progress, by their speed.

The progress tracker (:class:`p2ptrain.averaging.progress.SwarmProgressTracker`) asks its
:class:`RoundTarget` for its target (and so its estimated end of round) each time it reads the
swarm's progress.  The arithmetic lives in :mod:`p2ptrain.trust.pace`; what a peer does with the clock
in :mod:`p2ptrain.optim.round_clock`.  No hivemind here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from p2ptrain.trust.pace import round_target, swarm_pace


class RoundTarget:
    """``per_peer_samples`` is the round length of one peer at the swarm's pace; the target is that times
    :func:`~p2ptrain.trust.pace.effective_peers` of the peers reporting progress (client-mode peers
    train too; paused peers withdraw their entry and do not count)."""

    def __init__(self, per_peer_samples: int) -> None:
        self.per_peer_samples = per_peer_samples
        #: The swarm's pace (:func:`~p2ptrain.trust.pace.swarm_pace`) at the last reading: this peer sizes
        #: its inner steps by it.
        self.pace = 0.0

    def update(self, rates: Sequence[float]) -> int:
        """The round's target for the peers' (bounded) rates; the pace is kept."""
        self.pace = swarm_pace(rates)
        return round_target(self.per_peer_samples, rates)


def claimed_rate(value: Any) -> float:
    """The rate a progress entry's value claims (0.0: none, or not a number)."""
    rate = value.get("samples_per_second") if isinstance(value, dict) else None
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else 0.0
