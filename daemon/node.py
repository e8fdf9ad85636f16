"""The node: its state machine (STARTING -> JOINING -> SYNCING -> TRAINING -> STOPPING) and its loop.

Everything that changes the node happens on the main thread, between training steps: control
requests (API, signals) are only queued, and the loop drains them.  Swarm trouble is normal
weather: it is counted and logged, and training goes on locally.  Only bad configuration and
programming errors end the node with a non-zero exit code.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from p2ptrain import __version__
from p2ptrain.checkpoint import CheckpointError, CheckpointStore
from p2ptrain.config import ConfigError, NodeConfig
from p2ptrain.daemon.control import Command, ControlQueue
from p2ptrain.daemon.hooks import NodeHooks
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.daemon.rates import Ema, WindowRate
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.fingerprint import model_fingerprint
from p2ptrain.guard import ParameterGuard
from p2ptrain.optim import SwarmStats, bandwidth_hint, build_optimizer
from p2ptrain.proc import descendants, signal_all
from p2ptrain.rejoin import Rejoiner
from p2ptrain.status import (
    LatestSnapshot,
    NodeState,
    PauseReason,
    PeerRecord,
    Reachability,
    StatusSnapshot,
    SwarmView,
)
from p2ptrain.swarm import (
    IdentityLock,
    claim_fingerprint,
    identity_path,
    start_dht,
    stop_stale_daemons,
    visible_maddrs,
)
from p2ptrain.tasks.loader import build_task
from p2ptrain.trainer import StepStats, Trainer

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY = 0.5
RECORD_EVERY = 5.0
FINGERPRINT_EVERY = 60.0
SYNC_WAIT = 10.0
#: A stop that takes longer than this (hivemind waiting on a round) is cut short; the final
#: checkpoint is already on disk by then, so nothing is lost.
SHUTDOWN_DEADLINE = 20.0
#: How often a paused node re-withdraws its progress record (hivemind re-publishes it every 30 s).
STEP_ASIDE_EVERY = 10.0


def peer_seed(peer_id: str) -> int:
    """A stable 63-bit seed for this node's data slice, derived from its peer ID."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") >> 1


class Node:
    """One p2ptrain node. Build it, call :meth:`run` from the main thread, get an exit code."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        extra_peers: Sequence[str] = (),
        log_ring: LogRing | None = None,
        hooks: NodeHooks | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.initial_peers = list(dict.fromkeys([*config.swarm.initial_peers, *extra_peers]))
        #: Stop cleanly once this epoch is reached (0: never); reloadable.
        self.max_epochs = config.training.max_epochs
        self.logs = log_ring or LogRing()
        self.hooks = hooks or NodeHooks()
        self.clock = clock
        self.wall_clock = wall_clock
        self.stopper = Stopper()
        self.control = ControlQueue()
        self.latest = LatestSnapshot()
        self.state = NodeState.STARTING
        self.pause_reason = PauseReason.NONE
        self._manual_pause_until: float | None = None
        self._next_step_aside = 0.0
        self.swarm_stats = SwarmStats()
        self.swarm_view = SwarmView()
        self.started_at = wall_clock()
        self._started_mono = clock()
        self._last_progress: float | None = None
        self._rate = WindowRate()
        self._loss = Ema(0.05)
        self._val_loss: float | None = None
        self._checkpoint_ok = 0
        self._checkpoint_failed = 0
        self._last_checkpoint_time: float | None = None
        self._last_checkpoint_error = ""
        self.dht: Any = None
        self.rejoiner: Rejoiner | None = None
        #: hivemind's optimizer (gradient mode) or the DiLoCo outer loop; the same duck-typed interface.
        self.optimizer: Any = None
        self.trainer: Trainer | None = None
        self.guard: ParameterGuard | None = None
        self.store: CheckpointStore | None = None
        self.peer_id = ""
        self.maddrs: list[str] = []
        self.fingerprint = ""
        self._fingerprint_first_seen = wall_clock()
        #: Exit code if shutdown has to be cut short: 0 only once the final checkpoint is safe.
        self._forced_exit_code = 1

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self, reason: str) -> None:
        """Thread- and signal-safe: the loop notices between steps and leaves cleanly."""
        self.stopper.request(reason)

    def run(self) -> int:
        state_dir = self.config.state_dir()
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = IdentityLock(state_dir)
        lock.acquire()
        try:
            return self._run(state_dir)
        finally:
            self._shutdown()
            lock.release()

    def _run(self, state_dir: Path) -> int:
        cfg = self.config
        torch.set_num_threads(cfg.training.threads or os.cpu_count() or 1)
        self._set_state(NodeState.STARTING)
        self.hooks.starting(self)

        self._set_state(NodeState.JOINING)
        validators = self.hooks.record_validators(cfg.swarm.run_id)
        stale = stop_stale_daemons(identity_path(state_dir))
        if stale:
            logger.info("stopped %d p2p daemon(s) left running by a previous run of this node", stale)
        self.dht = start_dht(cfg.swarm, state_dir, self.initial_peers, validators, self.stopper)
        self.peer_id = str(self.dht.peer_id)
        self.maddrs = visible_maddrs(self.dht)
        self.rejoiner = Rejoiner(self.dht, lambda: self.initial_peers)
        self.rejoiner.start()
        if self.initial_peers:
            logger.info("joined swarm %r as %s", cfg.swarm.run_id, self.peer_id)
        else:
            logger.info("started a new swarm %r; others can join with: %s", cfg.swarm.run_id,
                        " ".join(f"--join {addr}" for addr in self.maddrs))

        task = build_task(cfg.task, cfg.training, peer_seed(self.peer_id))
        self.fingerprint = model_fingerprint(task.model, task.shape_config)
        self._fingerprint_first_seen = claim_fingerprint(self.dht, cfg.swarm.run_id, self.fingerprint,
                                                         self._fingerprint_first_seen)
        logger.info("model fingerprint %s (%d parameters)", self.fingerprint,
                    sum(p.numel() for p in task.model.parameters()))

        self.store = CheckpointStore(cfg.checkpoint_dir(), keep=cfg.checkpoint.keep)
        restored = self._load_local_checkpoint(task)
        self.optimizer = build_optimizer(task.model, self.dht, f"{cfg.swarm.run_id}_{self.fingerprint}",
                                         cfg.training, client_mode=cfg.swarm.client_mode,
                                         stats=self.swarm_stats,
                                         bandwidth=bandwidth_hint(cfg.volunteer.upload_kbps,
                                                                  cfg.volunteer.download_kbps))
        if restored is not None:
            self._restore_optimizer(restored)
        self.trainer = Trainer(task, self.optimizer, cfg.training.batch_size,
                               corrupt_gradients=self.hooks.corrupt_gradients)
        self.trainer.samples_processed = int(restored.get("samples_processed", 0)) if restored else 0
        self.guard = ParameterGuard(task.model, self.optimizer)

        self._set_state(NodeState.SYNCING)
        self._sync_with_swarm()
        if not self.stopper.is_set():  # a stop during the sync skips straight to the final checkpoint
            self._val_loss = self.trainer.validation_loss()
            logger.info("validation loss %.4f at epoch %d", self._val_loss, self.trainer.epoch)
            self._set_state(NodeState.TRAINING)
            self.hooks.ready(self)
            self._loop()

        self._set_state(NodeState.STOPPING)
        logger.info("stopping (%s): writing a final checkpoint", self.stopper.reason)
        self._checkpoint()
        if not self._last_checkpoint_error:
            self._forced_exit_code = 0
        return 0

    def _shutdown(self) -> None:
        deadline = threading.Timer(SHUTDOWN_DEADLINE, self._force_exit)
        deadline.daemon = True
        deadline.start()
        self.hooks.stopping(self)
        if self.rejoiner is not None:
            self.rejoiner.stop()
        if self.optimizer is not None:
            try:
                self.optimizer.shutdown()
            except Exception as exc:  # shutting down must go on whatever hivemind says
                logger.warning("optimizer shutdown: %r", exc)
        if self.dht is not None:
            try:
                self.dht.shutdown()
            except Exception as exc:
                logger.warning("DHT shutdown: %r", exc)
            # hivemind kills a DHT process that does not stop in time, and its p2pd lives on.
            stop_stale_daemons(identity_path(self.config.state_dir()))
        deadline.cancel()
        self._set_state(NodeState.STOPPED)
        self.stopper.close()

    def _force_exit(self) -> None:
        """Runs on a timer thread when shutting down hangs: stop every helper, then the process."""
        helpers = descendants()
        logger.warning("leaving the swarm took over %.0fs: stopping %d helper processes and exiting",
                       SHUTDOWN_DEADLINE, len(helpers))
        signal_all(helpers, signal.SIGTERM)
        time.sleep(1.0)
        signal_all(descendants(), signal.SIGKILL)
        logging.shutdown()
        os._exit(self._forced_exit_code)

    # ------------------------------------------------------------------ start-up helpers

    def _load_local_checkpoint(self, task: Any) -> dict[str, Any] | None:
        assert self.store is not None
        loaded = self.store.load_latest()
        if loaded is None:
            logger.info("no local checkpoint in %s: starting from scratch", self.store.directory)
            return None
        state = loaded.state
        if state.get("fingerprint") not in (None, self.fingerprint):
            raise ConfigError(
                f"checkpoint.dir: {loaded.path} holds model {state.get('fingerprint')} but this config builds "
                f"{self.fingerprint}; restore the [task] settings or point checkpoint.dir elsewhere"
            )
        task.model.load_state_dict(state["model"])
        task.train_batches.load_state_dict(state.get("data_position", {}))
        logger.info("resumed from checkpoint %s (epoch %d)", loaded.path.name, int(state.get("epoch", 0)))
        return state

    def _restore_optimizer(self, state: dict[str, Any]) -> None:
        assert self.optimizer is not None
        optimizer_state = state.get("optimizer")
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.optimizer.state_averager.local_epoch = int(state.get("epoch", 0))
        scheduler = getattr(self.optimizer.state_averager, "scheduler", None)
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])

    def _sync_with_swarm(self) -> None:
        """If the swarm is ahead of us, download its state (bounded); else go on from what we have."""
        assert self.optimizer is not None
        tracker = self.optimizer.tracker
        deadline = self.clock() + SYNC_WAIT
        while not tracker.fetched_global_progress_this_epoch.is_set() and self.clock() < deadline:
            if self.stopper.wait(0.2):
                return
        if tracker.global_epoch > self.optimizer.local_epoch:
            logger.info("swarm is at epoch %d, we are at %d: downloading state from peers",
                        tracker.global_epoch, self.optimizer.local_epoch)
            self.hooks.long_operation(self, self.config.training.load_state_timeout
                                      * self.config.training.load_state_attempts)
            self.optimizer.load_state_from_peers()
            logger.info("now at epoch %d", self.optimizer.local_epoch)
        else:
            logger.info("in sync with the swarm at epoch %d", self.optimizer.local_epoch)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        assert self.trainer is not None
        cfg = self.config
        now = self.clock()
        next_snapshot = next_record = now
        next_validation = now + cfg.training.validate_every
        next_checkpoint = now + cfg.checkpoint.interval
        next_fingerprint = now + FINGERPRINT_EVERY
        while not self.stopper.is_set():
            self._handle_control()
            if self.stopper.is_set():
                break
            self._update_pause()
            if self.pause_reason is PauseReason.NONE:
                if self.state is NodeState.PAUSED:
                    self._rejoin_training()
                self._set_state(NodeState.TRAINING)
                self._record_step(self.trainer.step())
            else:
                if self.state is not NodeState.PAUSED or self.clock() >= self._next_step_aside:
                    self._step_aside()
                self._set_state(NodeState.PAUSED)
                self.hooks.idle(self)
                self.stopper.wait(0.5)
            now = self.clock()
            if now >= next_snapshot:
                self._publish_snapshot()
                next_snapshot = now + SNAPSHOT_EVERY
            if now >= next_record:
                self._exchange_records()
                next_record = now + RECORD_EVERY
            if now >= next_validation:
                self._val_loss = self.trainer.validation_loss()
                logger.info("epoch %d: validation loss %.4f", self.trainer.epoch, self._val_loss)
                next_validation = now + cfg.training.validate_every
            if now >= next_checkpoint:
                self._checkpoint()
                next_checkpoint = self.clock() + cfg.checkpoint.interval
            if now >= next_fingerprint:
                self._refresh_fingerprint()
                next_fingerprint = now + FINGERPRINT_EVERY
            if self.max_epochs and self.trainer.epoch >= self.max_epochs:
                logger.info("reached training.max_epochs=%d", self.max_epochs)
                self.request_stop("max_epochs reached")

    def _step_aside(self) -> None:
        """Paused: peers must not wait for us in their rounds (we still serve state to newcomers)."""
        try:
            self.optimizer.step_aside()
        except Exception as exc:  # the DHT being slow must not break the pause
            logger.warning("could not withdraw from averaging while paused: %r", exc)
        self._next_step_aside = self.clock() + STEP_ASIDE_EVERY

    def _rejoin_training(self) -> None:
        tracker = self.optimizer.tracker
        tracker.report_local_progress(tracker.local_progress.epoch, tracker.local_progress.samples_accumulated)

    def _record_step(self, stats: StepStats) -> None:
        now = self.clock()
        self._last_progress = now
        if not stats.skipped_nonfinite:
            self._rate.add(now, stats.samples)
            self._loss.add(stats.loss)
        if self.guard is not None:  # a peer's non-finite contribution must not stay in our parameters
            self.guard.after_step(stats.epoch)
        self.hooks.progress(self)

    def _handle_control(self) -> None:
        for request in self.control.drain():
            logger.info("control: %s%s", request.command.value,
                        f" from {request.source}" if request.source else "")
            if request.command is Command.PAUSE:
                self._manual_pause_until = self.clock() + request.duration if request.duration else math.inf
            elif request.command is Command.RESUME:
                self._manual_pause_until = None
            elif request.command is Command.CHECKPOINT:
                self._checkpoint()
            elif request.command is Command.LEAVE:
                self.request_stop(f"leave requested by {request.source or 'control'}")
            elif request.command is Command.RELOAD:
                self.hooks.reload(self)

    def _update_pause(self) -> None:
        reason = PauseReason.NONE
        if self._manual_pause_until is not None:
            if self.clock() < self._manual_pause_until:
                reason = PauseReason.MANUAL
            else:
                self._manual_pause_until = None
                logger.info("timed pause is over: resuming")
        if reason is PauseReason.NONE:
            reason = self.hooks.policy_pause_reason(self)
        if reason != self.pause_reason:
            logger.info("pausing (%s)", reason.value) if reason else logger.info("resuming training")
            self.pause_reason = reason

    # ------------------------------------------------------------------ periodic work

    def _checkpoint(self) -> None:
        if self.store is None or self.trainer is None or self.optimizer is None:
            return
        self.hooks.long_operation(self, 60.0)
        scheduler = getattr(self.optimizer.state_averager, "scheduler", None)
        state = {
            "format": 1,
            "model": self.trainer.task.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "epoch": self.optimizer.local_epoch,
            "data_position": self.trainer.task.train_batches.state_dict(),
            "samples_processed": self.trainer.samples_processed,
            "saved_at": self.wall_clock(),
            "fingerprint": self.fingerprint,
        }
        try:
            path = self.store.save(state)
        except CheckpointError as exc:
            self._checkpoint_failed += 1
            self._last_checkpoint_error = str(exc)
            logger.error("checkpoint failed (training goes on; previous checkpoint kept): %s", exc)
            return
        self._checkpoint_ok += 1
        self._last_checkpoint_error = ""
        self._last_checkpoint_time = self.wall_clock()
        logger.info("checkpoint written: %s (epoch %d)", path.name, self.optimizer.local_epoch)

    def _refresh_fingerprint(self) -> None:
        try:
            claim_fingerprint(self.dht, self.config.swarm.run_id, self.fingerprint, self._fingerprint_first_seen)
        except Exception as exc:  # a mismatch appearing later is another node's problem, not ours
            logger.warning("could not refresh the model fingerprint: %s", exc)

    def _exchange_records(self) -> None:
        try:
            self.swarm_view = self.hooks.exchange_records(self, self._own_record())
        except Exception as exc:  # the DHT being slow or odd must never stop training
            logger.warning("peer records unavailable: %r", exc)

    def _reachability(self) -> Reachability:
        if self.config.swarm.client_mode:
            return Reachability.CLIENT
        if any("p2p-circuit" in addr for addr in self.maddrs):
            return Reachability.RELAYED
        return Reachability.DIRECT if self.maddrs else Reachability.UNKNOWN

    def _own_record(self) -> PeerRecord:
        return PeerRecord.from_status(self.snapshot())

    def _set_state(self, state: NodeState) -> None:
        if state is not self.state:
            logger.info("state %s -> %s", self.state.value.upper(), state.value.upper())
            self.state = state
            self._publish_snapshot()

    def _publish_snapshot(self) -> None:
        self.latest.publish(self.snapshot(), self.swarm_view)

    def snapshot(self) -> StatusSnapshot:
        now, wall = self.clock(), self.wall_clock()
        stats = self.swarm_stats
        optimizer, trainer = self.optimizer, self.trainer
        tracker = optimizer.tracker if optimizer is not None else None
        global_epoch = max(tracker.global_epoch if tracker else 0, self.swarm_view.global_epoch,
                           trainer.epoch if trainer else 0)
        return StatusSnapshot(
            version=__version__, state=self.state.value, pause_reason=self.pause_reason.value,
            peer_id=self.peer_id, visible_maddrs=tuple(self.maddrs), reachability=self._reachability().value,
            run_id=self.config.swarm.run_id, model_fingerprint=self.fingerprint,
            local_epoch=trainer.epoch if trainer else 0, global_epoch=global_epoch,
            samples_accumulated=tracker.global_progress.samples_accumulated if tracker else 0,
            target_batch_size=self.config.training.target_batch_size,
            samples_processed_total=trainer.samples_processed if trainer else 0,
            local_samples_per_second=self._rate.rate(now),
            swarm_samples_per_second=self.swarm_view.swarm_samples_per_second,
            # Signed records are the swarm view; hivemind's progress entries outlive departed peers.
            peers_online=self.swarm_view.peers_online or (tracker.global_progress.num_peers if tracker else 0),
            loss=self._loss.value, val_loss=self._val_loss,
            averaging_rounds_ok_total=stats.rounds_ok, averaging_rounds_failed_total=stats.rounds_failed,
            last_round_duration_seconds=stats.last_round_duration, last_round_group_size=stats.last_group_size,
            round_duration_bucket_counts=tuple(stats.round_bucket_counts),
            round_duration_sum_seconds=stats.round_duration_sum,
            bytes_sent_total=stats.bytes_sent, bytes_received_total=stats.bytes_received,
            state_downloads_total=stats.state_downloads, state_downloads_failed_total=stats.state_downloads_failed,
            state_download_seconds_total=stats.state_download_seconds,
            state_download_progress=stats.state_download_progress,
            checkpoint_writes_ok_total=self._checkpoint_ok, checkpoint_writes_failed_total=self._checkpoint_failed,
            last_checkpoint_time=self._last_checkpoint_time, last_checkpoint_error=self._last_checkpoint_error,
            nonfinite_skips_total=trainer.nonfinite_skips if trainer else 0,
            rollbacks_total=self.guard.rollbacks if self.guard else 0,
            rejected_records_total=self.swarm_view.rejected_records_total,
            seconds_since_progress=None if self._last_progress is None else now - self._last_progress,
            uptime_seconds=now - self._started_mono, started_at=self.started_at, taken_at=wall,
        )
