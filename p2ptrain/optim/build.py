"""Builds the swarm optimizer from config: gradient averaging or DiLoCo.

Both optimizers implement :class:`p2ptrain.optim.protocol.SwarmOptimizer`; this module picks one
from ``training.mode`` and turns the config's link speeds into hivemind's bandwidth hint.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from p2ptrain.averaging.compression import make_compression
from p2ptrain.averaging.handles import DHT
from p2ptrain.config.schema import TrainingSection
from p2ptrain.optim.inner import ClippedAdamW, warmup_cosine
from p2ptrain.optim.protocol import SwarmOptimizer
from p2ptrain.optim.swarm_stats import SwarmStats


def bandwidth_hint(upload_kbps: int, download_kbps: int) -> float | None:
    """hivemind's averager ``bandwidth`` (a relative weight: its share of each all-reduce) in Mbit/s.

    A peer that reduces a part both receives and sends it, so the slower direction counts;
    0 means "not given" and leaves hivemind's default (the group's average) in place.
    """
    given = [kbps for kbps in (upload_kbps, download_kbps) if kbps > 0]
    return min(given) / 1000.0 if given else None


def build_optimizer(
    model: torch.nn.Module,
    dht: DHT,
    averaging_run_id: str,
    cfg: TrainingSection,
    *,
    client_mode: bool,
    stats: SwarmStats,
    bandwidth: float | None = None,
    admission: Any = None,
    defences: Any = None,
    evaluate: Callable[[], float] | None = None,
    wait: Callable[[float], object] = time.sleep,
) -> SwarmOptimizer:
    """The swarm optimizer for ``cfg.mode``: hivemind gradient averaging, or the DiLoCo outer loop.

    ``bandwidth`` is this node's :func:`bandwidth_hint` (None: no hint); ``admission`` an owned
    run's :class:`~p2ptrain.trust.admission.AdmissionGate` (None: averagers take part with any peer);
    ``defences`` the node's :class:`~p2ptrain.optim.defences.Defences` (None: plain hivemind, trusting
    every peer); ``evaluate`` the node's validation pass, which the state download uses to look at a
    donor's model before adopting it; ``wait`` the node's stop event's wait, for pauses between
    state-download attempts.
    """
    if cfg.mode == "diloco":
        from p2ptrain.optim.diloco import DiLoCoOptimizer  # the gradient path never needs it

        return DiLoCoOptimizer(model.parameters(), dht, averaging_run_id, cfg, client_mode=client_mode,
                               stats=stats, bandwidth=bandwidth, admission=admission, defences=defences,
                               evaluate=evaluate, wait=wait)
    # hivemind's matchmaking can deadlock when a request may outlive the matchmaking window (two
    # peers each waiting for the other to answer), so requests get half of it.  hivemind.Optimizer
    # passes averager_opts to its state averager only: the gradient averager gets them through
    # its factory, or it keeps a 3 s request timeout and, with a short window, stops forming groups.
    averager_opts: dict[str, Any] = dict(request_timeout=min(3.0, cfg.matchmaking_time / 2))
    if bandwidth is not None:
        averager_opts["bandwidth"] = bandwidth
    from p2ptrain.averaging.robust_reduce import RoundReports
    from p2ptrain.optim.gradient import GradientOptimizer  # it imports this module's helpers

    # Every round reports how much it really averaged, checks on or off (the queue is shared with the
    # averager's process: made before it forks).
    rounds = defences.rounds if defences is not None else RoundReports()
    from p2ptrain.averaging.hardened import HardenedGradientAverager

    checks: dict[str, Any] = dict(peer_checks=False)
    if defences is not None:
        from p2ptrain.averaging.robust_reduce import ReduceRule

        checks = dict(gate=defences.gate, reduce_rule=ReduceRule.for_gradients(max_weight=cfg.target_batch_size))
    grad_averager = functools.partial(HardenedGradientAverager, round_reports=rounds, **checks)

    return GradientOptimizer(
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
        grad_averager_factory=_with_options(grad_averager, averager_opts),
        verbose=False,
        stats=stats,
        admission=admission,
        load_state_attempts=cfg.load_state_attempts,
        retry_sync_after=max(30.0, cfg.averaging_timeout),
        wire_format=cfg.grad_compression,
        defences=defences,
        evaluate=evaluate,
        wait=wait,
        round_reports=rounds,
    )


def _with_options(factory: Any, options: dict[str, Any]) -> functools.partial[Any]:
    """``factory`` (a class, or a partial of one) with ``options`` added, still a partial of the class."""
    if isinstance(factory, functools.partial):
        return functools.partial(factory.func, *factory.args, **{**factory.keywords, **options})
    return functools.partial(factory, **options)
