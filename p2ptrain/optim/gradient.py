"""Gradient mode: hivemind's collaborative optimizer behind the node's optimizer protocol.

hivemind's ``Optimizer`` swallows swarm failures (that is what keeps a swarm elastic) but tells
nobody about them except its log, and its ``load_state_from_peers`` retries forever when no
donor answers (hivemind #653).  :class:`GradientOptimizer` keeps that behaviour, bounds the state
download, records every averaging round and download into :class:`SwarmStats`, and implements
:class:`~p2ptrain.optim.protocol.SwarmOptimizer` so the node never reads hivemind's attributes.

With :class:`~p2ptrain.optim.defences.Defences` (the peer checks, on by default) it builds hardened
averagers in place of hivemind's, under hivemind's wire names: a validated, donor-aware state
download with an O(1) schedule catch-up (:class:`~p2ptrain.averaging.state_download.SafeTrainingStateAverager`),
a robust gradient all-reduce (:class:`~p2ptrain.averaging.hardened.HardenedGradientAverager`) and a
progress tracker that believes only identity-bound peers and an epoch several of them agree on
(:class:`~p2ptrain.averaging.robust_progress.RobustProgressTracker`).  An owned run's admission gate wraps
whichever class is used (:func:`~p2ptrain.averaging.admitting.admitting`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

import hivemind
import torch
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.optim.state_averager import TrainingStateAverager

from p2ptrain.averaging.admitting import Admission, AdmittingOptimizerMixin, admitting
from p2ptrain.averaging.compression import CompressionChoice, wire_bytes
from p2ptrain.averaging.matchmaking import looking_for_group
from p2ptrain.averaging.model_check import make_loss_check
from p2ptrain.averaging.paced_progress import PacedProgressTracker, withdraw_progress
from p2ptrain.averaging.robust_progress import RobustProgressTracker
from p2ptrain.averaging.robust_reduce import ReduceRule, RoundReports
from p2ptrain.config.schema import TrainingSection
from p2ptrain.dhtkeys import state_averager_prefix
from p2ptrain.optim.defences import Defences
from p2ptrain.optim.inner import warmup_cosine
from p2ptrain.optim.protocol import GlobalProgress, GuardTargets
from p2ptrain.optim.retune import retune
from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.trust.verdicts import Verdict

logger = logging.getLogger(__name__)


class GradientOptimizer(AdmittingOptimizerMixin, hivemind.Optimizer):
    """hivemind.Optimizer with bounded state downloads, per-round accounting and the node's protocol.

    With ``admission`` (an owned run's gate) its averagers take part only with admitted peers.
    """

    # hivemind.Optimizer's own, written here too: declared so that their types are known.
    scheduled_grads: StepControl | None
    _should_check_synchronization_on_update: bool

    def __init__(self, *args: Any, stats: SwarmStats, load_state_attempts: int, retry_sync_after: float,
                 wire_format: CompressionChoice = "none", admission: Admission | None = None,
                 defences: Defences | None = None,
                 evaluate: Callable[[], float] | None = None, wait: Callable[[float], object] = time.sleep,
                 round_reports: RoundReports | None = None, **kwargs: Any) -> None:
        self._admission = admission
        self._defences, self._evaluate = defences, evaluate
        #: Where the gradient averager reports each round without the peer checks (with them: the defences').
        self._rounds = round_reports
        #: Sleeps between download attempts; the node's stop event (True: stop asked, try no more).
        self._wait = wait
        self.stats = stats
        self._load_state_attempts = load_state_attempts
        self._retry_sync_after = retry_sync_after
        self._last_failed_sync = -math.inf
        self._adopted = False
        self._left_mid_round = False
        #: Rounds begun (written by the training thread) and ended (by hivemind's background step):
        #: one counter per writer, so reading both needs no lock.
        self._rounds_begun = self._rounds_ended = 0
        #: The epoch of the round begun last, and the last epoch whose round averaged with another peer
        #: (written by hivemind's background step): a peer whose previous epoch averaged holds the
        #: swarm's parameters, and one epoch behind it joins the swarm's round instead of downloading.
        self._round_epoch, self._averaged_epoch = -1, -1
        super().__init__(*args, **kwargs)
        self._payload_bytes = wire_bytes(sum(p.numel() for p in self._parameters()), wire_format)
        self._bound_state_download()

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    # ------------------------------------------------------------------ the node's protocol

    def global_progress(self) -> GlobalProgress:
        tracker = self.tracker
        progress = tracker.global_progress
        return GlobalProgress(epoch=int(tracker.global_epoch), samples_accumulated=int(progress.samples_accumulated),
                              num_peers=int(progress.num_peers),
                              known=tracker.fetched_global_progress_this_epoch.is_set(),
                              round_in_flight=self._rounds_begun > self._rounds_ended)

    def load_state_from_peers(self, **kwargs: Any) -> bool:
        """hivemind's download, bounded by ``load_state_attempts``; True when a state was adopted."""
        self._adopted = False
        super().load_state_from_peers(**kwargs)
        return self._adopted

    def join_next_round(self, swarm_epoch: int) -> bool:
        """Never: an epoch's gradients are averaged only among peers at that epoch, so a node behind
        the swarm downloads its state."""
        return False

    def checkpoint_state(self) -> dict[str, Any]:
        scheduler = self.state_averager.scheduler
        return {"optimizer": self.state_dict(), "epoch": self.local_epoch,
                "scheduler": scheduler.state_dict() if scheduler is not None else None}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("optimizer") is not None:
            self.load_state_dict(state["optimizer"])
        self.state_averager.local_epoch = int(state.get("epoch", 0))
        scheduler = self.state_averager.scheduler
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])

    def step_aside(self) -> None:
        """Finish any round already scheduled with zero weight (so its partners are not left
        waiting) and withdraw this peer's progress record."""
        for name in ("scheduled_grads", "scheduled_state"):
            control = getattr(self, name, None)
            if control is not None and not control.done():
                self._tag_along_with_zero_weight(control)
            setattr(self, name, None)
        withdraw_progress(self.tracker)

    def rejoin(self) -> None:
        local = self.tracker.local_progress
        self.tracker.report_local_progress(local.epoch, local.samples_accumulated)

    def guard_targets(self) -> GuardTargets:
        return GuardTargets(tensors=self._parameters(), optimizers=[self.state_averager.optimizer])

    def flush(self) -> None:
        """Nothing to land: a delayed optimizer step is applied by hivemind at the next step."""

    def shutdown(self) -> None:
        """Leave without waiting out a round nobody will join.

        hivemind's shutdown first waits for the delayed optimizer step, which waits for this
        epoch's gradient round; when the partners are leaving too, that round looks for a group
        until its averaging timeout.  Cancelling it is safe here (the process never matches again,
        see the note on cancelled rounds below) and the local gradients are applied instead.
        """
        control = self.scheduled_grads
        if control is not None and not control.done() and control.stage == AveragingStage.LOOKING_FOR_GROUP:
            self._left_mid_round = True
            control.cancel()
            self.scheduled_grads = None  # hivemind's shutdown would cancel it a second time, which raises
        super().shutdown()

    def apply_training(self, cfg: TrainingSection) -> None:
        retune(self.state_averager.optimizer, self.state_averager.scheduler, cfg,
               warmup_cosine(cfg.warmup_epochs, cfg.total_epochs))
        self.target_batch_size = self.tracker.target_batch_size = cfg.target_batch_size
        self.matchmaking_time, self.averaging_timeout = cfg.matchmaking_time, cfg.averaging_timeout
        self.average_state_every = cfg.average_state_every

    # ------------------------------------------------------------------ hivemind overrides

    def _make_progress_tracker(self, target_batch_size: int, **kwargs: Any) -> ProgressTracker:
        """hivemind's tracker reporting about once a second; with the peer checks, the robust one."""
        defences, opt = self._defences, cast(Any, self)
        kwargs.update(dht=opt.dht, prefix=opt.run_id, target_batch_size=target_batch_size, client_mode=opt.client_mode,
                      status_loglevel=opt.status_loglevel, start=True)
        if defences is None:
            return PacedProgressTracker(**kwargs)
        tracker = RobustProgressTracker(gate=defences.gate, bound=defences.evidence.bound_keys, **kwargs)
        defences.evidence.follow_progress(lambda: tracker.bound_peer_epochs)
        return tracker

    def _make_state_averager(self, **kwargs: Any) -> TrainingStateAverager:
        defences = self._defences
        if defences is None and self._admission is None:
            return super()._make_state_averager(**kwargs)
        cls: type[TrainingStateAverager] = TrainingStateAverager
        if defences is not None:
            from p2ptrain.averaging.state_download import SafeTrainingStateAverager

            cls = SafeTrainingStateAverager
            kwargs.update(defences.hardened_kwargs(), reduce_rule=ReduceRule.for_parameters(),
                          peer_epochs=defences.evidence.peer_epochs, model_check=self._check_model)
        if self._admission is not None:
            cls = admitting(cls, self._admission)
        # hivemind.Optimizer names its state averager's settings in its own _make_state_averager;
        # the same settings here, for our class.
        opt: Any = self
        return cls(dht=opt.dht, prefix=state_averager_prefix(opt.run_id), min_matchmaking_time=opt.matchmaking_time,
                   allreduce_timeout=opt.allreduce_timeout, shutdown_timeout=opt.shutdown_timeout,
                   offload_optimizer=opt.offload_optimizer, custom_gradients=opt.offload_optimizer,
                   status_loglevel=opt.status_loglevel, next_chunk_timeout=opt.next_chunk_timeout,
                   client_mode=opt.client_mode, auxiliary=opt.auxiliary, start=True, **kwargs)

    def _check_model(self, metadata: Any, tensors: Any, donor: str) -> Verdict:
        """The downloaded model's validation loss here, against ours and the run's reports."""
        if self._evaluate is None or self._defences is None:
            return Verdict.good()
        averager = self.state_averager
        check = make_loss_check(list(averager.main_parameters), self._evaluate, own_loss=lambda: None,
                                peer_losses=self._defences.evidence.peer_val_losses,
                                lock=lambda: averager.lock_averaged_tensors)
        return check(metadata, tensors, donor)

    def _should_load_state_from_peers(self) -> bool:
        # After a download that found no usable state, train on (local progress) instead of returning
        # from every step to a download that is not retried yet: that would stall the node.
        if time.monotonic() - self._last_failed_sync < self._retry_sync_after:
            return False
        if self._joins_the_swarm_s_round():
            return False
        return super()._should_load_state_from_peers()

    def _joins_the_swarm_s_round(self) -> bool:
        """One epoch behind at hivemind's once-an-epoch exact check, with the last epoch averaged: end
        this epoch now, in the swarm's round for it, instead of downloading the state.

        Peers read the swarm's progress from their own views, a second or so apart, so one ends an
        epoch before another; hivemind then has the other download the whole state, throwing away
        the gradients of the epoch it had nearly finished, while the first peer's round waits for a
        group that comes an epoch late (docs/reliability.md).  With its previous epoch averaged, this
        peer holds the parameters the swarm's round is for: hivemind's tracker already calls the epoch
        over (the swarm is past it), and its round joins the others'.  Further behind, or out of step,
        it downloads instead.
        """
        tracker = self.tracker
        if not (self._should_check_synchronization_on_update and tracker.fetched_global_progress_this_epoch.is_set()):
            return False
        epoch = self.local_epoch
        if tracker.global_epoch != epoch + 1 or self._averaged_epoch != epoch - 1:
            return False
        self._should_check_synchronization_on_update = False  # the check is spent for this epoch
        logger.debug("the swarm ended epoch %d first: ending ours with its round, no download", epoch)
        return True

    # Cancelling a round while it is still looking for a group can leave hivemind's matchmaking
    # broken for good ("aclose(): asynchronous generator is already running"; every later round
    # then fails with "could not find a group").  hivemind cancels a pre-scheduled round when, at
    # the epoch boundary, nobody else is there or the epoch does not average parameters after all.
    # So gradient rounds are only pre-scheduled with someone to average with, and parameter rounds
    # (every average_state_every epochs, only a drift repair) are not pre-scheduled at all.  Nor is
    # a round pre-scheduled while the last one still looks for its group (the averager would queue
    # it behind that one); an epoch that reaches its end without a round of its own then begins one
    # there (:meth:`_begin_averaging_gradients`).  docs/reliability.md has the measurements.

    def _maybe_schedule_gradient_averaging(self) -> None:
        if self.scheduled_grads is not None and looking_for_group(self.scheduled_grads):
            return  # hivemind would queue this round behind the one still looking for its group
        if self.tracker.global_progress.num_peers < 2:
            return
        super()._maybe_schedule_gradient_averaging()

    def _maybe_schedule_state_averaging(self) -> None:
        return

    def _begin_averaging_gradients(self, grad_scaler: Any) -> bool:
        last = self.scheduled_grads
        if last is not None and (last.triggered or last.done()):
            # The last epoch's round (still running in the background): hivemind would skip this
            # epoch's round altogether ("Not using pre-scheduled group") and apply local gradients.
            self.scheduled_grads = None
        # Credit (p2ptrain.trust.credit): the epoch's samples, as hivemind weighs them in the round, go to
        # the round begun here; with no round they are the swarm's update only if nobody else trains.
        samples = int(self.grad_averager.local_samples_accumulated)
        self._round_epoch = self.local_epoch
        began = bool(super()._begin_averaging_gradients(grad_scaler))
        self.stats.epoch_closed(samples, round_started=began, alone=self.tracker.global_progress.num_peers <= 1)
        self._rounds_begun += began
        return began

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control: Any) -> None:
        try:
            self._average_and_record(maybe_step_control)
        finally:
            self._rounds_ended = self._rounds_begun if maybe_step_control is None else self._rounds_ended + 1

    def _average_and_record(self, maybe_step_control: Any) -> None:
        started = time.perf_counter()
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        if maybe_step_control is None:
            return  # alone in the swarm: no round was attempted
        if self._left_mid_round and maybe_step_control.cancelled():
            logger.info("left before the last averaging round found a group; its gradients were applied locally")
            return
        ok = maybe_step_control.done() and not maybe_step_control.cancelled() \
            and maybe_step_control.exception() is None
        group_size, received = len(maybe_step_control.result()) if ok else 0, None
        if self._defences is not None:  # also feeds the evidence: the peers this node met
            measured = self._defences.take_round(str(self.dht.peer_id))
        else:
            measured = self._rounds.latest() if self._rounds is not None else None
        if ok and measured is not None:
            group_size, received = measured.group_size, measured.averaged_fraction
        if ok and group_size >= 2:
            self._averaged_epoch = self._round_epoch
        report = RoundSummary(ok=ok, duration=time.perf_counter() - started, group_size=group_size,
                             peers_online=self.tracker.global_progress.num_peers, received_fraction=received)
        self.stats.record_round(report, self._payload_bytes)
        if not ok:
            logger.warning("averaging round failed; applied local gradients instead")

    def _state_marker(self) -> tuple[int, float]:
        """Changes whenever hivemind loads a peer's state (it applies it in place and returns None)."""
        first = next(iter(self.state_averager.optimizer.param_groups[0]["params"]))
        return int(self.state_averager.local_epoch), float(first.detach().double().sum())

    def _bound_state_download(self) -> None:
        """Make each hivemind download call give up after N failed attempts instead of looping."""
        original = self.state_averager.load_state_from_peers

        def bounded(**kwargs: Any) -> None:
            if time.monotonic() - self._last_failed_sync < self._retry_sync_after:
                return  # failed recently: keep training locally rather than stall every step
            self.stats.download_started()
            started = time.perf_counter()
            rejected = 0
            for attempt in range(1, self._load_state_attempts + 1):
                before = self._state_marker()
                try:
                    original(**kwargs)
                except Exception as exc:  # timeouts and vanished donors are normal weather
                    logger.warning("state download attempt %d/%d failed: %r", attempt, self._load_state_attempts, exc)
                else:
                    if self._state_marker() != before:
                        self._adopted = True
                        self.stats.download_finished(True, time.perf_counter() - started)
                        logger.info("downloaded the swarm's state: now at epoch %d", self.local_epoch)
                        return
                    refused = len(getattr(self.state_averager, "last_download_rejections", ()))
                    rejected += refused
                    if not refused:  # the hardened averager says itself what it refused
                        logger.info("no donor answered (attempt %d/%d)", attempt, self._load_state_attempts)
                # A node that has just joined may not see the donors' DHT entries yet.
                if attempt < self._load_state_attempts and self._wait(2.0 * attempt):
                    break
            self.stats.download_finished(False, 0.0)
            self._last_failed_sync = time.monotonic()
            if isinstance(self.tracker, RobustProgressTracker):
                self.tracker.distrust_unsupported(self._retry_sync_after)
            if rejected and self.local_epoch == 0:  # once per download, however many attempts found them
                logger.warning("every donor's state was rejected: training from this node's own initialisation")
            else:
                logger.warning("could not download state from any peer; continuing with local state")

        self.state_averager.load_state_from_peers = bounded
