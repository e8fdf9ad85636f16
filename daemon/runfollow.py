"""A running node's side of an owned run's manifest updates: apply, restart, or stop.

The training loop calls :meth:`RunFollower.poll` once per pass. It asks the run's keeper (which
never blocks) for a newly accepted manifest version and decides what the node does with it:

- live training settings (learning rate and schedule, target batch size) are applied to the
  optimizer at the next epoch boundary, and the loop runs with the new config; bans and
  revocations need nothing here: the keeper put them into the admission gate when it accepted
  the version;
- a change a running node cannot apply (the model, the task, the mode, the micro-batch size, the
  matchmaking window or averaging timeout its averagers were built with) stops the node with
  exit code 75, so the service manager starts it again with the new version;
- a manifest that bans this node, revokes its invite or records another model stops it with
  exit code 78 (a restart would not help);
- in an invite run, this node's own invite expiring: one WARNING ahead of it (a day, less for a
  short invite), then exit code 78 when it expires, since its peers refuse it from then on and it
  would train on alone, unseen.

Swarm trouble while polling is normal weather: one log line, and the node keeps training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from p2ptrain.config.schema import ConfigError, NodeConfig, TrainingSection
from p2ptrain.errors import EX_CONFIG, EX_TEMPFAIL
from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.run.invite import Invite, warn_ahead, when
from p2ptrain.run.manifest import Manifest
from p2ptrain.run.updates import Offer, classify

logger = logging.getLogger(__name__)

#: A failing poll is logged at most this often.
_WARN_EVERY = 60.0


class RunKeeping(Protocol):
    """What the follower needs from ``p2ptrain.swarm.ownedrun.RunKeeper``."""

    @property
    def manifest(self) -> Manifest | None: ...

    def poll(self) -> Offer | None: ...

    def is_excluded(self, peer_id: str) -> bool: ...

    def check_fingerprint(self, fingerprint: str) -> None: ...

    @property
    def own_invite(self) -> Invite | None: ...


class EpochCounter(Protocol):
    @property
    def epoch(self) -> int: ...


class RunFollower:
    def __init__(self, keeper: RunKeeping, optimizer: SwarmOptimizer, trainer: EpochCounter, *, peer_id: str,
                 fingerprint: str, request_exit: Callable[[str, int], None],
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.keeper, self.optimizer, self.trainer = keeper, optimizer, trainer
        self.peer_id, self.fingerprint = peer_id, fingerprint
        self._request_exit = request_exit
        self._clock = clock
        self._wall_clock = wall_clock  # invites expire at a time of day
        self._invite_warned = False
        #: The manifest whose settings are in force (a newer one may be pending).
        self.applied: Manifest | None = keeper.manifest
        self._pending: tuple[Manifest, int] | None = None
        self._stopping = False
        self._next_warning = 0.0

    def poll(self, config: NodeConfig) -> NodeConfig | None:
        """Once per loop pass: the config to run with from now on, or None to keep ``config``."""
        if self._stopping:
            return None
        self._check_own_invite()
        if self._stopping:
            return None
        try:
            offer = self.keeper.poll()
        except Exception as exc:  # the DHT being slow or gone must not stop training
            now = self._clock()
            if now >= self._next_warning:
                self._next_warning = now + _WARN_EVERY
                logger.warning("could not look for a newer run manifest: %r", exc)
            offer = None
        if offer is not None and offer.accepted:
            self._take(offer)
        if self._pending is not None and self.trainer.epoch > self._pending[1]:
            return self._apply(config)
        return None

    def _check_own_invite(self) -> None:
        invite = self.keeper.own_invite
        if invite is None:
            return
        left = invite.expires_at - self._wall_clock()
        ref = invite.run
        renew = (f"ask the run's owner for a new one (p2ptrain run invite {ref} {self.peer_id}), put it in "
                 "swarm.invite and start the node again")
        if left <= 0:
            return self._exit(f"swarm.invite: this node's invite to run {ref} expired on {when(invite.expires_at)}; "
                              f"its peers refuse it from now on: {renew}", EX_CONFIG)
        if not self._invite_warned and left <= warn_ahead(invite):
            self._invite_warned = True
            logger.warning("swarm.invite: this node's invite to run %s expires on %s (in %.1f hours), and then the "
                           "node stops: %s", ref, when(invite.expires_at), left / 3600, renew)
        return None

    def _take(self, offer: Offer) -> None:
        manifest = self.keeper.manifest
        if manifest is None or self.applied is None:
            return
        where = f"run {manifest.ref} (manifest version {manifest.version})"
        if self.keeper.is_excluded(self.peer_id):
            return self._exit(f"{where}: this node ({self.peer_id}) was banned or its invite revoked by the run's "
                              "owner", EX_CONFIG)
        change = classify(self.applied, manifest)
        if not change.live:
            return self._exit(f"{change.describe()}: stopping so that the restarted node applies it", EX_TEMPFAIL)
        try:
            self.keeper.check_fingerprint(self.fingerprint)
        except ConfigError as error:
            return self._exit(str(error), EX_CONFIG)
        training = [c for c in change.changes if c.field.startswith("training.")]
        if not training:
            self.applied = manifest  # bans, revocations: the keeper has updated the gate already
            return None
        self._pending = (manifest, self.trainer.epoch)
        logger.info("%s: %s; applied at the next epoch boundary", where,
                    ", ".join(f"{c.field} {c.old!r} -> {c.new!r}" for c in training))
        return None

    def _apply(self, config: NodeConfig) -> NodeConfig:
        assert self._pending is not None
        manifest, _ = self._pending
        self._pending = None
        training = TrainingSection.model_validate({**config.training.model_dump(), **manifest.training})
        self.optimizer.apply_training(training)
        self.applied = manifest
        logger.info("run %s: applied manifest version %d at epoch %d", manifest.ref, manifest.version,
                    self.trainer.epoch)
        return config.model_copy(update={"training": training})

    def _exit(self, reason: str, code: int) -> None:
        self._stopping = True
        self._request_exit(reason, code)


def describe_figures(status: dict[str, Any]) -> str:
    """One log line for a node that has just taken up its run's manifest."""
    fingerprint = status.get("manifest_fingerprint") or "not recorded"
    return (f"run {status['run_ref']}: manifest version {status['manifest_version']}, "
            f"{status['admission_policy']} run, model fingerprint {fingerprint}")
