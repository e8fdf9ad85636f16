"""Retuning a running optimizer for a new manifest version: the schedule goes on from where it is,
the optimizer's state is kept, and every live setting lands."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from p2ptrain.config.schema import TrainingSection
from p2ptrain.optim.inner import ClippedAdamW, warmup_cosine
from p2ptrain.optim.retune import retune
from p2ptrain.run.updates import LIVE_TRAINING


def _trained(steps: int) -> tuple[torch.nn.Linear, ClippedAdamW, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = ClippedAdamW(model.parameters(), lr=1e-3, weight_decay=0.1, max_grad_norm=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(2, 100))
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def test_new_lr_and_schedule_continue_from_the_current_step():
    model, optimizer, scheduler = _trained(5)
    moments = {k: v.clone() for k, v in optimizer.state[model.weight].items()}
    cfg = TrainingSection(lr=4e-3, weight_decay=0.0, max_grad_norm=0.5, warmup_epochs=0, total_epochs=50)
    factor = warmup_cosine(cfg.warmup_epochs, cfg.total_epochs)
    retune(optimizer, scheduler, cfg, factor)
    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(4e-3 * factor(5)) and scheduler.get_last_lr() == [group["lr"]]
    assert group["weight_decay"] == 0.0 and optimizer.max_grad_norm == 0.5
    assert all(torch.equal(v, optimizer.state[model.weight][k]) for k, v in moments.items())  # Adam state kept
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(4e-3 * factor(6))


def test_without_a_schedule_the_lr_is_set_as_it_is():
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    retune(optimizer, None, TrainingSection(lr=0.02, weight_decay=0.01), lambda step: 1.0)
    assert optimizer.param_groups[0]["lr"] == 0.02 and optimizer.param_groups[0]["weight_decay"] == 0.01


def _running_gradient_optimizer(cfg: TrainingSection) -> SimpleNamespace:
    """What ``GradientOptimizer.apply_training`` touches on a running hivemind optimizer: the state
    averager's torch optimizer and scheduler (in the node's process) and the progress tracker."""
    _, optimizer, _ = _trained(3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.warmup_epochs, cfg.total_epochs))
    return SimpleNamespace(state_averager=SimpleNamespace(optimizer=optimizer, scheduler=scheduler),
                           tracker=SimpleNamespace(target_batch_size=cfg.target_batch_size),
                           target_batch_size=cfg.target_batch_size, average_state_every=cfg.average_state_every)


#: Every live field, a new value for it, and what of the running optimizer it must change. hivemind
#: reads these at each step (Optimizer.average_state_every and ProgressTracker.target_batch_size are
#: plain attributes of objects in the node's process), so setting them is taking effect.
LIVE_EFFECTS: dict[str, tuple[Any, Callable[[SimpleNamespace], Any]]] = {
    "lr": (2e-2, lambda o: o.state_averager.optimizer.param_groups[0]["lr"]),
    "weight_decay": (0.5, lambda o: o.state_averager.optimizer.param_groups[0]["weight_decay"]),
    "max_grad_norm": (0.25, lambda o: o.state_averager.optimizer.max_grad_norm),
    "warmup_epochs": (0, lambda o: o.state_averager.scheduler.lr_lambdas[0](1)),
    "total_epochs": (20, lambda o: o.state_averager.scheduler.lr_lambdas[0](15)),
    "target_batch_size": (999, lambda o: (o.target_batch_size, o.tracker.target_batch_size)),
    "average_state_every": (7, lambda o: o.average_state_every),
}


@pytest.mark.parametrize("name", sorted(LIVE_EFFECTS))
def test_every_live_field_takes_effect_on_a_running_gradient_optimizer(name):
    from p2ptrain.optim.gradient import GradientOptimizer

    cfg = TrainingSection(warmup_epochs=5, total_epochs=100)
    running = _running_gradient_optimizer(cfg)
    value, probe = LIVE_EFFECTS[name]
    before = probe(running)
    GradientOptimizer.apply_training(running, cfg.model_copy(update={name: value}))  # type: ignore[arg-type]
    assert probe(running) != before


def test_no_field_is_called_live_without_a_check_that_it_takes_effect():
    assert LIVE_TRAINING - {"seed"} == set(LIVE_EFFECTS)  # seed shapes only a model's initialisation
