"""Builds the swarm optimizer from config (gradient averaging or DiLoCo) and counts its swarm traffic.

hivemind's ``Optimizer`` swallows swarm failures (that is what keeps a swarm elastic) but tells
nobody about them except its log, and its ``load_state_from_peers`` retries forever when no
donor answers (hivemind #653).  :class:`SwarmOptimizer` keeps that behaviour, bounds the state
download, and records every averaging round and state download into :class:`SwarmStats`.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import hivemind
import torch
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.utils import get_dht_time

from p2ptrain.compression import make_compression, wire_bytes
from p2ptrain.config import TrainingSection
from p2ptrain.status import ROUND_DURATION_BUCKETS

logger = logging.getLogger(__name__)


@dataclass
class SwarmStats:
    """Counters about averaging and state downloads; written by the training thread only."""

    rounds_ok: int = 0
    rounds_failed: int = 0
    last_round_duration: float | None = None
    last_group_size: int = 0
    round_bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(ROUND_DURATION_BUCKETS) + 1))
    round_duration_sum: float = 0.0
    #: Averaged payload, estimated from tensor sizes and group size (butterfly all-reduce: each peer
    #: sends and receives (n-1)/n of the tensors, twice: reduce-scatter and all-gather).
    bytes_sent: int = 0
    bytes_received: int = 0
    state_downloads: int = 0
    state_downloads_failed: int = 0
    state_download_seconds: float = 0.0
    state_download_progress: float | None = None

    def record_round(self, ok: bool, duration: float, group_size: int, payload_bytes: int) -> None:
        if ok:
            self.rounds_ok += 1
            self.last_group_size = group_size
            moved = int(2 * payload_bytes * (group_size - 1) / max(group_size, 1))
            self.bytes_sent += moved
            self.bytes_received += moved
        else:
            self.rounds_failed += 1
        self.last_round_duration = duration
        self.round_duration_sum += duration
        index = next((i for i, bound in enumerate(ROUND_DURATION_BUCKETS) if duration <= bound),
                     len(ROUND_DURATION_BUCKETS))
        self.round_bucket_counts[index] += 1


def withdraw_progress(tracker: ProgressTracker) -> None:
    """Tell the swarm this peer is not accumulating samples now (what hivemind does when leaving).

    Peers count every live progress record as a partner and wait for it in each averaging round
    (up to ``averaging_timeout``); a paused node must not be waited for.  The tracker re-publishes
    its record every ``metadata_expiration / 2``, so a paused node repeats this now and then.
    """
    tracker.dht.store(tracker.training_progress_key, subkey=tracker._local_public_key, value=None,
                      expiration_time=get_dht_time() + tracker.metadata_expiration, return_future=True)


def warmup_cosine(warmup: int, total: int, floor: float = 0.1) -> Callable[[int], float]:
    """LR multiplier per optimizer epoch: linear warmup, then cosine decay down to ``floor``."""

    def factor(epoch: int) -> float:
        if epoch < warmup:
            return (epoch + 1) / warmup
        progress = min(1.0, (epoch - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class ClippedAdamW(torch.optim.AdamW):
    """AdamW that clips the (already averaged) gradient to ``max_grad_norm`` before each step."""

    def __init__(self, params: Iterable[Any], *, max_grad_norm: float, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        grads = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if grads:
            torch.nn.utils.clip_grad_norm_(grads, self.max_grad_norm)
        return super().step(closure)


class SwarmOptimizer(hivemind.Optimizer):
    """hivemind.Optimizer with bounded state downloads and per-round accounting."""

    def __init__(self, *args: Any, stats: SwarmStats, load_state_attempts: int, retry_sync_after: float,
                 wire_format: str = "none", **kwargs: Any) -> None:
        self.stats = stats
        self._load_state_attempts = load_state_attempts
        self._retry_sync_after = retry_sync_after
        self._last_failed_sync = -math.inf
        super().__init__(*args, **kwargs)
        self._payload_bytes = wire_bytes(sum(p.numel() for p in self._parameters()), wire_format)  # type: ignore[arg-type]
        self._bound_state_download()

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    # Cancelling a round while it is still looking for a group can leave hivemind's matchmaking
    # broken for good ("aclose(): asynchronous generator is already running"; every later round
    # then fails with "could not find a group").  hivemind cancels a pre-scheduled round when, at
    # the epoch boundary, nobody else is there or the epoch does not average parameters after all.
    # So gradient rounds are only pre-scheduled with someone to average with, and parameter rounds
    # (every average_state_every epochs, only a drift repair) are not pre-scheduled at all.

    def _maybe_schedule_gradient_averaging(self) -> None:
        if self.tracker.global_progress.num_peers < 2:
            return
        super()._maybe_schedule_gradient_averaging()

    def _maybe_schedule_state_averaging(self) -> None:
        return

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
            self.stats.state_download_progress = 0.0
            started = time.perf_counter()
            try:
                for attempt in range(1, self._load_state_attempts + 1):
                    before = self._state_marker()
                    try:
                        original(**kwargs)
                    except Exception as exc:  # timeouts and vanished donors are normal weather
                        logger.warning("state download attempt %d/%d failed: %r", attempt,
                                       self._load_state_attempts, exc)
                    else:
                        if self._state_marker() != before:
                            self.stats.state_downloads += 1
                            self.stats.state_download_seconds += time.perf_counter() - started
                            logger.info("downloaded the swarm's state: now at epoch %d", self.local_epoch)
                            return
                        logger.info("no donor answered (attempt %d/%d)", attempt, self._load_state_attempts)
                    if attempt < self._load_state_attempts:
                        # A node that has just joined may not see the donors' DHT entries yet.
                        time.sleep(2.0 * attempt)
                self.stats.state_downloads_failed += 1
                self._last_failed_sync = time.monotonic()
                logger.warning("could not download state from any peer; continuing with local state")
            finally:
                self.stats.state_download_progress = None

        self.state_averager.load_state_from_peers = bounded  # type: ignore[method-assign]

    def step_aside(self) -> None:
        """Stop being counted on while paused: finish any round already scheduled with zero weight
        (so its partners are not left waiting) and withdraw this peer's progress record."""
        for name in ("scheduled_grads", "scheduled_state"):
            control = getattr(self, name, None)
            if control is not None and not control.done():
                self._tag_along_with_zero_weight(control)
            setattr(self, name, None)
        withdraw_progress(self.tracker)

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control: Any) -> None:
        started = time.perf_counter()
        super()._average_gradients_and_load_into_optimizer(maybe_step_control)
        if maybe_step_control is None:
            return  # alone in the swarm: no round was attempted
        ok = maybe_step_control.done() and not maybe_step_control.cancelled() \
            and maybe_step_control.exception() is None
        group_size = len(maybe_step_control.result()) if ok else 0
        self.stats.record_round(ok, time.perf_counter() - started, group_size, self._payload_bytes)
        if not ok:
            logger.warning("averaging round failed; applied local gradients instead")


def bandwidth_hint(upload_kbps: int, download_kbps: int) -> float | None:
    """hivemind's averager ``bandwidth`` (a relative weight: its share of each all-reduce) in Mbit/s.

    A peer that reduces a part both receives and sends it, so the slower direction counts;
    0 means "not given" and leaves hivemind's default (the group's average) in place.
    """
    given = [kbps for kbps in (upload_kbps, download_kbps) if kbps > 0]
    return min(given) / 1000.0 if given else None


def build_optimizer(
    model: torch.nn.Module,
    dht: hivemind.DHT,
    averaging_run_id: str,
    cfg: TrainingSection,
    *,
    client_mode: bool,
    stats: SwarmStats,
    bandwidth: float | None = None,
) -> Any:
    """The swarm optimizer for ``cfg.mode``: hivemind gradient averaging, or the DiLoCo outer loop.

    Both have the same duck-typed surface (``step(batch_size=)``, ``zero_grad()``, ``local_epoch``,
    ``tracker``, ``state_averager``, ``state_dict()``, ``load_state_from_peers()``, ``shutdown()``).
    ``bandwidth`` is this node's :func:`bandwidth_hint` (None: no hint).
    """
    if cfg.mode == "diloco":
        from p2ptrain.diloco import DiLoCoOptimizer  # the gradient path never needs it

        return DiLoCoOptimizer(model.parameters(), dht, averaging_run_id, cfg, client_mode=client_mode,
                               stats=stats, bandwidth=bandwidth)
    # hivemind's matchmaking can deadlock when a request may outlive the matchmaking window (two
    # peers each waiting for the other to answer), so requests get half of it.  hivemind.Optimizer
    # passes averager_opts to its state averager only: the gradient averager gets them through
    # its factory, or it keeps a 3 s request timeout and, with a short window, stops forming groups.
    averager_opts: dict[str, Any] = dict(request_timeout=min(3.0, cfg.matchmaking_time / 2))
    if bandwidth is not None:
        averager_opts["bandwidth"] = bandwidth
    return SwarmOptimizer(
        dht=dht,
        run_id=averaging_run_id,
        params=model.parameters(),
        optimizer=lambda params: ClippedAdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                              max_grad_norm=cfg.max_grad_norm),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
            opt, warmup_cosine(cfg.warmup_epochs, cfg.total_epochs)),
        batch_size_per_step=cfg.batch_size,
        target_batch_size=cfg.target_batch_size,
        matchmaking_time=cfg.matchmaking_time,
        averaging_timeout=cfg.averaging_timeout,
        load_state_timeout=cfg.load_state_timeout,
        client_mode=client_mode,
        # Overlap: averaging and the optimizer step run in the background during the next epoch's
        # compute (one-epoch-stale updates); without it every epoch stalls for a full round.
        delay_grad_averaging=cfg.overlap,
        delay_optimizer_step=cfg.overlap,
        # With averaged gradients the parameters stay identical; state rounds only repair drift.
        average_state_every=cfg.average_state_every,
        grad_compression=make_compression(cfg.grad_compression),
        state_averaging_compression=make_compression(cfg.state_compression),
        load_state_compression=make_compression(cfg.state_compression),
        averager_opts=averager_opts,
        grad_averager_factory=functools.partial(GradientAverager, **averager_opts),
        verbose=False,
        stats=stats,
        load_state_attempts=cfg.load_state_attempts,
        retry_sync_after=max(30.0, cfg.averaging_timeout),
        wire_format=cfg.grad_compression,
    )
