"""``p2ptrain fetch``: the swarm's current model, written as an export, without running a node.

The fetcher joins the run as a client-mode peer (it dials out only: nobody can ask it for
anything), builds the run's model and optimizer through the node's own builder, and downloads
the state through the optimizer's validated path, in gradient and DiLoCo mode alike: the donor's
tensors are checked for count, shape, size and finite values, its epoch against what the run's
peers report in their signed records, and its model's validation loss here.  It publishes
nothing (no peer record, no progress entry, no fingerprint), trains on nothing and serves no
state, so the swarm never counts it or waits for it.  Only a state that was adopted is written,
with :func:`p2ptrain.model.export.write_export`; the model card names the donor and the epoch, and gives the
samples and contributors the run's peer records claim (bounded, and said to be their claims).

Exit codes: 0 written; 1 OUT_DIR cannot be used (it exists: ``--force``) or cannot be written;
69 (EX_UNAVAILABLE) no peer answered, or none served a state that passed the checks, within
``--timeout``; 75 another node holds the state directory (invite runs, which fetch with the node's
own identity); 78 bad input (an address, a run reference, a manifest, a config, a model that is not
the run's); 130 stopped by a signal.  Whatever the reason, nothing is written unless it is 0.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from p2ptrain.config.schema import DAY, ConfigError, NodeConfig, load_config, parse_multiaddr
from p2ptrain.daemon.builder import ClientParts, JoinedSwarm, NodeBuilder
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.model.export import VAL_OF_EXPORT, CardInfo, ExportError, check_target, write_export
from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.swarm.dht import FingerprintMismatch, IdentityInUse, IdentityLock, PeersRefused, SwarmError
from p2ptrain.swarm.manifest_source import SourceUnavailable
from p2ptrain.swarm.ownedrun import apply_run_flags
from p2ptrain.trust.swarm_credit import credited_view, epoch_samples_bound

logger = logging.getLogger(__name__)

EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_INTERRUPTED = 130
#: The fetcher listens on loopback only: in client mode nobody dials it, and a node's port stays free.
CLIENT_LISTEN = "/ip4/127.0.0.1/tcp/0"
#: Longest wait for the run's progress and first peer records before the first download (a node waits
#: as long): the state is judged against what they report.
SETTLE_WAIT = 10.0
#: Seconds between the progress lines shown while no state has been adopted.
PROGRESS_EVERY = 10.0
#: Records are read this often (a node reads them every 5 s; a fetcher has nothing else to do).
RECORDS_PERIOD = 1.0
#: Leaving the swarm that takes longer than this is cut short (the export is already on disk).
SHUTDOWN_DEADLINE = 20.0


class Unavailable(Exception):
    """No state could be had from the swarm; the message is the one line to show."""


class RecordReader:
    """Reads the run's signed peer records into the fetcher's evidence, publishing none of its own."""

    def __init__(self) -> None:
        self._validators: list[Any] = []
        self._publisher: Any = None

    def validators(self, run_id: str) -> list[Any]:
        from p2ptrain.swarm.records import record_validators

        self._validators = record_validators(run_id)
        return self._validators

    def start(self, dht: Any, run_id: str, evidence: Any) -> None:
        from p2ptrain.daemon.record_publisher import RecordPublisher
        from p2ptrain.status import LatestSnapshot

        # A snapshot without a peer ID: the publisher then only polls (it publishes a record only for
        # a node that has one), so the fetcher never shows up in anyone's swarm view.
        self._publisher = RecordPublisher.for_run(dht, run_id, self._validators, LatestSnapshot(), evidence,
                                                  period=RECORDS_PERIOD)
        self._publisher.start()

    def peers(self) -> int:
        """Peers in the run's records now."""
        return len(self.view().peers)

    def view(self) -> Any:
        """The run's validated peer records now (a ``SwarmView``; empty before the first read)."""
        from p2ptrain.status import SwarmView

        return self._publisher.view if self._publisher is not None else SwarmView()

    def stop(self) -> None:
        if self._publisher is not None:
            self._publisher.stop()


def fetch_config(config: NodeConfig, join: Sequence[str], state_dir: Path, timeout: float) -> NodeConfig:
    """``config`` as the fetcher runs it: a client-mode peer on ``state_dir`` that dials the ``join``
    addresses (after the config's own initial peers), with NAT port mapping and AutoNAT off (it
    accepts no connections, so there is nothing to map or probe), the peer checks on whatever the
    config says (a fetched model is only as good as those checks), and joining bounded by ``timeout``."""
    swarm = config.swarm.model_copy(update=dict(
        initial_peers=list(dict.fromkeys([*config.swarm.initial_peers, *join])), client_mode=True,
        listen_addrs=[CLIENT_LISTEN], announce_addrs=[], nat_port_map=False, auto_nat=False, peer_checks=True,
        bootstrap_timeout=min(timeout, DAY)))
    # One donor may take at most half the time: a slow one must leave time for the next.
    training = config.training.model_copy(update=dict(
        load_state_timeout=min(config.training.load_state_timeout, max(5.0, timeout / 2))))
    node = config.node.model_copy(update={"state_dir": state_dir})
    return config.model_copy(update=dict(swarm=swarm, training=training, node=node))


class Fetcher:
    """Join, download, write, leave.  Build it, call :meth:`run` from the main thread, get an exit code."""

    def __init__(self, config: NodeConfig, *, timeout: float, builder: Any = None, records: Any = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.config, self.timeout = config, timeout
        self.builder = builder or NodeBuilder()
        self.records = records or RecordReader()
        self.clock, self.wall_clock = clock, wall_clock
        self.stopper = Stopper()
        self.swarm: JoinedSwarm | None = None
        self.parts: ClientParts | None = None
        self._deadline = 0.0
        self._run_id = config.swarm.run_id

    def remaining(self) -> float:
        return max(0.0, self._deadline - self.clock())

    def run(self, out_dir: Path, *, force: bool = False, torch_copy: bool = False) -> int:
        """Fetch into ``out_dir``; the exit code says how it went (one line on stderr if badly)."""
        self._deadline = self.clock() + self.timeout
        lock: IdentityLock | None = None
        code = 1
        try:
            try:
                state_dir = self.config.state_dir()
                plan = self.builder.prepare(self.config, state_dir)  # a bad manifest or run reference: 78 here
                config = plan.config if plan is not None else self.config
                state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                lock = IdentityLock(state_dir)
                lock.acquire()
                code = self._fetch(config, plan, state_dir, out_dir, force, torch_copy)
            except Exception as error:  # each failure is one line; a bug still shows its traceback
                code = self._report(error)
            return code
        finally:
            self._leave(code)
            if lock is not None:
                lock.release()

    def _report(self, error: Exception) -> int:
        """The one line and the exit code for how the fetch failed (re-raises what is a bug)."""
        stopped = f"stopped ({self.stopper.reason}) before a state was adopted; nothing written"
        if isinstance(error, ConfigError):
            return _fail(f"config error: {error}", 78, prefix="p2ptrain")
        if isinstance(error, FingerprintMismatch):
            return _fail(str(error), 78)
        if isinstance(error, IdentityInUse):
            return _fail(str(error), EX_TEMPFAIL)
        if isinstance(error, SwarmError | SourceUnavailable | Unavailable) and self.stopper.is_set():
            return _fail(stopped, EX_INTERRUPTED)
        if isinstance(error, PeersRefused | SourceUnavailable | Unavailable):
            return _fail(f"{error}; nothing written", EX_UNAVAILABLE)
        if isinstance(error, SwarmError):
            peers = ", ".join(self.config.swarm.initial_peers)
            return _fail(f"no peer answered within {self.timeout:.0f}s (--timeout); tried {peers}; nothing written",
                         EX_UNAVAILABLE)
        if isinstance(error, ExportError | OSError):  # OSError: e.g. the state directory cannot be made
            return _fail(str(error), 1)
        raise error

    def _fetch(self, config: NodeConfig, plan: Any, state_dir: Path, out_dir: Path, force: bool,
               torch_copy: bool) -> int:
        from p2ptrain.optim.defences import Defences
        from p2ptrain.optim.swarm_stats import SwarmStats

        # The gate and round reports live in memory shared with the averagers' processes: made first.
        defences = Defences.from_config(config.swarm)
        self._run_id = run_id = config.swarm.run_id
        self.swarm = swarm = self.builder.join(config, state_dir, lambda: list(config.swarm.initial_peers),
                                               self.records.validators(run_id), self.stopper, self.wall_clock,
                                               plan=plan)
        logger.info("joined run %r as client-mode peer %s (it trains nothing and serves nothing)", run_id,
                    swarm.peer_id)
        keeper = None
        if plan is not None:
            keeper = self.builder.follow_run(plan, swarm)
            config = keeper.join(self.stopper, max(1.0, self.remaining()))
        evidence = defences.joined_through(swarm.trusted)
        self.records.start(swarm.dht, run_id, evidence)
        self.parts = parts = self.builder.build_client(config, swarm, SwarmStats(), run=keeper, defences=defences)
        self._settle(parts.optimizer, evidence.records_seen)
        donor, epoch = self._download(parts)

        from p2ptrain.optim.defences import evaluate_fn

        val_loss = evaluate_fn(parts.task)()
        run_ref = str(plan.ref) if plan is not None else run_id
        finite = math.isfinite(val_loss)
        card = CardInfo(run_ref=run_ref, epoch=epoch, val_loss=val_loss if finite else None,
                        val_epoch=epoch if finite else None, val_of=VAL_OF_EXPORT if finite else "",
                        saved_at=self.wall_clock(), fetched_from=donor,
                        **swarm_credit(self.records.view(), epoch_samples_bound(config.training)))
        out = write_export(parts.task.model, config.task, parts.fingerprint, card, out_dir, force=force,
                           shape_config=parts.task.shape_config, torch_copy=torch_copy,
                           training={"batch_size": config.training.batch_size, "seed": config.training.seed})
        print(f"fetched epoch {epoch} of run {run_ref} from peer {donor} (model {parts.fingerprint}) to {out}")
        if config.task.entrypoint is None:
            print(f"try it: p2ptrain sample {out} --prompt 'def '")
        return 0

    def _settle(self, optimizer: SwarmOptimizer, records: threading.Event) -> None:
        """Wait (bounded) for the run's progress and a first view of its records, as a joining node does."""
        until = self.clock() + min(SETTLE_WAIT, self.remaining())
        while not (optimizer.global_progress().known and records.is_set()) and self.clock() < until:
            if self.stopper.wait(0.2):
                raise Unavailable("stopped")

    def _download(self, parts: ClientParts) -> tuple[str, int]:
        """Download until a state is adopted or the time is up: the donor and the epoch it served."""
        optimizer = parts.optimizer
        next_line = self.clock()
        while True:
            if optimizer.load_state_from_peers():
                source = last_download_source(optimizer)
                if source is not None:
                    donor, metadata = source
                    epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
                    return donor, epoch if isinstance(epoch, int) else optimizer.local_epoch
                logger.warning("a state was adopted but its donor is unknown; downloading again")
            now = self.clock()
            if now >= next_line:
                next_line = now + PROGRESS_EVERY
                logger.info("waiting for a state from the swarm: %s; %.0fs left", self._seen(optimizer),
                            self.remaining())
            if self.remaining() <= 0:
                hint = ""
                if self.records.peers() == 0 and optimizer.global_progress().num_peers == 0:
                    hint = (f" (nobody reports under run {self._run_id!r}: a plain run is named by its node "
                            "config, pass it with -c)")
                raise Unavailable(f"no peer served a state that passed the checks within {self.timeout:.0f}s "
                                  f"(--timeout); {self._seen(optimizer)}{hint}")
            if self.stopper.wait(min(2.0, self.remaining())):
                raise Unavailable("stopped")

    def _seen(self, optimizer: SwarmOptimizer) -> str:
        progress = optimizer.global_progress()
        return (f"{self.records.peers()} peer(s) in the run's records, {progress.num_peers} reporting progress, "
                f"swarm at epoch {progress.epoch}")

    def _leave(self, code: int) -> None:
        """Leave the swarm (bounded: past the deadline every helper is stopped and the process ends
        with ``code``, the outcome already reported)."""
        deadline = threading.Timer(SHUTDOWN_DEADLINE, _force_exit, args=(code,))
        deadline.daemon = True
        deadline.start()
        try:
            self.records.stop()
            if self.parts is not None:
                self.parts.close()
            if self.swarm is not None:
                self.swarm.close()
        finally:
            deadline.cancel()
            self.stopper.close()


def swarm_credit(view: Any, samples_per_epoch: int) -> dict[str, int | None]:
    """The card's samples and contributors from the run's peer records (``CardInfo`` keywords).

    Each record's ``samples_contributed`` is its peer's claim about itself: it is credited at most what
    the run allows a peer (:func:`p2ptrain.trust.swarm_credit.credited_view`), and the card says how many
    records the figures come from.  No record read: nothing recorded (the card says so).
    """
    if not view.peers:
        return {"samples": None, "contributors": None, "reported_by": 0}
    credited = credited_view(view, samples_per_epoch)
    return {"samples": credited.samples_contributed,
            "contributors": sum(1 for peer in credited.peers if peer.samples_contributed > 0),
            "reported_by": len(credited.peers)}


def last_download_source(optimizer: SwarmOptimizer) -> tuple[str, Any] | None:
    """(donor peer ID, metadata) of the state the optimizer's hardened state averager last accepted.

    The state averager is ``state_averager`` in gradient mode and ``averager`` in DiLoCo mode; both
    are :class:`p2ptrain.averaging.hardened.AveragerLayer` classes, which remember the donor.
    """
    for name in ("state_averager", "averager"):
        source = getattr(getattr(optimizer, name, None), "last_download_source", None)
        if source is not None:
            return source
    return None


def _fail(line: str, code: int, prefix: str = "p2ptrain fetch") -> int:
    print(f"{prefix}: {line}", file=sys.stderr)
    return code


def _force_exit(code: int) -> None:
    """Runs on a timer thread when leaving the swarm hangs: stop every helper, then the process."""
    from p2ptrain.proc import descendants, signal_all

    helpers = descendants()
    logger.warning("leaving the swarm took over %.0fs: stopping %d helper processes and exiting",
                   SHUTDOWN_DEADLINE, len(helpers))
    signal_all(helpers, signal.SIGTERM)
    time.sleep(1.0)
    signal_all(descendants(), signal.SIGKILL)
    logging.shutdown()
    os._exit(code)


# ---------------------------------------------------------------------- the command


def fetch_command(args: argparse.Namespace) -> int:
    """``p2ptrain fetch``: bad input is one line and its exit code before anything starts."""
    for addr in args.join:
        try:
            parse_multiaddr(addr, need_peer_id=True)
        except ValueError as exc:
            raise ConfigError(f"--join: {exc}") from None
    config = apply_run_flags(load_config(args.config), args.run_ref, args.manifest)
    if not args.join and not config.swarm.initial_peers:
        raise ConfigError("--join: give the address of a node in the swarm (MADDR ending in /p2p/<peer id>), "
                          "or swarm.initial_peers in the config")
    try:
        check_target(args.out_dir, args.force)
    except ExportError as error:
        return _fail(str(error), 1)

    from p2ptrain.daemon.children import tie_children_to_this_process
    from p2ptrain.daemon.logsetup import configure_logging

    configure_logging(config.node.log_level, config.node.log_format)
    tie_children_to_this_process()
    state_dir, temporary = client_state_dir(config)
    fetcher = Fetcher(fetch_config(config, args.join, state_dir, args.timeout), timeout=args.timeout)
    fetcher.stopper.handle_stop_signals()  # a second SIGINT/SIGTERM exits at once
    try:
        code = fetcher.run(args.out_dir, force=args.force, torch_copy=args.torch)
    finally:
        if temporary:
            shutil.rmtree(state_dir, ignore_errors=True)
    _end_process(code)


def client_state_dir(config: NodeConfig) -> tuple[Path, bool]:
    """Where the fetcher keeps its identity, and whether that directory is its own to delete afterwards.

    An invite names one peer ID: an invite run is fetched with the identity of the node whose config
    is given (its state directory, locked while that node runs); any other run with a throwaway one.
    """
    if config.swarm.invite is not None:
        return config.state_dir(), False
    return Path(tempfile.mkdtemp(prefix="p2ptrain-fetch-")), True


def _end_process(code: int) -> NoReturn:
    """End here, as ``p2ptrain run`` does: interpreter shutdown would run finalizers of hivemind's
    objects at a point where they can wait for good (see ``daemon.main``)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
