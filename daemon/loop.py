"""The node's training loop: one step at a time, with control requests, pauses and periodic work
(snapshots, validation, checkpoints, the fingerprint) in between.

Everything that changes the node happens here, on the main thread, between steps: control
requests (API, signals) are only queued by others, and the loop drains them.  All collaborators
are handed in (trainer, optimizer, guard, checkpoints, hooks, clock, stopper), so the loop runs
in a unit test with fakes in milliseconds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from p2ptrain.config.schema import NodeConfig
from p2ptrain.daemon.control import Command, ControlQueue
from p2ptrain.daemon.cpushare import CpuShare
from p2ptrain.daemon.hooks import NodeHooks
from p2ptrain.daemon.snapshot import StatusBoard
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.optim.round_stats import RoundStats
from p2ptrain.optim.trainer import StepStats
from p2ptrain.status import NodeState, PauseReason, Reachability
from p2ptrain.swarm.reach import ReachablePeerWatch

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY = 0.5
#: How often the node looks again at which model the run's peers train, and republishes its own.
FINGERPRINT_EVERY = 60.0
#: The first look again comes this soon after training starts, and the gap doubles up to
#: FINGERPRINT_EVERY: a peer's record (which says what it trains) reaches the DHT up to one record
#: period after that peer starts, so a node started with another model than its peers finds out in
#: seconds instead of training a model the run cannot use for a minute.
FIRST_FINGERPRINT_RECHECK = 5.0
#: How often the node asks libp2p for its addresses again (reachability can change after the start).
ADDRESSES_EVERY = 60.0
#: How often a paused node re-withdraws its progress record (hivemind re-publishes it every 30 s).
STEP_ASIDE_EVERY = 10.0
#: How long a paused loop sleeps between passes (a stop or a control request cuts it short).
PAUSED_WAIT = 0.5


class StepRunner(Protocol):
    """The trainer as the loop sees it."""

    @property
    def epoch(self) -> int: ...

    def step(self) -> StepStats: ...

    def validation_loss(self) -> float: ...


class Rollback(Protocol):
    def after_step(self, epoch: int) -> bool: ...


class LoopParts(Protocol):
    """What the loop trains with (``daemon.builder.TrainingParts`` in a real node); it replaces none of them."""

    @property
    def trainer(self) -> StepRunner: ...

    @property
    def optimizer(self) -> SwarmOptimizer: ...

    @property
    def rollback(self) -> Rollback: ...

    def save_checkpoint(self, **extra: object) -> bool: ...


class TrainingLoop:
    def __init__(self, config: NodeConfig, parts: LoopParts, board: StatusBoard, hooks: NodeHooks,
                 stopper: Stopper, control: ControlQueue, *, clock: Callable[[], float], cpu_share: CpuShare,
                 rounds: RoundStats,
                 refresh_fingerprint: Callable[[], None], set_threads: Callable[[int], None],
                 paused_wait: float = PAUSED_WAIT,
                 poll_run: Callable[[NodeConfig], NodeConfig | None] | None = None,
                 current_maddrs: Callable[[], Sequence[str]] | None = None) -> None:
        self.config = config
        self.parts = parts
        self.board = board
        self.hooks = hooks
        self.stopper = stopper
        self.control = control
        self.clock = clock
        self._refresh_fingerprint = refresh_fingerprint
        self._set_threads = set_threads
        self.cpu_share = cpu_share
        self.rounds = rounds
        self._paused_wait = paused_wait
        #: An owned run's manifest updates (``daemon.runfollow``): returns the config to go on with.
        self._poll_run = poll_run
        #: The node's addresses as libp2p gives them now (None: fixed at the start).
        self._current_maddrs = current_maddrs
        self._manual_pause_until: float | None = None
        self._next_step_aside = 0.0
        self._reachable_peers = ReachablePeerWatch()
        #: The last validation as the model card needs it: the loss, the epoch, and which parameters.
        self._validation: dict[str, object] = {}

    def run(self) -> None:
        """Train until a stop is requested (signal, API, ``training.max_epochs``)."""
        now = self.clock()
        next_snapshot = now
        next_validation = now + self.config.training.validate_every
        next_checkpoint = now + self.config.checkpoint.interval
        fingerprint_gap = FIRST_FINGERPRINT_RECHECK
        next_fingerprint = now + fingerprint_gap
        next_addresses = now + ADDRESSES_EVERY
        while not self.stopper.is_set():
            self._handle_control()
            self._follow_run()
            if self.stopper.is_set():
                break
            self._update_pause()
            if self.board.pause_reason is PauseReason.NONE:
                if self.cpu_share.wait_for_budget():  # volunteer.max_cpu_percent: idle between steps
                    self._train_one_step()
                else:
                    self.hooks.idle()  # holding back on purpose is not a hang
            else:
                self._stay_paused()
            now = self.clock()
            if now >= next_snapshot:
                self.board.publish()
                self._watch_reachable_peers(now)
                next_snapshot = now + SNAPSHOT_EVERY
            if now >= next_validation:
                self.validate()
                next_validation = now + self.config.training.validate_every
            if now >= next_checkpoint:
                self.checkpoint()
                next_checkpoint = self.clock() + self.config.checkpoint.interval
            if now >= next_fingerprint:
                self._refresh_fingerprint()
                fingerprint_gap = min(FINGERPRINT_EVERY, fingerprint_gap * 2)
                next_fingerprint = now + fingerprint_gap
            if now >= next_addresses:
                self._follow_addresses()
                next_addresses = now + ADDRESSES_EVERY
            summary = self.rounds.take_summary(now)
            if summary:
                logger.info(summary)
            max_epochs = self.config.training.max_epochs
            if max_epochs and self.parts.trainer.epoch >= max_epochs:
                logger.info("reached training.max_epochs=%d", max_epochs)
                self.stopper.request("max_epochs reached")

    def _follow_addresses(self) -> None:
        """The addresses libp2p gives peers change after the start (a relay slot taken or lost): the
        status follows them, and a change of reachability (not of an address alone: libp2p's observed
        addresses come and go) is said in the same line as at the start."""
        if self._current_maddrs is None:
            return
        try:
            maddrs = tuple(self._current_maddrs())
        except Exception as error:  # the DHT busy or going down: the last addresses stand
            logger.debug("could not read this node's addresses: %r", error)
            return
        before = self.board.identity
        if not maddrs or maddrs == before.maddrs:
            return
        self.board.identity = after = dataclasses.replace(before, maddrs=maddrs)
        if after.reachability() is not before.reachability():
            logger.info("%s", after.reach().line())

    def _watch_reachable_peers(self, now: float) -> None:
        """A client averages only through peers that others can dial: say when none is training, and
        when one is back (from the swarm view, whose records say how each peer is reached)."""
        if self.board.identity.reachability() is not Reachability.CLIENT:
            return
        own = self.board.identity.peer_id
        others = [peer for peer in self.board.latest.swarm().peers
                  if peer.state == NodeState.TRAINING and peer.peer_id != own]
        reachable = sum(peer.reachability != Reachability.CLIENT.value for peer in others)
        line = self._reachable_peers.observe(reachable, 1 + len(others), now)
        if line is not None:
            logger.log(logging.INFO if reachable else logging.WARNING, "%s", line)

    def checkpoint(self) -> bool:
        """A checkpoint with the run facts an export's model card shows (an owned run by its reference,
        NAME@hash; a plain run by its id)."""
        run_ref = self.board.run().run_ref or self.board.identity.run_id
        return self.parts.save_checkpoint(run_ref=run_ref, **self._validation)

    def validate(self) -> None:
        epoch = self.parts.trainer.epoch
        loss = self.parts.trainer.validation_loss()
        self.board.validated(epoch, loss)
        # A checkpoint keeps the last validation, not a fresh one: it carries the epoch it was measured at,
        # and in DiLoCo mode that it is of the local model (an export holds the swarm's outer parameters).
        self._validation = {"val_loss": loss, "val_epoch": epoch,
                            "val_params": "local" if self.config.training.mode == "diloco" else "model"}
        logger.info("epoch %d: validation loss %.4f", epoch, loss)

    # ------------------------------------------------------------------ one pass

    def _train_one_step(self) -> None:
        if self.board.state is NodeState.PAUSED:
            self.parts.optimizer.rejoin()
        self.board.set_state(NodeState.TRAINING)
        stats = self.parts.trainer.step()
        self.board.step_done(stats.samples, stats.loss, counted=not stats.skipped_nonfinite)
        # A peer's non-finite contribution must not stay in our parameters.
        self.parts.rollback.after_step(stats.epoch)
        self.hooks.progress()

    def _stay_paused(self) -> None:
        """Paused: peers must not wait for us in their rounds (we still serve state to newcomers)."""
        if self.board.state is not NodeState.PAUSED or self.clock() >= self._next_step_aside:
            try:
                self.parts.optimizer.step_aside()
            except Exception as exc:  # the DHT being slow must not break the pause
                logger.warning("could not withdraw from averaging while paused: %r", exc)
            self._next_step_aside = self.clock() + STEP_ASIDE_EVERY
        try:
            self.parts.optimizer.settle()
        except Exception as exc:  # a round that broke while landing is swarm weather, as in training
            logger.warning("could not apply the averaging round that landed while paused: %r", exc)
        self.board.set_state(NodeState.PAUSED)
        self.hooks.idle()
        self.stopper.wait_for_work(self._paused_wait)  # a control request (ControlQueue's wake) ends it

    def _handle_control(self) -> None:
        for request in self.control.drain():
            logger.info("control: %s%s", request.command.value, f" from {request.source}" if request.source else "")
            if request.command is Command.PAUSE:
                self._manual_pause_until = self.clock() + request.duration if request.duration else math.inf
            elif request.command is Command.RESUME:
                self._manual_pause_until = None
            elif request.command is Command.CHECKPOINT:
                self.checkpoint()
            elif request.command is Command.LEAVE:
                self.stopper.request(f"leave requested by {request.source or 'control'}")
            elif request.command is Command.RELOAD:
                self._reload()

    def _follow_run(self) -> None:
        if self._poll_run is None:
            return
        new = self._poll_run(self.config)
        if new is not None:
            self.config = new
            self.board.target_batch_size = new.training.target_batch_size

    def _reload(self) -> None:
        new = self.hooks.reload(self.config)
        if new is None:
            return
        if new.training.threads != self.config.training.threads:
            self._set_threads(new.training.threads)
        self.cpu_share.update(new.volunteer.max_cpu_percent)
        self.config = new

    def _update_pause(self) -> None:
        reason = PauseReason.NONE
        if self._manual_pause_until is not None:
            if self.clock() < self._manual_pause_until:
                reason = PauseReason.MANUAL
            else:
                self._manual_pause_until = None
                logger.info("timed pause is over: resuming")
        if reason is PauseReason.NONE:
            reason = self.hooks.policy_pause_reason()
        if reason != self.board.pause_reason:
            logger.info("pausing (%s)", reason.value) if reason else logger.info("resuming training")
            self.board.pause_reason = reason
