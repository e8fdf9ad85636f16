"""Matchmaking that reads its group's members ten times per matchmaking time, not as fast as the DHT answers.

While an averager looks for its group, hivemind 1.1.12's matchmaking
(``PotentialLeaders._update_queue_periodically``) re-reads the group key as soon as the previous
read returned whenever its queue of leaders is empty or holds a peer that may still join: every
leader, until its group closes, polls in a tight loop.  Each read is a message to the DHT process,
an RPC through p2pd to the other peers and a reply back: hundreds of reads a round, whose CPU in
the helper processes is taken from the peer's own trainer and from the other peers, which answer
every read (docs/benchmarks.md has the figures).

:func:`pace_group_polls` spaces those reads a tenth of the matchmaking time apart (at least
:data:`POLL_INTERVAL`) in one averager process: a follower then learns of a new leader up to that
much later, a tenth of the time the leader waits for followers anyway.  Each read is answered by the
peers nearest to the group key, for every peer looking for a group, so the reads' pace is what the
swarm's size multiplies (docs/benchmarks.md, ``benchmarks.scale``).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

#: The least time between two reads of the group key by one averager's matchmaking (seconds).
POLL_INTERVAL = 0.1
#: Reads of the group key per matchmaking time, at most.
POLLS_PER_MATCHMAKING = 10


def poll_interval(matchmaking_time: float) -> float:
    """The least time between two reads of the group key, for rounds that wait ``matchmaking_time``."""
    return max(POLL_INTERVAL, matchmaking_time / POLLS_PER_MATCHMAKING)


def pace_group_polls(matchmaking: Any, interval: float | None = None) -> None:
    """Make ``matchmaking`` (a hivemind ``Matchmaking``) read its group's members at most once per
    ``interval`` (default: from its ``min_matchmaking_time``); applying it twice changes nothing."""
    if interval is None:
        interval = poll_interval(matchmaking.min_matchmaking_time)
    keys = matchmaking.group_key_manager
    if getattr(keys, "_p2ptrain_paced", False):
        return
    read = keys.get_averagers
    last_read = [-math.inf]

    async def get_averagers(group_key: Any, only_active: bool) -> Any:
        wait = last_read[0] + interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        last_read[0] = time.monotonic()
        return await read(group_key, only_active)

    keys.get_averagers = get_averagers
    keys._p2ptrain_paced = True

