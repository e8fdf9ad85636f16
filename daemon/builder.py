"""Builds what a node runs on: an owned run's plan, the swarm presence (DHT, rejoiner, the run's
keeper) and the training parts (task, optimizer, trainer, rollback guard, checkpoints), and takes
them down again.

This is the only part of the daemon that creates hivemind objects; the node and its loop get
the finished parts, so both can be tested with fakes that stand in for this builder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import ConfigError, NodeConfig, SwarmSection
from p2ptrain.daemon.checkpointer import Checkpointer
from p2ptrain.daemon.faults import with_faults
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.dhtkeys import averaging_prefix
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.model.device import Placement, to_cpu
from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.optim.build import bandwidth_hint, build_optimizer
from p2ptrain.optim.defences import evaluate_fn
from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.optim.rollback import NonFiniteRollback
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.optim.trainer import Trainer
from p2ptrain.swarm.daemon_flags import free_loopback_port
from p2ptrain.swarm.dht import (
    FingerprintMismatch,
    PeersRefused,
    claim_fingerprint,
    invite_only_hint,
    peer_ids_of,
    start_dht,
    stop_stale_daemons,
    visible_maddrs,
)
from p2ptrain.swarm.dialback import Dialback, ask_dialback, serve_dialback
from p2ptrain.swarm.identity import identity_path
from p2ptrain.swarm.manifest_source import fetch_before_join
from p2ptrain.swarm.ownedrun import RunKeeper, RunPlan, fetch_readmitting, prepare_run, settle
from p2ptrain.swarm.rejoin import Rejoiner
from p2ptrain.swarm.relay_meter import RelayMeter
from p2ptrain.swarm.run_entries import keep_newest_versions
from p2ptrain.tasks.base import Task
from p2ptrain.tasks.loader import build_task

logger = logging.getLogger(__name__)

#: The longest the training loop waits for the DHT's process to say the node's addresses (it asks every
#: minute; a DHT that does not answer keeps the last addresses instead of the loop).
CURRENT_MADDRS_TIMEOUT = 10.0


def peer_seed(peer_id: str) -> int:
    """A stable 63-bit seed for this node's data slice, derived from its peer ID."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") >> 1


@dataclass
class JoinedSwarm:
    """This node's place in the swarm."""

    dht: Any
    peer_id: str
    maddrs: list[str]
    state_dir: Path
    rejoiner: Rejoiner | None = None
    first_seen: float = 0.0
    """When this node first saw its model fingerprint under the run (kept when re-publishing it)."""

    trusted: tuple[str, ...] = ()
    """Peer IDs whose records vouch for the run's model: the initial peers this node joined through."""

    dialback: Dialback | None = None
    """What the initial peers found when asked to dial this node back (None: not asked)."""

    relay: RelayMeter = field(default_factory=lambda: RelayMeter(None))
    """What this node's p2p daemon relays for peers behind NAT (its own counters)."""

    def current_maddrs(self) -> list[str]:
        """The addresses peers see now (asked of the p2p daemon; ``maddrs`` are those of the start)."""
        return visible_maddrs(self.dht, latest=True, timeout=CURRENT_MADDRS_TIMEOUT)

    @property
    def undialable(self) -> bool:
        """Whether a peer answered that it could not connect to this node (it then averages as a client)."""
        return self.dialback is not None and self.dialback.dialable is False

    def refresh_fingerprint(self, run_id: str, fingerprint: str, met: Collection[str] = ()) -> None:
        """Republish our fingerprint; raises :class:`FingerprintMismatch` when the run's peers now show
        another model (the node decides what to do about it).  Witnesses are the peers this node joined
        through and ``met``, the peers it has averaged with lately."""
        try:
            self.first_seen = claim_fingerprint(self.dht, run_id, fingerprint, self.first_seen,
                                                {*self.trusted, *met})
        except FingerprintMismatch:
            raise
        except Exception as exc:  # the DHT being slow or odd is weather
            logger.warning("could not refresh the model fingerprint: %s", exc)

    def close(self) -> None:
        if self.rejoiner is not None:
            self.rejoiner.stop()
        try:
            self.dht.shutdown()
        except Exception as exc:  # shutting down must go on whatever hivemind says
            logger.warning("DHT shutdown: %r", exc)
        # hivemind kills a DHT process that does not stop in time, and its p2pd lives on.
        stop_stale_daemons(identity_path(self.state_dir))


@dataclass
class TrainingParts:
    """The model, its optimizer and what watches over them."""

    task: Task
    optimizer: SwarmOptimizer
    trainer: Trainer
    rollback: NonFiniteRollback
    checkpointer: Checkpointer
    fingerprint: str

    def save_checkpoint(self, **extra: Any) -> bool:
        """Write a checkpoint (CPU tensors, whatever the device); ``extra`` adds run facts for the model
        card (``val_loss``, ``run_ref``...)."""
        return self.checkpointer.save({**checkpoint_state(self.trainer, self.optimizer), **extra})

    def close(self) -> None:
        try:
            self.optimizer.shutdown()
        except Exception as exc:  # shutting down must go on whatever hivemind says
            logger.warning("optimizer shutdown: %r", exc)


class NodeBuilder:
    """Creates the real parts.  Tests hand the node a fake with the same methods."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)

    def prepare(self, config: NodeConfig, state_dir: Path) -> RunPlan | None:
        """An owned run's plan (None: a plain run); reads the manifest file and identity, writes nothing.

        Its admission gate is created here, before hivemind forks the DHT and the averagers.
        """
        return prepare_run(config, identity_path(state_dir))

    def fetch_manifest(self, plan: RunPlan, initial_peers: Sequence[str], stopper: Stopper) -> RunPlan:
        """The one-line join: the run's manifest fetched from the swarm and settled into the plan
        before the node writes anything, so a config it contradicts leaves the state dir untouched.
        A node its kept manifest excluded looks for a newer version that readmits it
        (:func:`p2ptrain.swarm.ownedrun.fetch_readmitting`)."""
        return fetch_readmitting(plan, initial_peers, stopper.is_set,
                                 lambda plan: self._fetch_manifest(plan, initial_peers, stopper))

    def _fetch_manifest(self, plan: RunPlan, initial_peers: Sequence[str], stopper: Stopper) -> RunPlan:
        if not initial_peers:
            raise ConfigError(f"swarm.initial_peers: run {plan.ref} has no manifest here (swarm.manifest, or one this "
                              "node kept from an earlier start) and no peer to fetch it from: give --join ADDR "
                              "(or swarm.initial_peers), or the manifest file with --manifest FILE")
        manifest = fetch_before_join(plan.ref, initial_peers, timeout=plan.config.swarm.bootstrap_timeout,
                                     stop=stopper, dht_options=plan.dht_kwargs(), invited=plan.authorizer is not None)
        logger.info("run %s: fetched manifest version %d from the swarm", plan.ref, manifest.version)
        return settle(plan, manifest)

    def join(self, config: NodeConfig, state_dir: Path, initial_peers: Callable[[], Sequence[str]],
             validators: list[Any], stopper: Stopper, wall_clock: Callable[[], float],
             plan: RunPlan | None = None) -> JoinedSwarm:
        stale = stop_stale_daemons(identity_path(state_dir))
        if stale:
            logger.info("stopped %d p2p daemon(s) left running by a previous run of this node", stale)
        options = plan.dht_kwargs() if plan is not None else {}
        if plan is not None:
            validators = [*validators, *plan.validators]

        metrics_port = free_loopback_port()

        def start(section: SwarmSection) -> Any:
            try:
                return start_dht(section, state_dir, list(initial_peers()), validators, stopper,
                                 metrics_port=metrics_port, **options)
            except PeersRefused as error:
                if plan is None or config.swarm.invite is not None:
                    raise
                raise PeersRefused(f"{error}{invite_only_hint(plan.ref)}") from None

        dht = start(config.swarm)
        trusted = tuple(peer_ids_of(list(initial_peers())))
        dialback = None
        if not config.swarm.client_mode:
            serve_dialback(dht)  # peers that join through this node may ask whether they can be dialled
            if config.swarm.check_reachability and trusted:
                dialback = ask_dialback(dht, trusted, visible_maddrs(dht))
            if dialback is not None and dialback.dialable is False:
                # A DHT server nobody can dial slows every peer that tries it, and hivemind's averagers
                # take their client mode from the DHT's: start it again as a client.
                logger.info("no peer can connect to this node: joining again as a client")
                dht.shutdown()
                stop_stale_daemons(identity_path(state_dir))
                dht = start(config.swarm.model_copy(update={"client_mode": True}))
        if plan is not None:
            keep_newest_versions(dht)  # the run's manifest key: one entry per version, the newest few
        swarm = JoinedSwarm(dht, str(dht.peer_id), visible_maddrs(dht), state_dir, first_seen=wall_clock(),
                            trusted=trusted, dialback=dialback, relay=RelayMeter(metrics_port))
        swarm.rejoiner = Rejoiner(dht, lambda: list(initial_peers()))
        swarm.rejoiner.start()
        return swarm

    def follow_run(self, plan: RunPlan, swarm: JoinedSwarm) -> RunKeeper:
        """What keeps an owned run's manifest, members and gate current once the DHT is up."""
        return RunKeeper(plan, swarm.dht)

    def build_training(self, config: NodeConfig, swarm: JoinedSwarm, stats: SwarmStats, *,
                       live_peers: Callable[[], Sequence[str]], wall_clock: Callable[[], float],
                       long_operation: Callable[[float], None], run: RunKeeper | None = None,
                       defences: Any = None, wait: Callable[[float], object] = time.sleep) -> TrainingParts:
        """Task, optimizer (resumed from the local checkpoint if there is one), trainer and guards.

        ``live_peers`` names the peers training now: the data is shared out among them. In an owned
        run (``run``) the model must match the manifest's fingerprint, and the averagers take part
        only with the peers its admission gate admits.  ``defences`` are the node's peer checks
        (:class:`p2ptrain.optim.defences.Defences`; None: off).  ``wait`` is the node's stop event's wait.
        """
        # First, so that a CUDA device this machine lacks stops the node before anything is built.
        placement = Placement.from_settings(config.training.device, config.training.precision)
        task = build_task(config.task, config.training, peer_seed(swarm.peer_id), peer_id=swarm.peer_id,
                          live_peers=live_peers, cache_dir=config.task.cache_dir or swarm.state_dir / "data-cache")
        task = with_faults(task, self._environ)
        fingerprint = model_fingerprint(task.model, task.shape_config)
        if run is None:
            swarm.first_seen = claim_fingerprint(swarm.dht, config.swarm.run_id, fingerprint, swarm.first_seen,
                                                 swarm.trusted)
        else:  # the signed manifest holds the run's model; unsigned entries are for plain runs
            run.check_fingerprint(fingerprint)
        logger.info("model fingerprint %s (%d parameters); %s", fingerprint,
                    sum(p.numel() for p in task.model.parameters()), placement.describe())
        # The model (and so the optimizer state built on it) lives on the device; checkpoints are CPU
        # tensors that load_state_dict copies over, whatever device wrote them.
        task.model.to(placement.device)

        checkpointer = Checkpointer(CheckpointStore(config.checkpoint_dir(), keep=config.checkpoint.keep),
                                    fingerprint, wall_clock=wall_clock, long_operation=long_operation)
        restored = checkpointer.load_latest()
        if restored is not None:
            task.model.load_state_dict(restored["model"])
            task.train_batches.load_state_dict(restored.get("data_position", {}))
        optimizer = _optimizer(config, swarm, task, fingerprint, stats, run, defences, wait, placement)
        trainer = Trainer(task, optimizer, config.training.batch_size, placement)
        if restored is not None:
            optimizer.restore(restored)
            optimizer.apply_training(config.training)  # the settings in force, not the checkpoint's
            trainer.samples_processed = int(restored.get("samples_processed", 0))
            stats.credit.restore(restored)
        return TrainingParts(task, optimizer, trainer, NonFiniteRollback(optimizer.guard_targets()), checkpointer,
                             fingerprint)

    def build_client(self, config: NodeConfig, swarm: JoinedSwarm, stats: SwarmStats, *,
                     run: RunKeeper | None = None, defences: Any = None) -> ClientParts:
        """Task and optimizer of a peer that only downloads the swarm's state (``p2ptrain fetch``).

        The same model, fingerprint check and optimizer as :meth:`build_training`, but nothing is
        published (no fingerprint claim), no local checkpoint is read, and the data is this peer's
        alone: it trains on none of it, only the validation split is used (to judge a donor's model).
        """
        task = build_task(config.task, config.training, peer_seed(swarm.peer_id), peer_id=swarm.peer_id,
                          live_peers=lambda: [swarm.peer_id],
                          cache_dir=config.task.cache_dir or swarm.state_dir / "data-cache")
        fingerprint = model_fingerprint(task.model, task.shape_config)
        if run is None:
            claim_fingerprint(swarm.dht, config.swarm.run_id, fingerprint, swarm.first_seen, swarm.trusted,
                              publish=False)
        else:
            run.check_fingerprint(fingerprint)
        return ClientParts(task, _optimizer(config, swarm, task, fingerprint, stats, run, defences), fingerprint)


@dataclass
class ClientParts:
    """What a peer that never trains holds: the model and the optimizer that downloads into it."""

    task: Task
    optimizer: SwarmOptimizer
    fingerprint: str

    def close(self) -> None:
        try:
            self.optimizer.shutdown()
        except Exception as exc:  # shutting down must go on whatever hivemind says
            logger.warning("optimizer shutdown: %r", exc)


def _optimizer(config: NodeConfig, swarm: JoinedSwarm, task: Task, fingerprint: str, stats: SwarmStats,
               run: RunKeeper | None, defences: Any,
               wait: Callable[[float], object] = time.sleep, placement: Placement | None = None) -> SwarmOptimizer:
    """The swarm optimizer for ``task``'s model, averaging under the run's id and model fingerprint
    (``wait``: the pause between state-download attempts, the node's stop event's wait)."""
    return build_optimizer(task.model, swarm.dht, averaging_prefix(config.swarm.run_id, fingerprint), config.training,
                           client_mode=config.swarm.client_mode or swarm.undialable, stats=stats,
                           bandwidth=bandwidth_hint(config.volunteer.upload_kbps, config.volunteer.download_kbps),
                           admission=run.plan.gate if run is not None else None,
                           defences=defences, evaluate=evaluate_fn(task, placement), wait=wait)


def checkpoint_state(trainer: Trainer, optimizer: SwarmOptimizer) -> dict[str, Any]:
    """Model, optimizer and data position: everything a restart needs to go on exactly here; and the
    credit (this node's contributed samples, the contributors it has seen) for restarts and model cards."""
    return to_cpu({
        "model": trainer.task.model.state_dict(),
        **optimizer.checkpoint_state(),
        "data_position": trainer.task.train_batches.state_dict(),
        "samples_processed": trainer.samples_processed,
        **optimizer.stats.credit.checkpoint_fields(),
    })
