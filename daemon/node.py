"""The node's life: STARTING -> JOINING -> SYNCING -> TRAINING (the loop) -> STOPPING -> STOPPED.

:class:`Node` joins the swarm and builds its parts through its swarm session (``daemon.session``,
the life cycle ``p2ptrain fetch`` shares) and a builder (``daemon.builder``), syncs with the swarm
(``daemon.sync``), hands over to the training loop (``daemon.loop``), and on the
way out writes a final checkpoint and takes everything down within a deadline (``daemon.shutdown``).
In an owned run it settles the run's plan before anything is written, takes the run's settings
from its signed manifest once joined, and follows new manifest versions (``daemon.runfollow``).
It maps every way a node can end to an exit code: 0 clean stop; 78 (EX_CONFIG) bad
configuration, a bad manifest or invite, a model that does not match the run, or this node banned
from it; 75 (EX_TEMPFAIL) another node holds the state directory, or a new manifest version needs
a restart; 1 the swarm (or the run's manifest in it) could not be reached, or the node failed.
Swarm trouble is normal weather and never ends a node.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import ConfigError, NodeConfig
from p2ptrain.daemon.builder import JoinedSwarm, NodeBuilder, TrainingParts
from p2ptrain.daemon.control import ControlQueue
from p2ptrain.daemon.cpushare import CpuShare, default_cpu_source
from p2ptrain.daemon.hooks import NodeHooks, NodeOutlets
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.daemon.loop import PAUSED_WAIT, TrainingLoop
from p2ptrain.daemon.runfollow import RunFollower, describe_figures
from p2ptrain.daemon.session import SwarmSession
from p2ptrain.daemon.shownview import shown_view
from p2ptrain.daemon.shutdown import land_round_in_flight
from p2ptrain.daemon.snapshot import (
    DeviceFigures,
    NodeIdentity,
    RunFigures,
    StatusBoard,
    TrainingFigures,
    data_figures,
)
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.daemon.sync import sync_with_swarm
from p2ptrain.errors import EX_CONFIG, EX_DATAERR, EX_FAILURE, EX_OK, EX_TEMPFAIL, error_line
from p2ptrain.model.limits import ModelRefused, check_task_code
from p2ptrain.optim.defences import Defences
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.status import LatestSnapshot, NodeState, SwarmView
from p2ptrain.swarm.dht import FingerprintMismatch, IdentityInUse, SwarmError
from p2ptrain.swarm.manifest_source import SourceUnavailable
from p2ptrain.swarm.ownedrun import RunKeeper, RunPlan
from p2ptrain.swarm.reach import missing_announced
from p2ptrain.trust.swarm_credit import epoch_samples_bound

logger = logging.getLogger(__name__)


class Node:
    """One p2ptrain node. Build it, call :meth:`run` from the main thread, get an exit code."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        extra_peers: Sequence[str] = (),
        log_ring: LogRing | None = None,
        hooks: NodeHooks | None = None,
        builder: NodeBuilder | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        set_threads: Callable[[int], None] | None = None,
        paused_wait: float = PAUSED_WAIT,
        cpu_share: CpuShare | None = None,
        trust_task_code: bool = False,
    ) -> None:
        self.config = config
        #: An owned run's manifest is someone else's: its task code runs only when it is this node's own
        #: config's entrypoint, or with ``--trust-task-code``.
        self._own_entrypoint = config.task.entrypoint
        self.trust_task_code = trust_task_code
        self.extra_peers = list(extra_peers)
        self.logs = log_ring or LogRing()
        self.hooks = hooks or NodeHooks()
        self.builder = builder or NodeBuilder()
        self.clock, self.wall_clock = clock, wall_clock
        self.set_threads = set_threads or _set_torch_threads
        self.paused_wait = paused_wait
        self.stopper = Stopper()
        self.control = ControlQueue(wake=self.stopper.wake)  # a request cuts a paused loop's wait short
        self.latest = LatestSnapshot()
        self.swarm_stats = SwarmStats()
        self.board = StatusBoard(self.latest, config.training.target_batch_size, clock=clock, wall_clock=wall_clock)
        self.cpu_share = cpu_share or CpuShare(config.volunteer.max_cpu_percent, cpu_seconds=default_cpu_source(),
                                               clock=clock, wait=self.stopper.wait)
        self.board.view = self._swarm_view
        self.board.stats = self.swarm_stats.view
        self.board.rounds = self.swarm_stats.rounds.figures
        self.board.cpu = self.cpu_share.figures
        #: Plan, swarm, parts and leaving: the life cycle this node shares with ``p2ptrain fetch``.
        self.session = SwarmSession(config, builder=self.builder, hooks=self.hooks, stopper=self.stopper,
                                    initial_peers=self.initial_peers, wall_clock=wall_clock,
                                    vouches=self.swarm_stats.credit.vouches)
        self.parts: TrainingParts | None = None
        self.loop: TrainingLoop | None = None
        #: How the node ends when nothing goes wrong: 0, or what a manifest update asked for.
        self.exit_code = EX_OK
        self._exit_reason = ""
        self._not_admitted = 0
        #: Exit code if shutdown has to be cut short: 0 only once the final checkpoint is safe.
        self._forced_exit_code = EX_FAILURE

    @property
    def plan(self) -> RunPlan | None:
        return self.session.plan

    @property
    def keeper(self) -> RunKeeper | None:
        return self.session.keeper

    @property
    def defences(self) -> Defences | None:
        """The peer checks (p2ptrain.optim.defences.Defences), built before anything forks; None when off."""
        return self.session.defences

    @property
    def swarm(self) -> JoinedSwarm | None:
        return self.session.swarm

    def request_stop(self, reason: str) -> None:
        """Thread- and signal-safe: the loop notices between steps and leaves cleanly."""
        self.stopper.request(reason)

    def current_config(self) -> NodeConfig:
        """The config in force: the loop's once it runs (a SIGHUP may have changed it)."""
        return self.loop.config if self.loop is not None else self.config

    def training_peers(self) -> list[str]:
        """Peer IDs training now, as the latest swarm view has them (our own included once published)."""
        return [peer.peer_id for peer in self.latest.swarm().peers if peer.state == NodeState.TRAINING]

    def _peer_passes(self) -> list[tuple[str, int]]:
        """(shard list, pass) of the other peers training now, from their records."""
        own = self.latest.status().peer_id
        return [(peer.data_source, peer.data_pass) for peer in self.latest.swarm().peers
                if peer.state == NodeState.TRAINING and peer.peer_id != own and peer.data_source]

    def initial_peers(self) -> list[str]:
        return list(dict.fromkeys([*self.current_config().swarm.initial_peers, *self.extra_peers]))

    def request_exit(self, reason: str, code: int) -> None:
        """Stop (final checkpoint and all) and end with ``code``; from the training thread only."""
        if self.exit_code == EX_OK:
            self.exit_code, self._exit_reason = code, reason
            logger.warning("%s", reason)
        self.stopper.request(reason)

    def _swarm_view(self) -> SwarmView | None:
        """The peer records as this node shows them (:func:`p2ptrain.daemon.shownview.shown_view`)."""
        view = self.hooks.swarm_view()
        if view is None:
            return view
        view, self._not_admitted = shown_view(view, gate=self.plan.gate if self.plan is not None else None,
                                              defences=self.defences, own=self.latest.status())
        return view

    def _run_figures(self) -> RunFigures:
        if self.keeper is None:
            return RunFigures()
        return RunFigures(**self.keeper.status(), records_not_admitted=self._not_admitted)

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Run the node to its end; the exit code says how it ended (one line on stderr if badly)."""
        try:
            # An owned run's manifest and invite are checked before anything is written: the file
            # (or the version kept from an earlier start), else the swarm's, fetched for it.
            self._use_config(self.session.prepare(fetch_manifest=True))
            self._admit_task_code(self.config)  # before anything is written, joined or imported
            self.session.open()
            try:
                code = self._run(self.session.state_dir)
            finally:
                self._close()
            if code:
                print(f"p2ptrain: {self._exit_reason}", file=sys.stderr)
            return code
        except (FingerprintMismatch, ConfigError) as error:
            return _fail(error, EX_CONFIG)
        except ModelRefused as error:
            return _fail(error, EX_DATAERR)
        except IdentityInUse as error:
            return _fail(error, EX_TEMPFAIL)
        except (SwarmError, SourceUnavailable) as error:
            if self.stopper.is_set():  # asked to stop while still joining: a clean stop, not a failure
                logger.info("stopped before joining the swarm (%s)", self.stopper.reason)
                return EX_OK
            return _fail(error, EX_FAILURE)
        except OSError as error:  # e.g. the API port is taken, the state directory is not writable
            return _fail(error, EX_FAILURE)

    def _run(self, state_dir: Path) -> int:
        cfg = self.config
        self.set_threads(cfg.training.threads)
        if self.defences is not None:
            self.board.offences, self.board.vouchers = self.defences.figures, self.defences.vouchers
        self.board.set_state(NodeState.STARTING)
        self.hooks.starting(NodeOutlets(state_dir, self.latest, self.logs, self.control))

        self.board.set_state(NodeState.JOINING)
        swarm = self.session.join()
        self.board.relay = swarm.relay.figures
        asked = swarm.dialback
        self.board.identity = identity = NodeIdentity(
            cfg.swarm.run_id, swarm.peer_id, tuple(swarm.maddrs), client_mode=cfg.swarm.client_mode,
            announce=tuple(cfg.swarm.announce_addrs), dialable=asked.dialable if asked else None,
            dialed=asked.address if asked else "")
        logger.info("%s", identity.reach().line())
        unannounced = missing_announced(swarm.maddrs, cfg.swarm.announce_addrs)
        if unannounced:
            logger.warning("swarm.announce_addrs: libp2p does not announce %s; check the address and that this node "
                           "listens on its port (swarm.listen_addrs)", ", ".join(unannounced))
        how_to_join = " ".join(f"--join {addr}" for addr in swarm.maddrs)
        if self.plan is not None:
            how_to_join = f"p2ptrain run {how_to_join} --run {self.plan.ref}"
        if self.initial_peers():
            logger.info("joined swarm %r as %s", cfg.swarm.run_id, swarm.peer_id)
        else:
            logger.info("started a new swarm %r; others can join with: %s", cfg.swarm.run_id, how_to_join)
        if self.plan is not None:
            cfg = self._follow_run()
        records_read = self.session.read_records()
        presence = self.session.presence
        assert presence is not None
        evidence = presence.evidence

        def build(config: NodeConfig, joined: JoinedSwarm, **run: Any) -> TrainingParts:
            self._admit_task_code(config)  # the manifest in force may be newer than the one read at start
            return self.builder.build_training(
                config, joined, self.swarm_stats, live_peers=self.training_peers, wall_clock=self.wall_clock,
                long_operation=self.hooks.long_operation, wait=self.stopper.wait, **run)

        self.parts = parts = self.session.build(build)
        self._watch(parts)
        follower = RunFollower(self.keeper, parts.optimizer, parts.trainer, peer_id=swarm.peer_id,
                               fingerprint=parts.fingerprint, request_exit=self.request_exit, clock=self.clock,
                               wall_clock=self.wall_clock) if self.keeper is not None else None

        def refresh_fingerprint() -> None:
            if self.keeper is None:  # owned runs keep the fingerprint in the signed manifest
                try:
                    swarm.refresh_fingerprint(cfg.swarm.run_id, parts.fingerprint,
                                              self.defences.evidence.met_peers() if self.defences is not None else ())
                except FingerprintMismatch as error:
                    if self.defences is None or not self.defences.overrules_fingerprint_records(str(error)):
                        self.request_exit(str(error), EX_CONFIG)

        self.loop = TrainingLoop(cfg, parts, self.board, self.hooks, self.stopper, self.control, clock=self.clock,
                                 cpu_share=self.cpu_share, rounds=self.swarm_stats.rounds,
                                 refresh_fingerprint=refresh_fingerprint, set_threads=self.set_threads,
                                 paused_wait=self.paused_wait, poll_run=follower.poll if follower else None,
                                 current_maddrs=swarm.current_maddrs)

        self.board.set_state(NodeState.SYNCING)
        training = cfg.training
        sync_with_swarm(parts.optimizer, self.stopper, self.clock, before_download=lambda: self.hooks.long_operation(
            training.load_state_timeout * training.load_state_attempts), alone=not self.initial_peers(),
            records=evidence.records_seen if evidence is not None and records_read else None)
        if not self.stopper.is_set():  # a stop during the sync skips straight to the final checkpoint
            self.loop.validate()
            self.board.set_state(NodeState.TRAINING)
            self.hooks.ready(presence)
            self.loop.run()

        self.board.set_state(NodeState.STOPPING)
        logger.info("stopping (%s): writing a final checkpoint", self.stopper.reason)
        training = self.current_config().training
        self.hooks.long_operation(training.averaging_timeout + training.matchmaking_time)
        land_round_in_flight(parts.optimizer, self.swarm_stats.rounds)
        if self.loop.checkpoint():
            self._forced_exit_code = self.exit_code
        return self.exit_code

    def _admit_task_code(self, config: NodeConfig) -> None:
        """:class:`ModelRefused` (exit 65) when an owned run's manifest names task code the user did not trust."""
        if self.plan is not None:
            check_task_code(config.task, f"the manifest of run {self.plan.ref}", trust_task_code=self.trust_task_code,
                            own_entrypoint=self._own_entrypoint)

    def _use_config(self, config: NodeConfig) -> None:
        self.config = config
        self.board.target_batch_size = config.training.target_batch_size

    def _follow_run(self) -> NodeConfig:
        """Joined an owned run: its manifest (fetched when the node has only the reference) decides
        the run-wide settings from here on."""
        self._use_config(self.session.follow_run(self.config.swarm.bootstrap_timeout))
        assert self.keeper is not None
        self.board.run = self._run_figures
        logger.info("%s", describe_figures(self.keeper.status()))
        return self.config

    def _watch(self, parts: TrainingParts) -> None:
        """Point the status board at the parts' figures."""
        self.board.identity = dataclasses.replace(self.board.identity, fingerprint=parts.fingerprint)
        self.board.training = lambda: TrainingFigures(parts.trainer.epoch, parts.trainer.samples_processed,
                                                      parts.trainer.nonfinite_skips, parts.rollback.rollbacks)
        self.board.progress = parts.optimizer.global_progress
        self.board.checkpoints = lambda: parts.checkpointer.figures
        placement = getattr(parts.trainer, "placement", None)  # test doubles of the trainer may have none
        if placement is not None:
            self.board.device = lambda: DeviceFigures(placement.name, placement.precision, placement.memory_bytes())
        credit = self.swarm_stats.credit
        self.board.credit, self.board.note_contributors = credit.figures, credit.note_contributors
        self.board.vouched = credit.vouches.largest
        self.board.data = lambda: data_figures(parts.task.train_batches)
        if hasattr(parts.task.train_batches, "swarm_passes"):  # a shard stream keeps in step with its peers
            parts.task.train_batches.swarm_passes = self._peer_passes
        self.board.credit_bound = lambda: epoch_samples_bound(self.current_config().training)

    def _close(self) -> None:
        """Take down what the node owns; a hang past the deadline ends the process (helpers and all)."""
        self.session.leave(lambda: self._forced_exit_code)
        self.board.set_state(NodeState.STOPPED)
        self.stopper.close()


def _fail(error: BaseException, code: int) -> int:
    print(error_line(error), file=sys.stderr)
    return code


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads or os.cpu_count() or 1)
