"""``p2ptrain fetch``: the swarm's current model, written as an export, without running a node.

The fetcher joins the run as a client-mode peer (it dials out only: nobody can ask it for
anything) through the life cycle a node goes through too (:class:`p2ptrain.daemon.session.SwarmSession`:
plan, lock, join, the owned run's manifest, records, build, leave), builds the run's model and
optimizer through the node's own builder, and downloads
the state through the optimizer's validated path, in gradient and DiLoCo mode alike: the donor's
tensors are checked for count, shape, size and finite values, its epoch against what the run's
peers report in their signed records, and its model's validation loss here.  It publishes
nothing (no peer record, no progress entry, no fingerprint), trains on nothing and serves no
state, so the swarm never counts it or waits for it.  Only a state that was adopted is written,
with :func:`p2ptrain.model.export.write_export`; the model card names the donor and the epoch, and gives the
samples and contributors the run's peer records claim (bounded, and said to be their claims).

Exit codes: 0 written; 1 OUT_DIR cannot be used (it exists: ``--force``) or cannot be written;
69 (EX_UNAVAILABLE) no peer answered, or none served a state that passed the checks, within
``--timeout``; 65 (EX_DATAERR) the run's model names task code the user did not trust (a run's manifest
is someone else's: its ``task.entrypoint`` runs only with ``--trust-task-code`` or when the node's own
config names it) or more parameters than ``--max-params`` (:mod:`p2ptrain.model.limits`), refused
before anything is imported or built; 75 another node holds the state directory (invite runs, which
fetch with the node's own identity); 78 bad input (an address, a run reference, a manifest, a config,
a model that is not the run's); 130 stopped by a signal.  Whatever the reason, nothing is written
unless it is 0.
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from p2ptrain.config.schema import DAY, ConfigError, NodeConfig, load_config, parse_multiaddr
from p2ptrain.daemon.builder import ClientParts, JoinedSwarm, NodeBuilder
from p2ptrain.daemon.hooks import NodeHooks, SwarmPresence
from p2ptrain.daemon.session import SwarmSession
from p2ptrain.daemon.shutdown import end_process
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.errors import EX_CONFIG, EX_DATAERR, EX_FAILURE, EX_INTERRUPTED, EX_OK, EX_TEMPFAIL, EX_UNAVAILABLE
from p2ptrain.model.export import VAL_OF_EXPORT, CardInfo, ExportError, check_target, write_export
from p2ptrain.model.limits import DEFAULT_MAX_PARAMS, ModelRefused, check_model_config
from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.swarm.dht import FingerprintMismatch, IdentityInUse, PeersRefused, SwarmError
from p2ptrain.swarm.manifest_source import SourceUnavailable
from p2ptrain.swarm.ownedrun import apply_run_flags
from p2ptrain.trust.swarm_credit import credited_view, epoch_samples_bound
from p2ptrain.trust.vouching import Vouchers

logger = logging.getLogger(__name__)

#: The fetcher listens on loopback only: in client mode nobody dials it, and a node's port stays free.
CLIENT_LISTEN = "/ip4/127.0.0.1/tcp/0"
#: Longest wait for the run's progress and first peer records before the first download (a node waits
#: as long): the state is judged against what they report.
SETTLE_WAIT = 10.0
#: Seconds between the progress lines shown while no state has been adopted.
PROGRESS_EVERY = 10.0
#: Records are read this often (a node reads them every 5 s; a fetcher has nothing else to do).
RECORDS_PERIOD = 1.0


class Unavailable(Exception):
    """No state could be had from the swarm; the message is the one line to show."""


class RecordReader(NodeHooks):
    """The fetcher's hooks: the run's signed peer records read into its evidence, none of its own published."""

    def __init__(self) -> None:
        self._validators: list[Any] = []
        self._publisher: Any = None

    def record_validators(self, run_id: str) -> list[Any]:
        from p2ptrain.swarm.records import record_validators

        self._validators = record_validators(run_id)
        return self._validators

    def joined(self, presence: SwarmPresence) -> bool:
        from p2ptrain.daemon.record_publisher import RecordPublisher
        from p2ptrain.status import LatestSnapshot

        # A snapshot without a peer ID: the publisher then only polls (it publishes a record only for
        # a node that has one), so the fetcher never shows up in anyone's swarm view.
        self._publisher = RecordPublisher.for_run(presence.dht, presence.run_id, self._validators, LatestSnapshot(),
                                                  presence.evidence, period=RECORDS_PERIOD)
        self._publisher.start()
        return True

    def peers(self) -> int:
        """Peers in the run's records now."""
        return len(self.view().peers)

    def view(self) -> Any:
        """The run's validated peer records now (a ``SwarmView``; empty before the first read)."""
        from p2ptrain.status import SwarmView

        return self._publisher.view if self._publisher is not None else SwarmView()

    def stopping(self) -> None:
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


class ModelFetcher:
    """Join, download, write, leave.  Build it, call :meth:`run` from the main thread, get an exit code."""

    def __init__(self, config: NodeConfig, *, timeout: float, builder: Any = None, records: Any = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 trust_task_code: bool = False, max_params: int = DEFAULT_MAX_PARAMS) -> None:
        self.config, self.timeout = config, timeout
        #: What the run's model may make us do: ``config`` is the user's own, so its task code is trusted;
        #: a manifest's other task code only with ``trust_task_code``.
        self.trust_task_code, self.max_params = trust_task_code, max_params
        self._own_entrypoint = config.task.entrypoint
        self.builder = builder or NodeBuilder()
        self.records = records or RecordReader()
        self.clock, self.wall_clock = clock, wall_clock
        self.stopper = Stopper()
        #: Plan, swarm, parts and leaving: the life cycle a fetch shares with a node.
        self.session = SwarmSession(config, builder=self.builder, hooks=self.records, stopper=self.stopper,
                                    initial_peers=lambda: list(self.session.config.swarm.initial_peers),
                                    wall_clock=wall_clock)
        self._deadline = 0.0

    def remaining(self) -> float:
        return max(0.0, self._deadline - self.clock())

    def run(self, out_dir: Path, *, force: bool = False, torch_copy: bool = False) -> int:
        """Fetch into ``out_dir``; the exit code says how it went (one line on stderr if badly)."""
        self._deadline = self.clock() + self.timeout
        code = EX_FAILURE
        try:
            try:
                # Joined, the keeper fetches a manifest the plan lacks: nothing is written but the export.
                self.session.prepare(fetch_manifest=False)  # a bad manifest or run reference: 78 here
                self.session.open()
                code = self._fetch(out_dir, force, torch_copy)
            except Exception as error:  # each failure is one line; a bug still shows its traceback
                code = self._report(error)
            return code
        finally:
            self._leave(code)

    def _report(self, error: Exception) -> int:
        """The one line and the exit code for how the fetch failed (re-raises what is a bug)."""
        stopped = f"stopped ({self.stopper.reason}) before a state was adopted; nothing written"
        if isinstance(error, ConfigError):
            return _fail(f"config error: {error}", EX_CONFIG, prefix="p2ptrain")
        if isinstance(error, FingerprintMismatch):
            return _fail(str(error), EX_CONFIG)
        if isinstance(error, IdentityInUse):
            return _fail(str(error), EX_TEMPFAIL)
        if isinstance(error, ModelRefused):
            return _fail(f"{error}; nothing written", EX_DATAERR)
        if isinstance(error, SwarmError | SourceUnavailable | Unavailable) and self.stopper.is_set():
            return _fail(stopped, EX_INTERRUPTED)
        if isinstance(error, PeersRefused | SourceUnavailable | Unavailable):
            return _fail(f"{error}; nothing written", EX_UNAVAILABLE)
        if isinstance(error, SwarmError):
            peers = ", ".join(self.config.swarm.initial_peers)
            return _fail(f"no peer answered within {self.timeout:.0f}s (--timeout); tried {peers}; nothing written",
                         EX_UNAVAILABLE)
        if isinstance(error, ExportError | OSError):  # OSError: e.g. the state directory cannot be made
            return _fail(str(error), EX_FAILURE)
        raise error

    def _fetch(self, out_dir: Path, force: bool, torch_copy: bool) -> int:
        from p2ptrain.optim.swarm_stats import SwarmStats

        session = self.session
        self._admit(session.config, session.plan)  # before anything is joined, imported or built
        swarm = session.join()
        run_id = session.config.swarm.run_id
        logger.info("joined run %r as client-mode peer %s (it trains nothing and serves nothing)", run_id,
                    swarm.peer_id)
        config = session.follow_run(max(1.0, self.remaining()))
        self._admit(config, session.plan)  # the manifest in force may be newer than the one read before joining
        session.read_records()
        assert session.presence is not None and session.presence.evidence is not None  # fetch_config: checks on
        evidence = session.presence.evidence
        parts = session.build(lambda cfg, joined, **run: self.builder.build_client(cfg, joined, SwarmStats(), **run))
        self._settle(parts.optimizer, evidence.records_seen)
        donor, epoch = self._download(parts)

        from p2ptrain.optim.defences import evaluate_fn

        val_loss = evaluate_fn(parts.task)()
        run_ref = str(session.plan.ref) if session.plan is not None else run_id
        finite = math.isfinite(val_loss)
        card = CardInfo(run_ref=run_ref, epoch=epoch, val_loss=val_loss if finite else None,
                        val_epoch=epoch if finite else None, val_of=VAL_OF_EXPORT if finite else "",
                        saved_at=self.wall_clock(), fetched_from=donor,
                        **swarm_credit(self.records.view(), epoch_samples_bound(config.training),
                                       session.defences.vouchers() if session.defences is not None else None,
                                       max(parts.optimizer.global_progress().epoch, epoch)))
        out = write_export(parts.task.model, config.task, parts.fingerprint, card, out_dir, force=force,
                           shape_config=parts.task.shape_config, torch_copy=torch_copy,
                           training={"batch_size": config.training.batch_size, "seed": config.training.seed})
        print(f"fetched epoch {epoch} of run {run_ref} from peer {donor} (model {parts.fingerprint}) to {out}")
        if config.task.entrypoint is None:
            print(f"try it: p2ptrain sample {out} --prompt 'def '")
        return EX_OK

    def _admit(self, config: NodeConfig, plan: Any) -> None:
        """Refuse (:class:`ModelRefused`) a model the user did not allow, before anything is imported or built."""
        where = "the run's manifest" if plan is not None else "the config's [task]"
        check_model_config(config.task, where, trust_task_code=self.trust_task_code,
                           own_entrypoint=self._own_entrypoint, max_params=self.max_params)

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
                    hint = (f" (nobody reports under run {self.session.config.swarm.run_id!r}: a plain run is "
                            "named by its node "
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
        try:
            self.session.leave(lambda: code)
        finally:
            self.stopper.close()

    @property
    def swarm(self) -> JoinedSwarm | None:
        return self.session.swarm

    @property
    def parts(self) -> ClientParts | None:
        return self.session.parts  # type: ignore[return-value]


class SwarmCredit(TypedDict):
    """``CardInfo``'s keywords for what the run's peer records say."""

    samples: int | None
    contributors: int | None
    reported_by: int
    samples_claimed: NotRequired[int]
    vouched_by: NotRequired[int]


def swarm_credit(view: Any, samples_per_epoch: int, vouchers: Vouchers | None, swarm_epoch: int) -> SwarmCredit:
    """The card's samples and contributors from the run's peer records (``CardInfo`` keywords).

    A record's ``samples_contributed`` is its peer's claim about itself, and identities are free: the
    card's samples are only what the peers the fetcher joined through vouch for from their averaging
    rounds (:mod:`p2ptrain.trust.vouching`), and the claims are given apart, labelled as such; both
    clipped at the run's pace by the swarm's epoch as the optimizer believes it
    (:func:`p2ptrain.trust.swarm_credit.credited_view`).  No record read: nothing recorded (the card says so).
    """
    if not view.peers:
        return {"samples": None, "contributors": None, "reported_by": 0}
    credited = credited_view(view, samples_per_epoch, vouchers=vouchers or Vouchers(), swarm_epoch=swarm_epoch)
    anchors = (vouchers or Vouchers()).anchors
    return {"samples": credited.samples_contributed,
            "contributors": sum(1 for peer in credited.peers if peer.samples_contributed > 0),
            "reported_by": len(credited.peers), "samples_claimed": credited.samples_claimed,
            "vouched_by": sum(1 for peer in credited.peers if peer.peer_id in anchors)}


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
        return _fail(str(error), EX_FAILURE)

    from p2ptrain.daemon.children import share_tensors_by_descriptor, tie_children_to_this_process
    from p2ptrain.daemon.logsetup import configure_logging

    configure_logging(config.node.log_level, config.node.log_format)
    share_tensors_by_descriptor()
    tie_children_to_this_process()
    from p2ptrain.averaging.lifecycle import report_stacks_on_timeout

    report_stacks_on_timeout()
    state_dir, temporary = client_state_dir(config)
    fetcher = ModelFetcher(fetch_config(config, args.join, state_dir, args.timeout), timeout=args.timeout,
                           trust_task_code=args.trust_task_code, max_params=args.max_params)
    fetcher.stopper.handle_stop_signals()  # a second SIGINT/SIGTERM exits at once
    try:
        code = fetcher.run(args.out_dir, force=args.force, torch_copy=args.torch)
    finally:
        if temporary:
            shutil.rmtree(state_dir, ignore_errors=True)
    end_process(code)


def client_state_dir(config: NodeConfig) -> tuple[Path, bool]:
    """Where the fetcher keeps its identity, and whether that directory is its own to delete afterwards.

    An invite names one peer ID: an invite run is fetched with the identity of the node whose config
    is given (its state directory, locked while that node runs); any other run with a throwaway one.
    """
    if config.swarm.invite is not None:
        return config.state_dir(), False
    return Path(tempfile.mkdtemp(prefix="p2ptrain-fetch-")), True
