"""Gradient mode: hivemind's collaborative optimizer behind the node's optimizer protocol, accounted.

The optimizer itself, and every override of hivemind's internals it needs (bounded state downloads,
rounds that do not lose epochs, our tracker and averagers under hivemind's wire names), is the
adapter's :class:`~p2ptrain.averaging.optimizer.HardenedOptimizer`.  :class:`GradientOptimizer` adds
what the node asks of it: :class:`~p2ptrain.optim.protocol.SwarmOptimizer`, every averaging round and
download recorded into :class:`SwarmStats`, and the peer checks of
:class:`~p2ptrain.optim.defences.Defences` handed to the adapter (a validated, donor-aware state
download with an O(1) schedule catch-up, a robust gradient all-reduce, a progress tracker that
believes only identity-bound peers and an epoch several of them agree on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from p2ptrain.averaging.admitting import Admission
from p2ptrain.averaging.compression import CompressionChoice, wire_bytes
from p2ptrain.averaging.model_check import make_loss_check
from p2ptrain.averaging.optimizer import HardenedOptimizer
from p2ptrain.averaging.robust_reduce import ReduceRule, RoundReports
from p2ptrain.config.schema import TrainingSection
from p2ptrain.optim.defences import Defences
from p2ptrain.optim.inner import warmup_cosine
from p2ptrain.optim.protocol import GlobalProgress, GuardTargets
from p2ptrain.optim.retune import retune
from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.trust.verdicts import Verdict

logger = logging.getLogger(__name__)


class GradientOptimizer(HardenedOptimizer):
    """The adapter's hivemind optimizer with per-round accounting and the node's protocol.

    With ``admission`` (an owned run's gate) its averagers take part only with admitted peers; with
    ``defences`` they are the hardened ones.
    """

    def __init__(self, *args: Any, stats: SwarmStats, wire_format: CompressionChoice = "none",
                 admission: Admission | None = None, defences: Defences | None = None,
                 evaluate: Callable[[], float] | None = None, round_reports: RoundReports | None = None,
                 **kwargs: Any) -> None:
        self._defences, self._evaluate = defences, evaluate
        #: Where the gradient averager reports each round without the peer checks (with them: the defences').
        self._rounds = round_reports
        self.stats = stats
        if defences is not None:
            kwargs.update(tracker_gate=defences.gate, tracker_bound=defences.evidence.bound_keys,
                          state_checks=dict(defences.hardened_kwargs(), reduce_rule=ReduceRule.for_parameters(),
                                            peer_epochs=defences.evidence.peer_epochs, model_check=self._check_model))
        super().__init__(*args, admission=admission, **kwargs)
        if defences is not None:
            tracker: Any = self.tracker
            defences.evidence.follow_progress(lambda: tracker.bound_peer_epochs)
        self._payload_bytes = wire_bytes(sum(p.numel() for p in self._parameters()), wire_format)

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    # ------------------------------------------------------------------ the node's protocol

    def global_progress(self) -> GlobalProgress:
        tracker = self.tracker
        progress = tracker.global_progress
        return GlobalProgress(epoch=int(tracker.global_epoch), samples_accumulated=int(progress.samples_accumulated),
                              num_peers=int(progress.num_peers),
                              known=tracker.fetched_global_progress_this_epoch.is_set(),
                              round_in_flight=self.round_in_flight)

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

    def rejoin(self) -> None:
        local = self.tracker.local_progress
        self.tracker.report_local_progress(local.epoch, local.samples_accumulated)

    def guard_targets(self) -> GuardTargets:
        return GuardTargets(tensors=self._parameters(), optimizers=[self.state_averager.optimizer])

    def flush(self) -> None:
        """Nothing to land: a delayed optimizer step is applied by hivemind at the next step."""

    def apply_training(self, cfg: TrainingSection) -> None:
        retune(self.state_averager.optimizer, self.state_averager.scheduler, cfg,
               warmup_cosine(cfg.warmup_epochs, cfg.total_epochs))
        self.target_batch_size = self.tracker.target_batch_size = cfg.target_batch_size
        self.matchmaking_time, self.averaging_timeout = cfg.matchmaking_time, cfg.averaging_timeout
        self.average_state_every = cfg.average_state_every

    # ------------------------------------------------------------------ what the adapter reports

    def on_epoch_closed(self, samples: int, round_started: bool, alone: bool) -> None:
        self.stats.epoch_closed(samples, round_started=round_started, alone=alone)

    def on_round_ended(self, ok: bool, duration: float, group_size: int) -> int:
        received = None
        if self._defences is not None:  # also feeds the evidence: the peers this node met
            measured = self._defences.take_round(str(self.dht.peer_id))
        else:
            measured = self._rounds.latest() if self._rounds is not None else None
        if ok and measured is not None:
            group_size, received = measured.group_size, measured.averaged_fraction
        report = RoundSummary(ok=ok, duration=duration, group_size=group_size,
                             peers_online=self.tracker.global_progress.num_peers, received_fraction=received)
        self.stats.record_round(report, self._payload_bytes)
        return group_size

    def on_download_started(self) -> None:
        self.stats.download_started()

    def on_download_finished(self, adopted: bool, seconds: float) -> None:
        self.stats.download_finished(adopted, seconds)

    def _check_model(self, metadata: Any, tensors: Any, donor: str) -> Verdict:
        """The downloaded model's validation loss here, against ours and the run's reports."""
        if self._evaluate is None or self._defences is None:
            return Verdict.good()
        averager = self.state_averager
        check = make_loss_check(list(averager.main_parameters), self._evaluate, own_loss=lambda: None,
                                peer_losses=self._defences.evidence.peer_val_losses,
                                lock=lambda: averager.lock_averaged_tensors)
        return check(metadata, tensors, donor)
