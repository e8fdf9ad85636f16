"""A node's catch-up before it trains: if the swarm is ahead, download its state; else go on.

In DiLoCo mode a node restarted from its own checkpoint one round behind the swarm joins the next
round instead (the optimizer's ``join_next_round``): no download at all.

The swarm's epoch comes from ``optimizer.global_progress()``, which already prefers what several
peers agree on (``p2ptrain.averaging.robust_progress``); the wait for it is bounded and watches the stopper.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from p2ptrain.daemon.stopper import Stopper
from p2ptrain.optim.protocol import SwarmOptimizer

logger = logging.getLogger(__name__)

#: How long a newcomer waits to read the swarm's progress before deciding whether it is behind.
SYNC_WAIT = 10.0


def sync_with_swarm(optimizer: SwarmOptimizer, stopper: Stopper, clock: Callable[[], float], *,
                    before_download: Callable[[], None], records: threading.Event | None = None,
                    alone: bool = False) -> None:
    """If the swarm is ahead of us, download its state (bounded); else go on from what we have.

    ``before_download`` runs just before a download starts (the node tells the watchdog a long
    operation is coming).  ``records`` is set once the first view of the run's peer records is in:
    with the peer checks a downloaded state is judged against what they report, so the wait covers
    it too (same bound).  ``alone``: this node started the swarm (no initial peers), so nobody can
    be ahead of it yet and the wait is skipped; a peer that joins later and is ahead is caught up
    with by the optimizer, as any node that falls behind.

    ``optimizer.join_next_round(swarm_epoch)`` (DiLoCo joins the swarm's next round; gradient mode
    never can) is tried first when the node already trained (epoch 1 or more, restored from its checkpoint): one
    round behind it takes the swarm's round number and averages its own parameters with the swarm at
    the end of that round, which pulls the two together as after a failed round.  A node at epoch 0
    still downloads: its parameters are the initial ones, and averaging them in would pull the
    swarm's model back towards the start by this node's share."""
    if alone:
        logger.info("in sync with the swarm at epoch %d (this node started it)", optimizer.local_epoch)
        return
    deadline = clock() + SYNC_WAIT
    while (not optimizer.global_progress().known or (records is not None and not records.is_set())) \
            and clock() < deadline:
        if stopper.wait(0.2):
            return
    swarm_epoch = optimizer.global_progress().epoch
    if swarm_epoch > optimizer.local_epoch >= 1 and optimizer.join_next_round(swarm_epoch):
        logger.info("one round behind the swarm: joining its round %d without a download", swarm_epoch)
    elif swarm_epoch > optimizer.local_epoch:
        logger.info("swarm is at epoch %d, we are at %d: downloading state from peers",
                    swarm_epoch, optimizer.local_epoch)
        before_download()
        optimizer.load_state_from_peers()
        logger.info("now at epoch %d", optimizer.local_epoch)
    else:
        logger.info("in sync with the swarm at epoch %d", optimizer.local_epoch)
