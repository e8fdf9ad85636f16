"""DiLoCo: local AdamW steps, then one swarm all-reduce of the parameters and an outer SGD step.

Each outer round starts from the shared "outer" parameters.  A peer trains alone with inner AdamW
steps of ``inner_batch_size`` sequences (accumulated over micro-batches) until the swarm's round
clock (:mod:`p2ptrain.optim.round_clock`) says the round is over: when the swarm has processed
``inner_steps`` inner batches for every peer of its fastest peer's speed, at the same moment for
fast and slow peers.
It then averages its parameters with whoever is in the round, weighted by samples, takes
``outer params - that average`` as the pseudo-gradient and applies Nesterov-momentum SGD to the
outer params, which become the model's parameters for the next round.  While the peers' outer
params agree this is exactly DiLoCo's average of pseudo-gradients; when they drift apart (a round
that failed or reached only part of the swarm, a round a peer missed) averaging the parameters
pulls them back together every round (with the default outer_lr 0.7 and Nesterov momentum 0.9
the gap about halves each round), where averaging pseudo-gradients would keep it forever.
Matchmaking for a round is started ``matchmaking_time`` seconds before the round clock's estimated
end, and the round ends for all members of its group at once, when the group has assembled (or
when the clock says so, whichever comes first).  With ``overlap`` (the default) the all-reduce
itself runs while the next round's inner steps compute: when it lands, the outer step is applied
and the local progress made in the meantime is kept on top of the new outer params (a one-round
delayed outer update), so neither the all-reduce nor waiting for a slower peer stalls training.

Elasticity: the round is bounded by ``averaging_timeout`` (a dead peer costs the others at most
that, and then they apply their own pseudo-gradient, or with ``outer_compression`` keep it in their
buffers for the next round: there the rounds average pseudo-gradients, which never close a gap
between peers, so a failed round takes no outer step and a peer that missed a round downloads); a
newcomer downloads the outer params, outer momentum and round position from a peer and finishes
the current round together with it.
A downloaded state is checked before any of it is copied (:mod:`p2ptrain.averaging.state_check`); with the
peer checks (:class:`p2ptrain.optim.defences.Defences`) the averager is hardened
(:mod:`p2ptrain.averaging.diloco`) and the round clock believes only identity-bound peers.
It implements :class:`p2ptrain.optim.protocol.SwarmOptimizer`, the node's optimizer protocol;
state downloads and checkpoints are its base, :class:`p2ptrain.optim.diloco_state.DiLoCoState`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any

import torch

from p2ptrain.averaging.admitting import Admission
from p2ptrain.averaging.compression import make_compression, wire_bytes
from p2ptrain.averaging.diloco import DiLoCoAverager
from p2ptrain.averaging.handles import DHT, awaiting_trigger, dht_time, looking_for_group
from p2ptrain.averaging.progress import SwarmProgressTracker
from p2ptrain.averaging.robust_reduce import AllReduceReport, ReduceRule, RoundReports
from p2ptrain.averaging.roundclock import RoundTarget
from p2ptrain.averaging.sparse_codec import SparseChunkCodec, sparse_wire_bytes
from p2ptrain.averaging.state_download import diloco_state_validator
from p2ptrain.config.schema import TrainingSection
from p2ptrain.dhtkeys import diloco_averager_prefix, diloco_clock_prefix, diloco_outer_prefix
from p2ptrain.model.device import HostStaging
from p2ptrain.optim.defences import Defences
from p2ptrain.optim.diloco_state import DiLoCoState
from p2ptrain.optim.error_feedback import ErrorFeedback
from p2ptrain.optim.inner import ClippedAdamW, warmup_cosine
from p2ptrain.optim.microbatches import MicroBatches
from p2ptrain.optim.outer_step import OuterStep
from p2ptrain.optim.protocol import GlobalProgress, GuardTargets
from p2ptrain.optim.retune import retune
from p2ptrain.optim.round_clock import (
    met_the_next_round,
    micro_batches_per_inner_step,
    schedule_position,
    set_schedule_position,
)
from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.solo_round import SoloRounds
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.waiting import WaitTimeout, asked_to_stop, wait_until

logger = logging.getLogger(__name__)

_ALONE: dict[Any, Any] = {}  # what DiLoCoOptimizer._begin_average returns alone in the swarm (falsy, not None)


@dataclass
class _RoundInFlight:
    """An overlapped outer round: its all-reduce runs while the next inner steps compute."""

    control: Any
    snapshot: list[torch.Tensor]
    """The parameters when the pseudo-gradients were taken: progress since then is carried over."""
    pseudo: list[torch.Tensor]
    """Our own pseudo-gradients, applied instead of the average if the round fails."""
    started: float
    epoch: int  # the round it ends, by this peer's count


class DiLoCoOptimizer(DiLoCoState):
    """The DiLoCo outer loop behind the node's optimizer protocol."""

    def __init__(self, params: Iterable[torch.nn.Parameter], dht: DHT, run_id: str, cfg: TrainingSection,
                 *, client_mode: bool, stats: SwarmStats, bandwidth: float | None = None,
                 admission: Admission | None = None, defences: Defences | None = None,
                 evaluate: Callable[[], float] | None = None, wait: Callable[[float], object] = time.sleep) -> None:
        self.cfg, self.stats, self.dht = cfg, stats, dht
        self._peer_id = getattr(dht, "peer_id", None)  # its entry in a landed group (unit tests run without a DHT)
        #: Pauses between state-download attempts: the node's stop event's wait (True: stop asked).
        self._wait = wait
        self._defences, self._evaluate = defences, evaluate
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"params": self.params}]
        self.inner = ClippedAdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  max_grad_norm=cfg.max_grad_norm)
        # The LR schedule moves per inner step (warmup/total epochs count outer rounds in config); its
        # position is set from the round and the step in it, so fast and slow peers stay on one curve.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.inner, warmup_cosine(cfg.warmup_epochs * cfg.inner_steps, cfg.total_epochs * cfg.inner_steps))
        self.outer = OuterStep(self.params, cfg.outer_lr, cfg.outer_momentum, cfg.outer_nesterov)
        #: Micro-batches per inner AdamW step (inner_batch_size / batch_size).
        self._accumulate = max(1, cfg.inner_batch // cfg.batch_size)
        self._micro = MicroBatches(self.params, self._accumulate)
        self._told_inner_batch = False
        self.inner_step, self.samples_this_round = 0, 0
        self._local_epoch = 0
        self._scheduled: Any = None
        self._in_flight: _RoundInFlight | None = None
        #: Set while no round is in flight (state served to newcomers waits for it).
        self.round_settled = threading.Event()
        self.round_settled.set()
        self._last_failed_sync = -math.inf
        #: Rounds ended with nobody else: failed, or this node trains alone (:mod:`p2ptrain.optim.solo_round`).
        self.solo = SoloRounds()
        numel = sum(p.numel() for p in self.params)
        self._payload_bytes = wire_bytes(numel, cfg.grad_compression)
        compression = make_compression(cfg.grad_compression)
        #: int8/topk: rounds average what each peer sends of its pseudo-gradient; the rest waits here.
        self._feedback: ErrorFeedback | None = None
        if cfg.outer_compression != "none":
            self._feedback = ErrorFeedback([p.shape for p in self.params], cfg.outer_compression,
                                           cfg.outer_topk_density, cfg.outer_value_bits)
            if cfg.outer_compression == "topk":
                compression = SparseChunkCodec(cfg.outer_value_bits)
                # Sent sparse at its bits; the reducer's reply (a pair's union of entries) returns at 8 bits.
                density, bits = cfg.outer_topk_density, cfg.outer_value_bits
                self._payload_bytes = sum(sparse_wire_bytes(p.numel(), density, bits)
                                          + sparse_wire_bytes(p.numel(), min(1.0, 2 * density), 8)
                                          for p in self.params) // 2
            else:
                compression, self._payload_bytes = make_compression("8bit"), wire_bytes(numel, "8bit")
        # The averager's buffers are host memory (hivemind shares them with its process); the parameters
        # may live on a GPU, and every copy between the two goes through the staging.
        self._buffers = [torch.zeros(p.shape, dtype=torch.float32, device="cpu") for p in self.params]
        self._staging = HostStaging(self.params, self.params[0].device if self.params else torch.device("cpu"))
        per_peer = cfg.inner_steps * self._accumulate * cfg.batch_size
        logger.info("DiLoCo: a round ends when the swarm has trained %d sequences per peer of its fastest peer's "
                    "speed (%d inner steps of %d)", per_peer, cfg.inner_steps, self._accumulate * cfg.batch_size)
        run_id = diloco_outer_prefix(run_id, cfg.outer_compression, cfg.outer_value_bits, cfg.outer_topk_density)
        #: Where the averager reports each round (how much it really averaged), checks on or off.
        self._rounds = defences.rounds if defences is not None else RoundReports()
        checks: dict[str, Any] = dict(round_reports=self._rounds, admission=admission, peer_checks=defences is not None)
        if defences is not None:
            self._tracker: SwarmProgressTracker = SwarmProgressTracker(
                dht, diloco_clock_prefix(run_id), client_mode=client_mode, start=True,
                round_target=RoundTarget(per_peer), robust=True, gate=defences.gate, bound=defences.evidence.bound_keys)
            tracker = self._tracker
            defences.evidence.follow_progress(lambda: tracker.bound_peer_epochs)
            # A round's weight is its samples: a fast peer does a few times the average, never 16x.
            # Pseudo-gradients (int8/topk) are screened like gradients: a pair's norms may differ more.
            rule = ReduceRule.for_diloco if self._feedback is None else ReduceRule.for_gradients
            checks.update(defences.hardened_kwargs(), reduce_rule=rule(max_weight=16.0 * per_peer))
        else:
            self._tracker = SwarmProgressTracker(dht, diloco_clock_prefix(run_id), client_mode=client_mode, start=True,
                                                 round_target=RoundTarget(per_peer))
        # With an owned run's gate, only admitted peers are averaged with and served state.
        self.averager = DiLoCoAverager(
            self._buffers, dht, owner=self, start=True, prefix=diloco_averager_prefix(run_id), client_mode=client_mode,
            min_matchmaking_time=cfg.matchmaking_time, request_timeout=min(3.0, cfg.matchmaking_time / 2),
            allreduce_timeout=cfg.averaging_timeout, next_chunk_timeout=cfg.averaging_timeout / 3,
            compression=compression,
            state_compression=make_compression(cfg.state_compression), bandwidth=bandwidth, **checks,
        )
        self.averager.stopping = asked_to_stop(self._wait)  # a download in progress ends with a stop
        #: Whatever a download brings is checked before it touches the model: shapes, dtypes, finite,
        #: metadata in range; with the peer checks also against the run's reports and our own loss.
        self._validator = diloco_state_validator(
            self.outer.params, cfg.inner_steps, own_epoch=lambda: self.local_epoch,
            peer_epochs=defences.evidence.peer_epochs if defences is not None else None,
            model_check=self._check_model if defences is not None else None)
        if defences is not None:
            self.averager.state_validator = self._validator

    # ------------------------------------------------------------------ the node's protocol

    @property
    def local_epoch(self) -> int:
        return self._local_epoch

    def _set_epoch(self, epoch: int) -> None:
        self._local_epoch = int(epoch)
        with self._tracker.pause_updates():
            self._tracker.update_epoch(self._local_epoch)
        if not self.averager.client_mode:
            self.averager.state_sharing_priority = self._local_epoch

    def global_progress(self) -> GlobalProgress:
        progress = self._tracker.global_progress
        return GlobalProgress(epoch=int(self._tracker.global_epoch),
                              samples_accumulated=int(progress.samples_accumulated),
                              num_peers=int(progress.num_peers),
                              known=self._tracker.fetched_global_progress_this_epoch.is_set(),
                              round_in_flight=self._in_flight is not None and not self._in_flight.control.done())

    def step_aside(self) -> None:
        """Stop being counted on while paused (see
        :meth:`p2ptrain.averaging.progress.SwarmProgressTracker.withdraw`)."""
        self._tracker.withdraw()

    def settle(self) -> None:
        """Paused: apply the round in flight if it has landed.  A paused node still serves its state,
        and :meth:`served_state` waits for that round: only the training thread applies it, and a
        paused loop calls this instead of training.  No download while paused."""
        self._settle_round(block=False, catch_up=False)

    def rejoin(self) -> None:
        self._tracker.report_local_progress(self.local_epoch, self.samples_this_round)

    def guard_targets(self) -> GuardTargets:
        """The model's parameters and the outer parameters, with the inner and outer optimizers'
        state: a non-finite average must not survive in either copy."""
        return GuardTargets(tensors=[*self.params, *self.outer.params], optimizers=[self.inner, self.outer.optimizer])

    def apply_training(self, cfg: TrainingSection) -> None:
        """Inner lr, schedule, weight decay and clipping now; round timeouts from the next round on."""
        retune(self.inner, self.scheduler, cfg,
               warmup_cosine(cfg.warmup_epochs * cfg.inner_steps, cfg.total_epochs * cfg.inner_steps))
        self.cfg = cfg

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the current micro-batch's gradients (earlier ones of the inner batch are kept apart)."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, batch_size: int | None = None) -> None:
        """One micro-batch; every ``inner_batch_size`` sequences an inner AdamW step; the outer round when the
        round clock says so, checked each micro-batch (a slow peer's inner step can take a second)."""
        self.samples_this_round += batch_size or self.cfg.batch_size
        self._tracker.report_local_progress(self.local_epoch, self.samples_this_round)
        if self._tracker.global_progress.num_peers >= 2:
            self.solo.saw_company(self.local_epoch)
        self._settle_round(block=False)
        self._size_inner_batch()
        inner_batch_full = self._micro.add()
        if self._tracker.global_epoch > self.local_epoch + 1:
            # Rounds behind: ours could average with nobody. Catch up first (a download, retried now and then).
            if inner_batch_full:
                self._inner_step()
            self._catch_up()
            return
        self._maybe_schedule_round()
        round_over = self._round_is_over()
        if inner_batch_full or round_over:  # a round's end cuts its last inner batch short
            self._inner_step()
        if round_over:
            ending = self.local_epoch
            self._settle_round(block=True)  # one round at a time: the previous one lands first
            if self.local_epoch == ending:
                self._outer_round()
            # else: the landed round was the swarm's next one, and so is over (see _settle_round).

    def _round_is_over(self) -> bool:
        """The swarm's round clock says so, or our group for the round has already assembled.

        Each peer reads the clock from its own view of the DHT, refreshed every few seconds, so
        their readings differ by seconds; the all-reduce drops a member whose part comes later
        than ``averaging_timeout / 3`` after the others', and that member's round, which then ends
        later still, would make it late for the next round too, and rounds would stay partial for
        good.  Once the group has assembled, its members are all waiting for their trigger at the
        same moment: every one of them ends its round then.
        """
        scheduled = self._scheduled
        return self._tracker.ready_to_update_epoch or (
            scheduled is not None and awaiting_trigger(scheduled))

    def _size_inner_batch(self) -> None:
        """Scale the next inner batch to this peer's share of the swarm's pace, so that it too makes about
        ``inner_steps`` inner steps a round (:func:`p2ptrain.optim.round_clock.micro_batches_per_inner_step`)."""
        own_rate, pace = self._tracker.performance_ema.samples_per_second, self._tracker.pace
        per_step = micro_batches_per_inner_step(self._accumulate, own_rate, pace)
        if per_step != self._micro.per_step and self._micro.count == 0:
            # Said once at INFO; a peer near a boundary moves between two sizes every few rounds.
            log = logger.debug if self._told_inner_batch else logger.info
            self._told_inner_batch = True
            log("DiLoCo: inner steps of %d sequences (%d configured): this peer trains at %.0f%% of the swarm's pace",
                per_step * self.cfg.batch_size, self._accumulate * self.cfg.batch_size,
                100.0 * min(1.0, own_rate / max(pace, 1e-9)))
        self._micro.resize(per_step)

    def _inner_step(self) -> None:
        self._micro.load_mean()
        set_schedule_position(self.scheduler, schedule_position(self.local_epoch, self.inner_step,
                                                                self.cfg.inner_steps))
        self.inner.step()
        self.inner_step += 1

    def _maybe_schedule_round(self) -> None:
        """Start matchmaking shortly before the round clock's end (DHT time), so every peer looks for its group
        at once; not while the round in flight still looks for its own (hivemind would queue the two)."""
        flight = self._in_flight
        looking = flight is not None and looking_for_group(flight.control)
        if self._scheduled is not None or looking or self._tracker.global_progress.num_peers < 2:
            return
        now = dht_time()
        ends = self._tracker.estimated_next_update_time
        if ends - now > self.cfg.matchmaking_time:
            return
        try:
            self._scheduled = self.averager.step(
                weight=float(max(self.samples_this_round, 1)), gather=self.local_epoch,
                scheduled_time=max(ends, now + 0.5), timeout=self.cfg.averaging_timeout,
                require_trigger=True, wait=False)
        except Exception as exc:  # the averager process being gone is swarm weather too
            logger.warning("could not schedule the DiLoCo round: %r", exc)

    # ------------------------------------------------------------------ the outer round

    def _outer_round(self) -> None:
        started = time.perf_counter()
        pseudo = self.outer.pseudo_gradients(self.params)
        if self._feedback is not None:
            # What this peer sends is what a round averages; the rest stays in its buffer.
            pseudo = self._feedback.take(pseudo)
            control = self._begin_average(pseudo)
        else:
            control = self._begin_average([p.detach() for p in self.params])
        if control is _ALONE and self.solo.ended_alone(self.local_epoch, self._failed_round):
            control = None  # a failed round: reported (and its samples credited) as one
        # Credit (p2ptrain.trust.credit): this round's samples; alone in the swarm, no round will report on them.
        self.stats.epoch_closed(self.samples_this_round, round_started=control is not _ALONE, alone=control is _ALONE)
        late = False
        if control is _ALONE or control is None or not self.cfg.overlap:
            group = control if control is _ALONE or control is None else self._await(control)
            self._finish_round(group, pseudo, None, started)
            late = met_the_next_round(group, self._peer_id, self.local_epoch)
        else:
            self._in_flight = _RoundInFlight(control, [p.detach().clone() for p in self.params], pseudo, started,
                                             self.local_epoch)
            self.round_settled.clear()
        self.inner_step, self.samples_this_round = 0, 0
        self._set_epoch(self._local_epoch + 1 + late)
        if self._in_flight is None:
            self._catch_up()

    def _begin_average(self, params: list[torch.Tensor]) -> Any:
        """Hand this peer's parameters to the averager and let the round's all-reduce start.

        Returns the round's control, ``_ALONE`` when nobody else is in the swarm, None if the round
        could not even start.
        """
        control, self._scheduled = self._scheduled, None
        if control is None and self._tracker.global_progress.num_peers < 2:
            return _ALONE
        with self.averager.get_tensors() as buffers:
            self._staging.to_host(params, buffers)
        try:
            if control is None:
                control = self.averager.step(weight=float(max(self.samples_this_round, 1)), gather=self.local_epoch,
                                             timeout=self.cfg.averaging_timeout, require_trigger=True, wait=False)
            control.weight = float(max(self.samples_this_round, 1))
            control.allow_allreduce()
            return control
        except Exception as exc:  # the averager process being gone is swarm weather too
            if control is not None:
                control.cancel()
            logger.warning("DiLoCo round %d could not start (%r); %s", self.local_epoch, exc, self._failed_round)
            return None

    def _await(self, control: Any) -> Any:
        """The round's gathered info, or None if it failed (timeouts, vanished peers).

        The round ends by itself within its own timeout; it is only cancelled if hivemind misses
        that by a wide margin, because cancelling a round that is still looking for a group can
        break hivemind's matchmaking for good (see ``p2ptrain.optim.gradient.GradientOptimizer``).
        """
        try:
            return control.result(timeout=self.cfg.averaging_timeout + self.cfg.matchmaking_time + 5.0)
        except CancelledError:  # by flush, which has said so
            pass
        except TimeoutError:
            control.cancel()
            logger.warning("DiLoCo round %d never ended: cancelled; %s", self.local_epoch, self._failed_round)
        except Exception as exc:
            logger.warning("DiLoCo round failed (%r); %s", exc, self._failed_round)
        return None

    def _settle_round(self, block: bool, catch_up: bool = True) -> None:
        """Apply the round in flight once its all-reduce has landed (or, with ``block``, wait for it);
        then, with ``catch_up``, rejoin a swarm that has moved on (a download, when far behind)."""
        flight = self._in_flight
        if flight is None:
            return
        if not flight.control.done() and not block:
            return
        group = self._await(flight.control)
        carry = [p.detach() - s for p, s in zip(self.params, flight.snapshot, strict=True)]
        self._finish_round(group, flight.pseudo, carry, flight.started)
        self._in_flight = None
        self.round_settled.set()
        if self.local_epoch == flight.epoch + 1 and met_the_next_round(group, self._peer_id, flight.epoch):
            self._set_epoch(flight.epoch + 2)  # the swarm has ended the round we counted as in progress
        if catch_up and self._tracker.global_epoch > self.local_epoch + 1:  # one behind, our round is over:
            self._catch_up()  # it ends now, in the swarm's group for it (the swarm waits for our part)

    def _catch_up(self) -> None:
        """Rejoin a swarm that has moved on: one round behind, just join the next round (the missed
        outer step is the same small drift as a failed round); further behind, download the state."""
        swarm_round = self._tracker.global_epoch
        if swarm_round > self.local_epoch and not self.join_next_round(swarm_round):
            logger.info("swarm is at round %d, we are at %d: syncing", swarm_round, self.local_epoch)
            self.load_state_from_peers()

    def join_next_round(self, swarm_round: int) -> bool:
        """One round behind the swarm: take its round number and average with it at the end of this
        one, without a download; False (nothing changed) when ``swarm_round`` is not just one ahead,
        or when rounds average pseudo-gradients (``outer_compression`` int8 or topk).

        Safe only where a round averages the peers' *parameters*: the outer step this node missed
        leaves it where a failed round would, and averaging halves that gap every round.  Averaged
        pseudo-gradients move every peer by the same step and never close a gap, so there a peer
        that missed a round's step must download the outer parameters."""
        if swarm_round != self.local_epoch + 1 or self._feedback is not None:
            return False
        logger.info("missed round %d: joining round %d with the swarm", self.local_epoch, swarm_round)
        self._set_epoch(swarm_round)
        return True

    @property
    def _failed_round(self) -> str:
        """What a failed round does here, for its log line (see :meth:`_finish_round`)."""
        if self._feedback is not None:
            return "kept the pseudo-gradient for the next round"
        return "applied the local pseudo-gradient"

    def _finish_round(self, group: Any, pseudo: list[torch.Tensor], carry: list[torch.Tensor] | None,
                      started: float) -> None:
        """The outer step with the swarm's pseudo-gradient, ``outer - average of the peers' parameters``
        (int8/topk: the average of what the peers sent), or our own if the round failed."""
        if group:
            with self.averager.get_tensors() as buffers:
                averages = self._staging.to_device(buffers)
            if self._feedback is not None:
                pseudo = averages  # the average of what the peers sent
            else:
                pseudo = [outer - average for outer, average in zip(self.outer.params, averages, strict=True)]
        if group is None and self._feedback is not None:
            # A failed round with averaged pseudo-gradients: what we sent goes back into the buffer, for
            # the next round, and no outer step is taken.  Every peer whose round failed does the same,
            # so their outer parameters stay equal (own steps would set them apart for good).
            self._feedback.give_back(pseudo)
            self.outer.restart(self.params, carry)
        else:
            self.outer.apply(pseudo, self.params, carry)
        if group is not _ALONE:  # alone in the swarm is not a failed round
            group_size, received = len(group or ()), None
            measured = self._measured_round()
            if group is not None and measured is not None:
                group_size, received = measured.group_size, measured.averaged_fraction
            report = RoundSummary(ok=group is not None, duration=time.perf_counter() - started,
                                 group_size=group_size, peers_online=self._tracker.global_progress.num_peers,
                                 received_fraction=received)
            self.stats.record_round(report, self._payload_bytes)

    def _measured_round(self) -> AllReduceReport | None:
        """What the averager measured of the round that just ended (with the checks, also fed to the
        evidence: the peers it met)."""
        if self._defences is not None:
            return self._defences.take_round(str(self.dht.peer_id))
        return self._rounds.latest()

    def flush(self) -> None:
        """Land the round in flight before the node stops, so the final checkpoint holds it.

        A round whose group has assembled is waited for (bounded by the averaging timeout).  One still
        looking for its group gets two matchmaking windows, not the whole timeout: at a stop, the peers
        it would have met may have stopped too, and the whole timeout would be spent waiting for nobody."""
        flight = self._in_flight
        if flight is not None:
            control = flight.control
            try:
                wait_until(lambda: not looking_for_group(control), 2 * self.cfg.matchmaking_time + 1.0, "group",
                           interval=0.05)
            except WaitTimeout:
                logger.info("DiLoCo round %d found no group before the stop: applying the local pseudo-gradient",
                            flight.epoch)
                control.cancel()
        self._settle_round(block=True)

    def shutdown(self) -> None:
        for control in (self._scheduled, self._in_flight.control if self._in_flight else None):
            if control is not None:
                control.cancel()
        self.round_settled.set()
        self._tracker.shutdown()
        self.averager.shutdown()
