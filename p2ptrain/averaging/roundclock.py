"""DiLoCo's round clock over hivemind's progress tracker: the round target grows with the peers, by speed.

The clock's arithmetic lives without hivemind: the pace and the peers' worth in
:mod:`p2ptrain.trust.pace`, what a peer does with the clock in :mod:`p2ptrain.optim.round_clock`.
Here the tracker's target (and so its estimated end of round) is set from the rates the peers report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hivemind.optim.progress_tracker import GlobalTrainingProgress, ProgressTracker

from p2ptrain.averaging.paced_progress import PacedReports
from p2ptrain.averaging.robust_progress import RobustProgressTracker
from p2ptrain.trust.pace import round_target, swarm_pace


class _RoundTarget:
    """Put before a hivemind progress tracker: its target grows with the training peers, by speed.

    ``per_peer_samples`` is the round length of one peer at the swarm's pace; the tracker's target
    (and so its estimated end of round, ``estimated_next_update_time``) is that times
    :func:`~p2ptrain.trust.pace.effective_peers` of the peers reporting progress (client-mode peers
    train too; paused peers withdraw their entry and do not count).
    """

    target_batch_size: int
    #: The swarm's pace (:func:`~p2ptrain.trust.pace.swarm_pace`) at the last reading: this peer sizes
    #: its inner steps by it.
    pace: float = 0.0

    def __init__(self, *args: Any, per_peer_samples: int, **kwargs: Any) -> None:
        self.per_peer_samples = per_peer_samples
        super().__init__(*args, target_batch_size=per_peer_samples, **kwargs)  # type: ignore[call-arg]

    def _set_round_target(self, rates: Sequence[float]) -> None:
        self.pace = swarm_pace(rates)
        self.target_batch_size = round_target(self.per_peer_samples, rates)


def _claimed_rate(value: Any) -> float:
    rate = value.get("samples_per_second") if isinstance(value, dict) else None
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else 0.0


class SwarmRoundTracker(_RoundTarget, PacedReports, ProgressTracker):
    """hivemind's progress tracker (every entry counts, the highest epoch wins; reported about once a
    second) with the round target."""

    def _parse_swarm_progress_data(self, metadata: Any) -> GlobalTrainingProgress:
        values = [getattr(entry, "value", None) for entry in metadata.values()] if isinstance(metadata, dict) else []
        self._set_round_target([_claimed_rate(value) for value in values if value is not None])
        return super()._parse_swarm_progress_data(metadata)


class RobustRoundTracker(_RoundTarget, RobustProgressTracker):
    """:class:`p2ptrain.averaging.robust_progress.RobustProgressTracker` (bound, gated entries; an epoch several
    peers agree on) with the round target counted over the peers it believes."""
