"""Whether a DiLoCo round that ended with nobody else in the swarm failed, or the node trains alone.

A round ends alone when the swarm's progress shows no other peer at its end.  That is normal for a
swarm of one (the first node of a run, or everyone else gone): its rounds are the swarm's own, and
saying so once is enough.  But when another peer was seen in this round or the one before (a slow
peer whose progress entry lapsed, a peer that just left), the round missed it: a failed round,
counted and said in one WARNING line with the running count.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class SoloRounds:
    """Remembers when this node last had company, and judges each round it ends alone."""

    def __init__(self) -> None:
        #: The last round in which another peer was in the swarm's progress.
        self.company_round = -2
        #: Rounds ended alone although another peer had been there (failed rounds).
        self.missed = 0
        self._training_alone = False

    def saw_company(self, round_number: int) -> None:
        self.company_round, self._training_alone = round_number, False

    def ended_alone(self, round_number: int, outcome: str) -> bool:
        """Round ``round_number`` ended with nobody else: True when that makes it a failed round
        (``outcome``: what a failed round does, for its line)."""
        if self.company_round >= round_number - 1:
            self.missed += 1
            self._training_alone = False
            logger.warning("DiLoCo round %d ended alone: no other peer in the swarm's progress at its end "
                           "(one was there in round %d); %s (%d such round%s so far)",
                           round_number, self.company_round, outcome, self.missed, "s" if self.missed != 1 else "")
            return True
        if not self._training_alone:
            self._training_alone = True
            logger.info("DiLoCo round %d: no other peer in the swarm; training alone, each round applying this "
                        "node's own update", round_number)
        return False
