"""hivemind's collaborative optimizer, hardened: every override of ``hivemind.Optimizer`` in one subclass.

hivemind's ``Optimizer`` swallows swarm failures (that is what keeps a swarm elastic), but its
``load_state_from_peers`` retries forever when no donor answers (hivemind #653), and its round
scheduling loses epochs between peers of different speeds.  :class:`HardenedOptimizer` overrides
(``hivemind.Optimizer`` 1.1.12 unless noted; :mod:`p2ptrain.averaging.pinned` lists them all):

* ``_make_progress_tracker``, ``_make_state_averager``, ``_make_gradient_averager``: our tracker and
  averagers (:mod:`p2ptrain.averaging.progress`, :mod:`p2ptrain.averaging.hardened`) under
  hivemind's wire names, with the peer checks or without, given an owned run's admission gate if any.
* ``_should_load_state_from_peers`` (and its flag ``_should_check_synchronization_on_update``): no
  download for a while after one failed, nor when a peer one epoch behind can end its epoch in the
  swarm's round instead.
* ``_maybe_schedule_gradient_averaging``, ``_maybe_schedule_state_averaging``,
  ``_begin_averaging_gradients``, ``_average_gradients_and_load_into_optimizer``: rounds scheduled so
  that hivemind never cancels one still looking for its group, every epoch its own round, every round
  reported.
* ``_load_averaged_gradients_into_optimizer_``: the averaged gradients (host memory) moved to parameters on
  a GPU explicitly (hivemind would assign a host tensor as a GPU parameter's gradient).
* ``load_state_from_peers`` (a bound on the attempts: it patches the state averager's
  ``load_state_from_peers`` on the instance), ``shutdown`` (a round nobody will join is not waited
  out) and ``_tag_along_with_zero_weight`` (called, when the node steps aside).

What the node counts is not decided here: a subclass (:class:`p2ptrain.optim.gradient.GradientOptimizer`)
hears of each epoch, round and download through the ``on_*`` methods.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import hivemind
import torch
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.optim.grad_averager import GradientAverager, GradientAveragerFactory
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.optim.state_averager import TrainingStateAverager

from p2ptrain.averaging.admitting import Admission
from p2ptrain.averaging.handles import looking_for_group
from p2ptrain.averaging.hardened import HardenedGradientAverager
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.progress import SwarmProgressTracker
from p2ptrain.dhtkeys import state_averager_prefix
from p2ptrain.model.device import HostStaging
from p2ptrain.trust.peergate import PeerGate
from p2ptrain.waiting import asked_to_stop

require_hivemind(__name__)

logger = logging.getLogger(__name__)


class HardenedOptimizer(hivemind.Optimizer):
    """``hivemind.Optimizer`` with bounded state downloads and rounds that do not lose epochs.

    ``load_state_attempts`` bounds each download, ``retry_sync_after`` is the pause after one that
    failed, ``wait`` sleeps between attempts (the node's stop event's wait: True stops).  With
    ``admission`` (an owned run's gate) the averagers take part only with admitted peers.  With
    ``tracker_gate`` the progress tracker is the robust one (``tracker_bound``: the record keys bound to
    peer IDs), and with ``state_checks`` (the hardened averager's keyword arguments) the state averager
    is :class:`~p2ptrain.averaging.state_download.SafeTrainingStateAverager`.
    """

    # hivemind.Optimizer's own, written here too: declared so that their types are known.
    scheduled_grads: StepControl | None
    _should_check_synchronization_on_update: bool

    def __init__(self, *args: Any, load_state_attempts: int, retry_sync_after: float,
                 wait: Callable[[float], object] = time.sleep, admission: Admission | None = None,
                 tracker_gate: PeerGate | None = None, tracker_bound: Callable[[], Mapping[bytes, str]] | None = None,
                 state_checks: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._admission = admission
        self._tracker_gate, self._tracker_bound, self._state_checks = tracker_gate, tracker_bound, state_checks
        self._wait = wait
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
        #: Averaged gradients on their way to parameters on a GPU (made on first use).
        self._grad_staging: HostStaging | None = None
        super().__init__(*args, **kwargs)
        self._bound_state_download()

    # ------------------------------------------------------------------ what a subclass hears

    def on_epoch_closed(self, samples: int, round_started: bool, alone: bool) -> None:
        """An epoch ended with ``samples`` of ours; its round began (or not, or nobody else trains)."""

    def on_round_ended(self, ok: bool, duration: float, group_size: int) -> int:
        """A round ended (hivemind's word on it: ``ok``, ``group_size``); returns the group size as
        measured (the averager's round report), which decides whether the epoch counts as averaged."""
        return group_size

    def on_download_started(self) -> None:
        """A bounded state download begins."""

    def on_download_finished(self, adopted: bool, seconds: float) -> None:
        """It ended: a state adopted after ``seconds``, or none."""

    # ------------------------------------------------------------------ public behaviour

    @property
    def round_in_flight(self) -> bool:
        """A gradient round begun by the training thread has not ended in the background yet."""
        return self._rounds_begun > self._rounds_ended

    def load_state_from_peers(self, **kwargs: Any) -> bool:
        """hivemind's download, bounded by ``load_state_attempts``; True when a state was adopted."""
        self._adopted = False
        super().load_state_from_peers(**kwargs)
        return self._adopted

    def settle(self) -> None:
        """Nothing to apply here: hivemind applies a landed background step by itself."""

    def step_aside(self) -> None:
        """Finish any round already scheduled with zero weight (so its partners are not left
        waiting) and withdraw this peer's progress record."""
        for name in ("scheduled_grads", "scheduled_state"):
            control = getattr(self, name, None)
            if control is not None and not control.done():
                self._tag_along_with_zero_weight(control)
            setattr(self, name, None)
        self.tracker.withdraw()

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

    # ------------------------------------------------------------------ hivemind overrides: what it builds

    def _make_progress_tracker(self, target_batch_size: int, **kwargs: Any) -> ProgressTracker:
        """hivemind's tracker reporting about once a second; with the peer checks, the robust one."""
        opt: Any = self
        kwargs.update(dht=opt.dht, prefix=opt.run_id, target_batch_size=target_batch_size, client_mode=opt.client_mode,
                      status_loglevel=opt.status_loglevel, start=True)
        if self._tracker_gate is None:
            return SwarmProgressTracker(**kwargs)
        return SwarmProgressTracker(robust=True, gate=self._tracker_gate, bound=self._tracker_bound, **kwargs)

    def _make_state_averager(self, **kwargs: Any) -> TrainingStateAverager:
        checks = self._state_checks
        if checks is None and self._admission is None:
            return super()._make_state_averager(**kwargs)
        from p2ptrain.averaging.state_download import SafeTrainingStateAverager

        # hivemind.Optimizer names its state averager's settings in its own _make_state_averager;
        # the same settings here, for our class.
        opt: Any = self
        averager = SafeTrainingStateAverager(
            dht=opt.dht, prefix=state_averager_prefix(opt.run_id), min_matchmaking_time=opt.matchmaking_time,
            allreduce_timeout=opt.allreduce_timeout, shutdown_timeout=opt.shutdown_timeout,
            offload_optimizer=opt.offload_optimizer, custom_gradients=opt.offload_optimizer,
            status_loglevel=opt.status_loglevel, next_chunk_timeout=opt.next_chunk_timeout,
            client_mode=opt.client_mode, auxiliary=opt.auxiliary, start=True, admission=self._admission,
            peer_checks=checks is not None, **(checks or {}), **kwargs)
        averager.stopping = asked_to_stop(self._wait)
        return averager

    def _make_gradient_averager(self, factory: GradientAveragerFactory | None, **kwargs: Any) -> GradientAverager:
        """``factory`` builds one of our gradient averagers (None: ours without the peer checks); it is
        handed the run's admission gate."""
        if factory is None:
            factory = functools.partial(HardenedGradientAverager, peer_checks=False)
        return super()._make_gradient_averager(functools.partial(factory, admission=self._admission), **kwargs)

    # ------------------------------------------------------------------ hivemind overrides: when to download

    def _should_load_state_from_peers(self) -> bool:
        # After a download that found no usable state, train on (local progress) instead of returning
        # from every step to a download that is not retried yet: that would stall the node.
        if time.monotonic() - self._last_failed_sync < self._retry_sync_after:
            return False
        if self._joins_the_swarm_s_round():
            return False
        return bool(super()._should_load_state_from_peers())

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

    # ------------------------------------------------------------------ hivemind overrides: rounds

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
        self.on_epoch_closed(samples, round_started=began, alone=self.tracker.global_progress.num_peers <= 1)
        self._rounds_begun += began
        return began

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control: Any) -> None:
        try:
            self._average_and_report(maybe_step_control)
        finally:
            self._rounds_ended = self._rounds_begun if maybe_step_control is None else self._rounds_ended + 1

    def _average_and_report(self, maybe_step_control: Any) -> None:
        started = time.perf_counter()
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        if maybe_step_control is None:
            return  # alone in the swarm: no round was attempted
        if self._left_mid_round and maybe_step_control.cancelled():
            logger.info("left before the last averaging round found a group; its gradients were applied locally")
            return
        ok = maybe_step_control.done() and not maybe_step_control.cancelled() \
            and maybe_step_control.exception() is None
        group_size = self.on_round_ended(ok, time.perf_counter() - started,
                                         len(maybe_step_control.result()) if ok else 0)
        if ok and group_size >= 2:
            self._averaged_epoch = self._round_epoch
        if not ok:
            logger.warning("averaging round failed; applied local gradients instead")

    @torch.no_grad()
    def _load_averaged_gradients_into_optimizer_(self) -> None:
        """hivemind's, device-aware.  The averaged gradients are host memory; hivemind assigns a clone of
        one as the gradient of a parameter that has none, which torch refuses for a parameter on a GPU.
        There they go to the device through pinned memory, without blocking the host."""
        opt: Any = self
        params = [p for group in self.state_averager.optimizer.param_groups for p in group["params"]]
        if opt.offload_optimizer or not params or params[0].device.type == "cpu":
            super()._load_averaged_gradients_into_optimizer_()
            return
        if self._grad_staging is None:
            self._grad_staging = HostStaging(params, params[0].device)
        with self.grad_averager.get_tensors() as averaged:
            moved = self._grad_staging.to_device(averaged)
        for param, grad in zip(params, moved, strict=True):
            if param.grad is None:
                param.grad = grad
            else:
                param.grad.copy_(grad)
        self.grad_averager.notify_used_averaged_gradients()

    # ------------------------------------------------------------------ bounded downloads

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
            self.on_download_started()
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
                        self.on_download_finished(True, time.perf_counter() - started)
                        logger.info("downloaded the swarm's state: now at epoch %d", self.local_epoch)
                        return
                    refused = len(getattr(self.state_averager, "last_download_rejections", ()))
                    rejected += refused
                    if not refused:  # the hardened averager says itself what it refused
                        logger.info("no donor answered (attempt %d/%d)", attempt, self._load_state_attempts)
                # A node that has just joined may not see the donors' DHT entries yet.
                if attempt < self._load_state_attempts and self._wait(2.0 * attempt):
                    break
            self.on_download_finished(False, 0.0)
            self._last_failed_sync = time.monotonic()
            if getattr(self.tracker, "robust", False):
                self.tracker.distrust_unsupported(self._retry_sync_after)
            if rejected and self.local_epoch == 0:  # once per download, however many attempts found them
                logger.warning("every donor's state was rejected: training from this node's own initialisation")
            else:
                logger.warning("could not download state from any peer; continuing with local state")

        self.state_averager.load_state_from_peers = bounded
