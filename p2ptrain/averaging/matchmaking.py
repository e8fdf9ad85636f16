"""Matchmaking that reads its group's members from the DHT a few times a second, not as fast as the DHT answers.

While an averager looks for its group, hivemind 1.1.12's matchmaking
(``PotentialLeaders._update_queue_periodically``) re-reads the group key as soon as the previous
read returned whenever its queue of leaders is empty or holds a peer that may still join: every
leader, until its group closes, polls in a tight loop.  Each read is a message to the DHT process,
an RPC through p2pd to the other peers and a reply back: hundreds of reads a round, whose CPU in
the helper processes is taken from the peer's own trainer and from the other peers, which answer
every read (docs/benchmarks.md has the figures).

:func:`pace_group_polls` spaces those reads at least :data:`POLL_INTERVAL` apart in one averager
process: a follower then learns of a new leader up to that much later, a small share of any
``matchmaking_time`` (0.5 s on loopback, more on real links).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

#: The least time between two reads of the group key by one averager's matchmaking (seconds).
POLL_INTERVAL = 0.1


def pace_group_polls(matchmaking: Any, interval: float = POLL_INTERVAL) -> None:
    """Make ``matchmaking`` (a hivemind ``Matchmaking``) read its group's members at most once per
    ``interval``; applying it twice changes nothing."""
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

