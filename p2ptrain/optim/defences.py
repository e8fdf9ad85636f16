"""The hostile-peer checks of one node, in one bundle both optimizers take: gate, evidence, round reports.

A node builds its :class:`Defences` before anything forks (the DHT, the averagers): the peer gate and
the round-report queue live in fork-shared memory.  Both optimizers then ask the bundle for what they
hand hivemind: the reduce rules, the state validator's inputs (what the run's peers report, by
identity), the donor preferences and the ban times, and they give back what each averaging round
showed (:meth:`Defences.take_round`: who was met, how much was really averaged).

``swarm.peer_checks = false`` builds no bundle: the node then runs plain hivemind, trusting every
peer, which is there only to measure what the checks cost (``benchmarks/defences.py``).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from p2ptrain.averaging.robust_reduce import AllReduceReport, RoundReports
from p2ptrain.config.schema import SwarmSection
from p2ptrain.trust.evidence import PeerEvidence
from p2ptrain.trust.peergate import OffenceFigures, PeerGate
from p2ptrain.trust.verdicts import epoch_ceiling
from p2ptrain.trust.vouching import Vouchers, VouchLedger, anchors_of

logger = logging.getLogger(__name__)


@dataclass
class Defences:
    """One node's peer gate, evidence and round reports, with the ban times from config."""

    gate: PeerGate
    evidence: PeerEvidence
    rounds: RoundReports
    #: Ban for averaging offences and for states rejected on a judgement against other peers' reports.
    ban_seconds: float
    #: Ban for a malformed state (its donor's own doing); inf: for the rest of the run.
    state_ban_seconds: float
    #: Where each round's accepted weights go: the samples this node can vouch for of its groupmates.
    vouches: VouchLedger | None = None

    @classmethod
    def from_config(cls, swarm: SwarmSection, vouches: VouchLedger | None = None) -> Defences | None:
        """The bundle ``swarm`` asks for (None when the peer checks are off); its rounds' weights go to
        ``vouches`` (None: nowhere, e.g. a fetcher, which averages with nobody)."""
        if not swarm.peer_checks:
            logger.warning("peer checks are off (swarm.peer_checks = false): this node trusts every peer's "
                           "state, parts and progress; use it only to measure what the checks cost")
            return None
        gate = PeerGate(default_ban_seconds=swarm.ban_seconds)
        state_ban = swarm.bad_state_ban_seconds if swarm.bad_state_ban_seconds > 0 else math.inf
        return cls(gate=gate, evidence=PeerEvidence(is_gated=gate.is_gated), rounds=RoundReports(),
                   ban_seconds=swarm.ban_seconds, state_ban_seconds=state_ban, vouches=vouches)

    # ------------------------------------------------------------------ what the averagers are given

    def max_donor_priority(self) -> float | None:
        """The highest donor priority (a donor's advertised epoch) worth asking: a little above what
        the run's identified peers report; None (any in range) while nobody reports."""
        reports = list(self.evidence.peer_epochs().values())
        return float(epoch_ceiling(int(statistics.median_high(reports)))) if reports else None

    def known_peers(self) -> list[str]:
        """Donors to try first: peers met in averaging, then peers with identity-bound records."""
        met = self.evidence.met_peers()
        return [*sorted(met), *sorted(set(self.evidence.peer_epochs()) - met)]

    def hardened_kwargs(self) -> dict[str, Any]:
        """Keyword arguments every hardened averager takes (see ``p2ptrain.averaging.hardened.AveragerLayer``)."""
        return dict(gate=self.gate, state_ban_seconds=self.state_ban_seconds,
                    judgement_ban_seconds=self.ban_seconds, max_donor_priority=self.max_donor_priority,
                    known_peers=self.known_peers)

    # ------------------------------------------------------------------ what rounds showed

    def take_round(self, own_peer: str) -> AllReduceReport | None:
        """The newest report of this node's main averager (None if none arrived); every report drained
        adds the peers it met to the evidence, and the samples they carried into it to ``vouches``."""
        reports = self.rounds.drain()
        for report in reports:
            self.evidence.met_in_round(report.met(own_peer))
            if self.vouches is not None:
                self.vouches.add_round(report.shares(own_peer))
        return reports[-1] if reports else None

    def joined_through(self, peers: Iterable[str]) -> PeerEvidence:
        """The evidence, told which peers the user had this node join through (trusted to be in the run)."""
        self.evidence.initial_peers = frozenset(peers)
        return self.evidence

    def overrules_fingerprint_records(self, problem: str) -> bool:
        """The record of a peer this node joined through says the run trains another model (``problem``).
        A node that has averaged with peers of its own model lately is evidently in the right run (that
        peer may have moved on to another model): it says so and goes on (True); one that has met nobody
        must stop (False)."""
        met = self.evidence.met_peers()
        if met:
            logger.warning("%s; but %d peer(s) averaged with this node lately: going on", problem, len(met))
        return bool(met)

    def figures(self) -> OffenceFigures:
        return self.gate.figures()

    def vouchers(self) -> Vouchers:
        """What this node can vouch for: its rounds' figures, and the peers it joined through (not
        excluded now), whose signed figures count."""
        direct = self.vouches.vouched() if self.vouches is not None else {}
        return Vouchers(direct=direct, anchors=anchors_of(self.evidence.initial_peers, self.gate.is_gated))


def evaluate_fn(task: Any, placement: Any = None) -> Callable[[], float]:
    """The node's validation pass over ``task`` (the model check's yardstick) on the node's device
    (``placement``, a :class:`~p2ptrain.model.device.Placement`; None: the CPU), model left in train mode."""
    from p2ptrain.optim.trainer import validation_loss

    return lambda: validation_loss(task, placement)
