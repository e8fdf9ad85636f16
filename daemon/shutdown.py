"""How a node (or ``p2ptrain fetch``) leaves: land the round in flight, close what it owns within a
deadline, and if closing hangs, stop every helper process and end the process with the exit code it
has earned; then end the process without the interpreter's shutdown.

hivemind can hang in a round or in its helpers' teardown; the final checkpoint is written before
any of this runs, so cutting the shutdown short loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.optim.round_stats import RoundStats
from p2ptrain.proc import descendants, signal_all

logger = logging.getLogger(__name__)

#: A stop that takes longer than this (hivemind waiting on a round) is cut short; the final
#: checkpoint is already on disk by then, so nothing is lost.
SHUTDOWN_DEADLINE = 20.0


def land_round_in_flight(optimizer: SwarmOptimizer, rounds: RoundStats | None = None) -> None:
    """An overlapped round still in flight is this node's share of the swarm's last update: let
    it land (the caller bounds it by the averaging timeout) so the final checkpoint holds it.
    Then ``rounds``, with that one counted, says what the node's averaging came to."""
    try:
        optimizer.flush()
    except Exception as exc:  # the swarm's trouble must not cost the final checkpoint
        logger.warning("the last averaging round did not land (%r); checkpointing local progress", exc)
    if rounds is not None:
        logger.info(rounds.run_summary())


def close_within_deadline(closers: list[Callable[[], None]], exit_code: Callable[[], int], *,
                          deadline: float = SHUTDOWN_DEADLINE,
                          force_exit: Callable[[int], None] | None = None) -> None:
    """Call each closer in turn; if they have not all returned after ``deadline`` seconds, a timer
    thread ends the process with ``exit_code()`` (read then, so it is the latest word)."""
    end = force_exit or _force_exit
    timer = threading.Timer(deadline, lambda: end(exit_code()))
    timer.daemon = True
    timer.start()
    try:
        for close in closers:
            close()
    finally:
        timer.cancel()


def _force_exit(code: int) -> None:
    """Runs on the timer thread when shutting down hangs: stop every helper, then the process."""
    helpers = descendants()
    logger.warning("leaving the swarm took over %.0fs: stopping %d helper processes and exiting",
                   SHUTDOWN_DEADLINE, len(helpers))
    signal_all(helpers, signal.SIGTERM)
    time.sleep(1.0)  # on a timer thread with the main thread stuck: there is nothing to wait on but time
    signal_all(descendants(), signal.SIGKILL)
    logging.shutdown()
    os._exit(code)


def end_process(code: int) -> NoReturn:
    """Everything is closed: end the process here, with ``code``.

    Interpreter shutdown would go on to run finalizers of hivemind's objects (asyncio reporting a
    dying event loop from a garbage collection, multiprocessing joining helpers) at a point where
    no other thread can run any more; one of them can wait there for good, with the node already
    STOPPED and its final checkpoint on disk.  Forked helpers die with this process (PDEATHSIG).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
