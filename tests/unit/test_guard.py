"""ParameterGuard: a non-finite result of averaging is rolled back to the last good state; the fault switch."""

from __future__ import annotations

import math

import torch

from p2ptrain.daemon.faults import gradient_fault
from p2ptrain.guard import ParameterGuard


class _Averager:
    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer


class _SwarmOptimizer:
    """The shape hivemind's Optimizer has: a torch optimizer inside ``state_averager``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.state_averager = _Averager(torch.optim.AdamW(model.parameters(), lr=0.1))


def _step(model: torch.nn.Module, optimizer: _SwarmOptimizer, poison: bool = False) -> None:
    model(torch.ones(2, 3)).sum().backward()
    if poison:
        for p in model.parameters():
            p.grad.fill_(math.nan)
    optimizer.state_averager.optimizer.step()
    optimizer.state_averager.optimizer.zero_grad()


def test_rollback_restores_parameters_and_optimizer_state_but_not_the_epoch():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = _SwarmOptimizer(model)
    guard = ParameterGuard(model, optimizer, check_every=1e9)
    _step(model, optimizer)
    assert not guard.after_step(1)
    good = [p.detach().clone() for p in model.parameters()]
    inner = optimizer.state_averager.optimizer
    good_avg = [inner.state[p]["exp_avg"].clone() for p in model.parameters()]
    _step(model, optimizer, poison=True)
    assert not all(torch.isfinite(p).all() for p in model.parameters())
    assert guard.after_step(2)
    assert guard.rollbacks == 1
    for p, g, avg in zip(model.parameters(), good, good_avg, strict=True):
        assert torch.equal(p.detach(), g)
        assert torch.equal(inner.state[p]["exp_avg"], avg)
    # Training goes on from the restored state, and the next good epoch becomes the new copy.
    _step(model, optimizer)
    assert not guard.after_step(3)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_checks_are_rate_limited_within_an_epoch_but_never_across_epochs():
    now = [0.0]
    model = torch.nn.Linear(3, 2)
    guard = ParameterGuard(model, _SwarmOptimizer(model), check_every=10.0, clock=lambda: now[0])
    assert not guard.after_step(1)
    with torch.no_grad():
        model.weight.fill_(math.inf)
    assert not guard.after_step(1)  # same epoch, not due yet
    now[0] = 11.0
    assert guard.after_step(1)
    with torch.no_grad():
        model.weight.fill_(math.nan)
    assert guard.after_step(2)  # a new epoch is always checked
    assert guard.rollbacks == 2


def test_poison_before_any_good_state_zeroes_non_finite_values():
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    guard = ParameterGuard(model, object())
    assert guard.after_step(0)
    assert torch.isfinite(model.weight).all() and model.weight[0, 0] == 0


def test_fault_switch_is_off_unless_asked_and_makes_huge_finite_gradients():
    assert gradient_fault({}) is None
    assert gradient_fault({"P2PTRAIN_TEST_FAULTS": "no_such_fault"}) is None
    hook = gradient_fault({"P2PTRAIN_TEST_FAULTS": " nonfinite_grads "})
    assert hook is not None
    model = torch.nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()
    hook(model)
    grad = model.weight.grad
    # Finite (so the sender's own check lets it through) but overflowing once accumulated or sent as fp16.
    assert torch.isfinite(grad).all()
    assert not torch.isfinite(grad * 8).all() and not torch.isfinite(grad.half()).all()
