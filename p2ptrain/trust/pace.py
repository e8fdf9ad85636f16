"""The pace of a DiLoCo round from the rates peers claim: the fastest, but no faster than the others allow.

A round ends when the swarm has processed a round's samples for every peer *of the fastest peer's
speed* (:mod:`p2ptrain.optim.round_clock` explains why).  Each rate is a peer's own claim, so the pace
believes the fastest one only up to :data:`SPREAD` times the lower median: a peer that claims to be far
faster than the others cannot shorten every round on its word alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: The pace of a round is the fastest rate, but at most this many times the lower median rate: a
#: peer that claims to be far faster than the others cannot shorten every round on its word alone
#: (each peer it out-claims then counts as 1 / SPREAD of a peer, not as nothing).
SPREAD = 4.0


def _measured(rates: Sequence[float]) -> list[float]:
    return [rate for rate in rates if math.isfinite(rate) and rate > 0]


def swarm_pace(rates: Sequence[float]) -> float:
    """The rate a round is paced by: the fastest measured rate, at most :data:`SPREAD` x the lower
    median; 0.0 while no peer has measured its rate."""
    known = _measured(rates)
    return min(max(known), SPREAD * statistics.median_low(known)) if known else 0.0


def effective_peers(rates: Sequence[float]) -> float:
    """How many peers of the fastest one's speed the swarm is worth: the sum of ``rate / pace``,
    each at most 1 (:func:`swarm_pace`).  A peer that has not measured its rate yet (0, or not a
    number) counts as a whole peer, as do all of them when none has; never less than 1."""
    known = _measured(rates)
    unknown = len(rates) - len(known)
    if not known:
        return float(max(1, unknown))
    pace = swarm_pace(known)
    return max(1.0, unknown + sum(min(1.0, rate / pace) for rate in known))


def round_target(per_peer_samples: int, rates: Sequence[float]) -> int:
    """A round's samples for the swarm: one peer's round at the swarm's pace times :func:`effective_peers`
    of the peers reporting (never less than one peer's round)."""
    return max(per_peer_samples, round(per_peer_samples * effective_peers(rates)))
