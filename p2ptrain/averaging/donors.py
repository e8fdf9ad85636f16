"""Which donor's state to adopt: donors tried one at a time, each state validated, liars banned.

The adapter's averagers (:mod:`p2ptrain.averaging.hardened`) read one donor's stream at a time in
their own process; :class:`StateDownloads` decides, in the node's process, what to make of each
answer: a state that passes every check is adopted, a malformed one (its donor's own doing) bans the
donor for ``state_ban_seconds``, one refused on a judgement against other peers' reports (an
implausible epoch, a poor model) for ``judgement_ban_seconds`` since those reports may be forged, and
one refused on an unconfirmed judgement (a model scoring worse than ours: in a loss spike every
honest donor's does) bans nobody.  No hivemind here: the policy is tested with a stand-in for the
stream reader.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from p2ptrain.averaging.state_check import StateValidator
from p2ptrain.trust.verdicts import Verdict, advertised_epoch

logger = logging.getLogger(__name__)

#: Verdicts that compare a donor with what other peers report: banned for a while, not for good.
_JUDGEMENTS = frozenset({"implausible_epoch", "bad_model", "short_state"})

#: Asks the averager's process for the next donor's state: (donors tried, validator, seconds left) ->
#: ``{"failures": [(peer, offence kind, reason)], "donor": peer or None, "metadata", "tensors",
#: "priority"}``, or None when the averager could not answer.
AskForState = Callable[[set[str], StateValidator, float], "dict[str, Any] | None"]


class Offences(Protocol):
    """What a state download tells the peer gate (``p2ptrain.trust.peergate.PeerGate``)."""

    def offend(self, peer_id: Any, kind: str, reason: str, *, ban_seconds: float | None = None) -> Any: ...


@dataclass(frozen=True)
class StateDownload:
    """A state that passed every check, and the peer it came from."""

    donor: str
    metadata: Any
    tensors: list[torch.Tensor]


class StateDownloads:
    """One averager's state downloads: at most ``max_donors`` donors a download, checked by ``validator``."""

    def __init__(self, gate: Offences | None = None, *, validator: StateValidator | None = None, max_donors: int = 4,
                 state_ban_seconds: float = math.inf, judgement_ban_seconds: float | None = None) -> None:
        self.gate, self.validator, self.max_donors = gate, validator, max_donors
        self.state_ban_seconds, self.judgement_ban_seconds = state_ban_seconds, judgement_ban_seconds
        #: What the last download rejected: (peer ID, reason).
        self.rejections: list[tuple[str, str]] = []
        #: Where the state that passed the last download's checks came from: (donor peer ID, its metadata).
        self.source: tuple[str, Any] | None = None
        self._lied = self._unconfirmed = 0

    def download(self, ask: AskForState, timeout: float | None = None, *,
                 what: str = "averager") -> StateDownload | None:
        """Try donors one at a time until one's state passes the validator; ban the ones that lie."""
        self.rejections, self.source = [], None
        self._lied = self._unconfirmed = 0
        validator = self.validator
        if validator is None:
            logger.warning("%s has no state validator: not downloading state", what)
            return None
        deadline = time.monotonic() + (timeout if timeout is not None else 300.0)
        tried: set[str] = set()
        for _ in range(self.max_donors):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            reply = ask(tried, validator, remaining)
            if reply is None:
                break
            for peer, kind, reason in reply["failures"]:
                tried.add(peer)
                self._reject(peer, Verdict(False, reason, kind))
            donor = reply.get("donor")
            if donor is None:
                break
            tried.add(donor)
            verdict = advertised_epoch(reply["metadata"], reply.get("priority"), own=validator.own_epoch())
            if verdict.ok:
                verdict = validator(reply["metadata"], reply["tensors"], donor)
            if verdict.ok:
                logger.info("state from %s passed every check", donor)
                self.source = (donor, reply["metadata"])
                return StateDownload(donor, reply["metadata"], list(reply["tensors"]))
            self._reject(donor, verdict)
        if self.rejections:
            lied, unconfirmed = self._lied, self._unconfirmed
            unsure = f"; {unconfirmed} refused as worse than the reference, nobody blamed" if unconfirmed else ""
            logger.log(logging.WARNING if lied else logging.INFO, "no usable state among %d donor(s)%s%s; keeping "
                       "our own", len(self.rejections), f" ({lied} rejected as bad)" if lied else "", unsure)
        return None

    def _reject(self, peer: str, verdict: Verdict) -> None:
        self.rejections.append((peer, verdict.reason))
        if verdict.unconfirmed:  # refused on a view, not a fact: nobody blamed
            self._unconfirmed += 1
            logger.info("not adopting the state of %s: %s (not blamed: a view, not a fact)", peer, verdict.reason)
            return
        self._lied += bool(verdict.kind)
        if verdict.kind and self.gate is not None:
            judged = verdict.kind in _JUDGEMENTS
            self.gate.offend(peer, verdict.kind, verdict.reason,
                             ban_seconds=self.judgement_ban_seconds if judged else self.state_ban_seconds)
        elif verdict.kind:
            logger.warning("peer %s: %s (%s)", peer, verdict.kind, verdict.reason)
        else:
            logger.info("not adopting the state of %s: %s", peer, verdict.reason)
