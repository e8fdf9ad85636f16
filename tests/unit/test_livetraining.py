"""Retuning a running optimizer for a new manifest version: the schedule goes on from where it is,
the optimizer's state is kept, and every live setting lands."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.config import TrainingSection
from p2ptrain.livetraining import retune
from p2ptrain.optim import ClippedAdamW, warmup_cosine


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
