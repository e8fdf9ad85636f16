"""NonFiniteRollback: a non-finite result of averaging is rolled back to the last good state; the fault switch."""

from __future__ import annotations

import math

import torch

from p2ptrain.daemon.faults import ENV_VAR, with_faults
from p2ptrain.optim.protocol import GuardTargets
from p2ptrain.optim.rollback import NonFiniteRollback
from p2ptrain.tasks.base import Task


def _targets(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> GuardTargets:
    return GuardTargets(tensors=list(model.parameters()), optimizers=[optimizer] if optimizer is not None else [])


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, poison: bool = False) -> None:
    model(torch.ones(2, 3)).sum().backward()
    if poison:
        for p in model.parameters():
            p.grad.fill_(math.nan)
    optimizer.step()
    optimizer.zero_grad()


def test_rollback_restores_parameters_and_optimizer_state_but_not_the_epoch():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    guard = NonFiniteRollback(_targets(model, optimizer), check_every=1e9)
    _step(model, optimizer)
    assert not guard.after_step(1)
    good = [p.detach().clone() for p in model.parameters()]
    inner = optimizer
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
    guard = NonFiniteRollback(_targets(model), check_every=10.0, clock=lambda: now[0])
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
    guard = NonFiniteRollback(_targets(model))
    assert guard.after_step(0)
    assert torch.isfinite(model.weight).all() and model.weight[0, 0] == 0


def test_rollback_covers_every_watched_tensor_and_optimizer():
    """DiLoCo's outer parameters and outer momentum are rolled back with the model."""
    model, outer = torch.nn.Linear(3, 2), [torch.zeros(2, 3)]
    inner_opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    outer_opt = torch.optim.SGD(outer, lr=0.1, momentum=0.9)
    guard = NonFiniteRollback(GuardTargets([*model.parameters(), *outer], [inner_opt, outer_opt]), check_every=1e9)
    outer[0].grad = torch.ones(2, 3)
    outer_opt.step()
    assert not guard.after_step(1)
    good_outer, good_momentum = outer[0].clone(), outer_opt.state[outer[0]]["momentum_buffer"].clone()
    outer[0].grad = torch.full((2, 3), math.nan)
    outer_opt.step()
    assert guard.after_step(2)
    assert torch.equal(outer[0], good_outer)
    assert torch.equal(outer_opt.state[outer[0]]["momentum_buffer"], good_momentum)


def _linear_task() -> Task:
    model = torch.nn.Linear(3, 2)
    return Task(model=model, loss_fn=lambda m, batch: m(batch).pow(2).mean(), train_batches=None,  # type: ignore[arg-type]
                validation_batches=list, shape_config={})


def test_fault_switch_is_off_unless_asked():
    task = _linear_task()
    assert with_faults(task, {}) is task
    assert with_faults(task, {ENV_VAR: "no_such_fault"}) is task


def test_nonfinite_grads_fault_keeps_the_loss_and_makes_huge_finite_gradients():
    task = _linear_task()
    faulty = with_faults(task, {ENV_VAR: " nonfinite_grads "})
    batch = torch.ones(1, 3)
    honest_loss = task.loss_fn(task.model, batch).item()
    loss = faulty.loss_fn(faulty.model, batch)
    assert loss.item() == honest_loss
    loss.backward()
    grad = faulty.model.weight.grad
    # Finite (so the sender's own check lets it through) but overflowing once accumulated or sent as fp16.
    assert torch.isfinite(grad).all()
    assert not torch.isfinite(grad * 2).all() and not torch.isfinite(grad.half()).all()
