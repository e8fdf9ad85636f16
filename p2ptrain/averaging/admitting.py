"""Whether an averager may deal with a peer of an owned run: the averaging side of the run's gate.

hivemind 1.1.12 authorizes DHT requests (see :mod:`p2ptrain.swarm.dhtauth`) but not its averagers'
own RPCs: any peer that knows an averager's address can ask to join its group, send it parts of an
all-reduce, or download its state.  The adapter's averagers (:mod:`p2ptrain.averaging.hardened`) ask
an :class:`AdmissionCheck` about the caller's peer ID (authenticated by libp2p) in each handler, and
before they dial a peer themselves (as a group leader, a groupmate or a state donor).

The gate lives in shared memory created before hivemind forks the averagers, so a ban or a
revocation in a new manifest version reaches the handlers at once.  A refusal is counted in the gate
and logged once per peer; hivemind's own handling of a peer that does not answer (the next leader,
the next donor, a round without that part) does the rest.  No hivemind here: the policy is tested
with plain values.
"""

from __future__ import annotations

import logging
from typing import Protocol

logger = logging.getLogger(__name__)

#: Peers named in the log at most; a flood of strangers is counted, not listed.
_LOGGED_PEERS = 256


class Admission(Protocol):
    """What the averagers ask the gate (``p2ptrain.trust.admission.AdmissionGate``)."""

    def is_admitted(self, peer_id: object) -> bool: ...

    def count_refusal(self) -> None: ...


class AdmissionCheck:
    """One averager's questions to an owned run's gate: refusals counted in the gate, logged once per peer."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self._logged: set[str] = set()

    def refuses(self, peer_id: object, what: str) -> bool:
        """True (and counted, logged once) when ``peer_id`` may not take part in the run; ``what`` is
        what we would have done with it ("average with", "serve state to", ...)."""
        if self.admission.is_admitted(peer_id):
            return False
        self.admission.count_refusal()
        name = str(peer_id)
        if name not in self._logged and len(self._logged) < _LOGGED_PEERS:
            self._logged.add(name)
            logger.info("refusing to %s peer %s: not admitted to this run (invite-only, banned or revoked)",
                        what, name)
        return True
