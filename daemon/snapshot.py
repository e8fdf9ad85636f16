"""From the node's live figures to the status snapshot: a pure ``make_snapshot`` and the board
that gathers its inputs on the training thread.

The snapshot is the one contract between the node and everything that watches it (API, metrics,
peer records, TUI).  :func:`make_snapshot` is a pure function of plain values, so what a user
sees can be tested without a node; :class:`StatusBoard` is the node's bookkeeping (state, rates,
the collaborators it reads figures from) and publishes the result to :class:`LatestSnapshot`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from p2ptrain import __version__
from p2ptrain.daemon.cpushare import CpuShareFigures
from p2ptrain.daemon.history import LossCurve
from p2ptrain.daemon.smoothing import Ema, WindowRate
from p2ptrain.optim.protocol import GlobalProgress
from p2ptrain.optim.round_stats import RoundFigures
from p2ptrain.optim.swarm_stats import SwarmStatsView
from p2ptrain.status import LatestSnapshot, NodeState, PauseReason, Reachability, StatusSnapshot, SwarmView
from p2ptrain.swarm.reach import Reach, decide
from p2ptrain.swarm.relay_meter import UNREAD, RelayFigures
from p2ptrain.trust.credit import CreditFigures
from p2ptrain.trust.peergate import OffenceFigures, no_offences
from p2ptrain.trust.swarm_credit import credited_view
from p2ptrain.trust.vouching import Vouchers

#: State changes are the node's story: their log lines carry the node's name, wherever they are made.
state_logger = logging.getLogger("p2ptrain.daemon.node")


@dataclass(frozen=True)
class NodeIdentity:
    """Who the node is in the swarm (empty until it has joined)."""

    run_id: str = ""
    peer_id: str = ""
    maddrs: tuple[str, ...] = ()
    fingerprint: str = ""
    client_mode: bool = False
    announce: tuple[str, ...] = ()
    dialable: bool | None = None
    """What a peer asked to dial this node back found (None: none asked, or none answered)."""
    dialed: str = ""
    """Where that peer connected (``ip:port``), or the IP it could not connect to."""

    def reach(self) -> Reach:
        return decide(self.maddrs, client_mode=self.client_mode, announce=self.announce, dialable=self.dialable,
                      dialed=self.dialed)

    def reachability(self) -> Reachability:
        return self.reach().state


@dataclass(frozen=True)
class DeviceFigures:
    """Where the node trains (empty until its model is built) and the device memory torch holds (None: a CPU)."""

    device: str = ""
    precision: str = ""
    memory_bytes: int | None = None


@dataclass(frozen=True)
class CheckpointFigures:
    ok: int = 0
    failed: int = 0
    last_time: float | None = None
    last_error: str = ""
    #: The newest checkpoint file written by this process, and the epoch it holds (``p2ptrain checkpoint``).
    last_path: str = ""
    last_epoch: int | None = None


@dataclass(frozen=True)
class TrainingFigures:
    """What the trainer and the rollback guard have counted."""

    epoch: int = 0
    samples_processed: int = 0
    nonfinite_skips: int = 0
    rollbacks: int = 0


@dataclass(frozen=True)
class RunFigures:
    """An owned run as this node follows it (all empty in a plain run); see ``RunKeeper.status``."""

    run_ref: str = ""
    manifest_version: int = 0
    admission_policy: str = ""
    manifest_fingerprint: str = ""
    manifests_ignored_total: int = 0
    invalid_members_total: int = 0
    run_entries_refused_total: int = 0
    fingerprint_entries_refused_total: int = 0
    dht_requests_refused_total: int = 0
    averaging_refused_total: int = 0
    records_not_admitted: int = 0
    invite_expires_at: float = 0.0


@dataclass(frozen=True)
class DataFigures:
    """Where the node is in its sharded training data (all zero for a stream without coverage)."""

    data_pass: int = 0
    shards_consumed: int = 0
    #: Shards read in the passes before the current one, newest first.
    past_passes: tuple[int, ...] = ()
    shards_total: int = 0
    source: str = ""
    #: Records skipped (did not decode, too large; without text) and shard reads skipped, since start.
    records_failed: int = 0
    records_without_text: int = 0
    shards_skipped: int = 0


def data_figures(stream: object) -> DataFigures:
    """What a stream that reports coverage (``p2ptrain.tasks.CoverageSource``, e.g. ``ShardStream``)
    says; a stream that does not, or says something odd, gives zeros."""
    try:
        coverage = stream.coverage()  # type: ignore[attr-defined]
        past = getattr(stream, "past_pass_shards", lambda: ())()
        figures = DataFigures(
            data_pass=_count(coverage.pass_number), shards_consumed=_count(len(coverage.consumed)),
            past_passes=tuple(_count(c) for c in past),
            shards_total=_count(coverage.shards_total), source=str(getattr(stream, "source", ""))[:32],
            records_failed=_count(getattr(coverage, "failed_records_total", 0)),
            records_without_text=_count(getattr(coverage, "bad_records_total", 0)),
            shards_skipped=sum(_count(getattr(coverage, name, 0)) for name in ("skipped_total", "malformed_total")))
    except Exception:  # a user stream's coverage is optional; its errors must not cost the snapshot
        return DataFigures()
    return figures if figures.shards_total else DataFigures()


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class LossFigures:
    """The loss curve so far (see ``daemon.history``)."""

    epochs: tuple[int, ...] = ()
    losses: tuple[float, ...] = ()
    val_epochs: tuple[int, ...] = ()
    val_losses: tuple[float, ...] = ()


@dataclass(frozen=True)
class LiveFigures:
    """What the loop measures as it goes."""

    samples_per_second: float = 0.0
    loss: float | None = None
    val_loss: float | None = None
    seconds_since_progress: float | None = None
    uptime_seconds: float = 0.0
    started_at: float = 0.0


def make_snapshot(*, state: NodeState, pause_reason: PauseReason, identity: NodeIdentity,
                  training: TrainingFigures, live: LiveFigures, progress: GlobalProgress, rounds: RoundFigures,
                  stats: SwarmStatsView, cpu: CpuShareFigures, checkpoints: CheckpointFigures, view: SwarmView,
                  target_batch_size: int, taken_at: float, run: RunFigures = RunFigures(),
                  offences: OffenceFigures | None = None, credit: CreditFigures | None = None,
                  data: DataFigures = DataFigures(), history: LossFigures = LossFigures(),
                  vouched: dict[str, int] | None = None, device: DeviceFigures = DeviceFigures(),
                  relay: RelayFigures = UNREAD) -> StatusSnapshot:
    """The node's status from plain figures; no I/O, no clock.

    The swarm's epoch is the optimizer's (robust against peers that agree on a far-off epoch among
    themselves: :mod:`p2ptrain.averaging.robust_progress`), never below our own; the records' epochs
    are claims and raise it not at all."""
    offences = offences if offences is not None else no_offences()
    credit = credit if credit is not None else CreditFigures()
    return StatusSnapshot(
        samples_contributed_total=credit.contributed, samples_not_averaged_total=credit.not_averaged,
        vouched_samples=dict(vouched or {}),
        device=device.device, precision=device.precision, device_memory_bytes=device.memory_bytes,
        relay_active=relay.active, relay_bytes_total=relay.bytes_total, relay_reservations=relay.reservations,
        relay_circuits=relay.circuits, relay_refused_total=relay.refused_total,
        data_pass=data.data_pass, data_shards_consumed=data.shards_consumed,
        data_past_pass_shards=data.past_passes, data_shards_total=data.shards_total, data_source=data.source,
        data_records_failed_total=data.records_failed, data_records_without_text_total=data.records_without_text,
        data_shards_skipped_total=data.shards_skipped,
        loss_history_epochs=history.epochs, loss_history=history.losses, val_loss_history_epochs=history.val_epochs,
        val_loss_history=history.val_losses,
        **dataclasses.asdict(run),
        version=__version__, state=state.value, pause_reason=pause_reason.value,
        peer_id=identity.peer_id, visible_maddrs=identity.maddrs, reachability=identity.reachability().value,
        run_id=identity.run_id, model_fingerprint=identity.fingerprint,
        local_epoch=training.epoch, global_epoch=max(progress.epoch, training.epoch),
        samples_accumulated=progress.samples_accumulated, target_batch_size=target_batch_size,
        round_in_flight=progress.round_in_flight,
        samples_processed_total=training.samples_processed,
        local_samples_per_second=live.samples_per_second,
        swarm_samples_per_second=view.swarm_samples_per_second,
        # Signed records are the swarm view; hivemind's progress entries outlive departed peers.
        peers_online=view.peers_online or progress.num_peers,
        loss=live.loss, val_loss=live.val_loss,
        **rounds.snapshot_fields(),
        cpu_limit_percent=cpu.limit_percent, cpu_used_percent=cpu.used_percent,
        cpu_idle_seconds_total=cpu.idle_seconds_total,
        bytes_sent_total=stats.bytes_sent, bytes_received_total=stats.bytes_received,
        state_downloads_total=stats.state_downloads, state_downloads_failed_total=stats.state_downloads_failed,
        state_download_seconds_total=stats.state_download_seconds,
        state_download_progress=stats.state_download_progress,
        checkpoint_writes_ok_total=checkpoints.ok, checkpoint_writes_failed_total=checkpoints.failed,
        last_checkpoint_time=checkpoints.last_time, last_checkpoint_error=checkpoints.last_error,
        last_checkpoint_path=checkpoints.last_path, last_checkpoint_epoch=checkpoints.last_epoch,
        nonfinite_skips_total=training.nonfinite_skips, rollbacks_total=training.rollbacks,
        rejected_records_total=view.rejected_records_total,
        peer_checks=offences.checks_on, peer_offenses_by_kind=dict(offences.by_kind),
        peer_offenses_total=offences.total, peers_excluded=offences.excluded,
        seconds_since_progress=live.seconds_since_progress,
        uptime_seconds=live.uptime_seconds, started_at=live.started_at, taken_at=taken_at,
    )


class StatusBoard:
    """The node's live figures (written on the training thread only) and their publication.

    Sources are callables, set by the node as its parts come to life, so the board never holds
    the trainer or the optimizer themselves.
    """

    def __init__(self, latest: LatestSnapshot, target_batch_size: int, *, clock: Callable[[], float],
                 wall_clock: Callable[[], float]) -> None:
        self.latest = latest
        self.target_batch_size = target_batch_size
        self.clock, self.wall_clock = clock, wall_clock
        self.state = NodeState.STARTING
        self.pause_reason = PauseReason.NONE
        self.identity = NodeIdentity()
        self.val_loss: float | None = None
        self.training: Callable[[], TrainingFigures] = TrainingFigures
        self.progress: Callable[[], GlobalProgress] = GlobalProgress
        self.stats: Callable[[], SwarmStatsView] = SwarmStatsView
        self.rounds: Callable[[], RoundFigures] = RoundFigures
        self.cpu: Callable[[], CpuShareFigures] = lambda: CpuShareFigures(0.0, None, 0.0)
        self.checkpoints: Callable[[], CheckpointFigures] = CheckpointFigures
        self.view: Callable[[], SwarmView | None] = lambda: None
        self.run: Callable[[], RunFigures] = RunFigures
        self.offences: Callable[[], OffenceFigures] = no_offences
        self._last_view = SwarmView()
        self._rate = WindowRate()
        self._loss = Ema(0.05)
        self._last_progress: float | None = None
        self._started_mono = clock()
        self._started_wall = wall_clock()
        #: Credit (the swarm stats' ledger), where the node is in its data, and the most samples one
        #: peer may put into an epoch (0: records' credit taken as claimed); set by the node.
        self.credit: Callable[[], CreditFigures] = CreditFigures
        self.data: Callable[[], DataFigures] = DataFigures
        self.credit_bound: Callable[[], int] = lambda: 0
        #: Called with the peers a swarm view credits with samples (the ledger remembers them).
        self.note_contributors: Callable[[list[str]], None] = lambda peers: None
        #: What this node can vouch for of other peers' samples (None: peer checks off, claims credited as
        #: they are, bounded), and the few figures its record carries; set by the node.
        self.vouchers: Callable[[], Vouchers | None] = lambda: None
        self.vouched: Callable[[], dict[str, int]] = dict
        self._losses, self._val_losses = LossCurve(), LossCurve()
        #: Where the node trains and the device memory it holds; set by the node once its model is built.
        self.device: Callable[[], DeviceFigures] = DeviceFigures
        #: What the node's p2p daemon relays for peers behind NAT; set by the node once it has joined.
        self.relay: Callable[[], RelayFigures] = RelayFigures

    def set_state(self, state: NodeState) -> None:
        if state is not self.state:
            state_logger.info("state %s -> %s", self.state.value.upper(), state.value.upper())
            self.state = state
            self.publish()

    def step_done(self, samples: int, loss: float, counted: bool) -> None:
        """A local step finished; ``counted`` is False for a skipped (non-finite) contribution."""
        now = self.clock()
        self._last_progress = now
        if counted:
            self._rate.add(now, samples)
            self._loss.add(loss)

    def validated(self, epoch: int, loss: float) -> None:
        """A validation finished: the loss the node shows, and a point of its loss curve."""
        self.val_loss = loss
        self._val_losses.add(epoch, loss)

    def snapshot(self) -> StatusSnapshot:
        now = self.clock()
        view = self.view()
        training, progress = self.training(), self.progress()
        if view is not None:
            self._last_view = credited_view(view, self.credit_bound(), self.identity.peer_id,
                                            vouchers=self.vouchers(), swarm_epoch=max(progress.epoch, training.epoch))
            self.note_contributors([p.peer_id for p in self._last_view.peers if p.samples_contributed > 0])
        self._losses.add(training.epoch, self._loss.value)
        history = LossFigures(self._losses.epochs, self._losses.values, self._val_losses.epochs,
                              self._val_losses.values)
        live = LiveFigures(
            samples_per_second=self._rate.rate(now), loss=self._loss.value, val_loss=self.val_loss,
            seconds_since_progress=None if self._last_progress is None else now - self._last_progress,
            uptime_seconds=now - self._started_mono, started_at=self._started_wall)
        return make_snapshot(state=self.state, pause_reason=self.pause_reason, identity=self.identity,
                             training=training, live=live, progress=progress, rounds=self.rounds(),
                             stats=self.stats(), cpu=self.cpu(), checkpoints=self.checkpoints(), view=self._last_view,
                             target_batch_size=self.target_batch_size, taken_at=self.wall_clock(), run=self.run(),
                             offences=self.offences(), credit=self.credit(), data=self.data(), history=history,
                             vouched=self.vouched(), device=self.device(), relay=self.relay())

    def publish(self) -> None:
        self.latest.publish(self.snapshot(), self._last_view)
