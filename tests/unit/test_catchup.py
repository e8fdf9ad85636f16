"""The learning-rate schedule catches up in O(1), and the swarm epoch needs agreement, not one loud peer."""

from __future__ import annotations

import time

import pytest
import torch

from p2ptrain.averaging.robust_progress import robust_global_epoch
from p2ptrain.averaging.state_download import catch_up_scheduler
from p2ptrain.optim.inner import warmup_cosine
from p2ptrain.trust.verdicts import MAX_EPOCH


def _opt() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def _hivemind_loop(scheduler, epoch: int) -> None:
    """What hivemind 1.1.12's TrainingStateAverager._update_scheduler does."""
    while scheduler._step_count <= epoch:
        scheduler.step()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("make", [
    lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(10, 500)),
    lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5),
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50),
])
@pytest.mark.parametrize("epoch", [0, 1, 9, 10, 137])
def test_catch_up_lands_where_hivemind_loop_lands(make, epoch):
    ours, theirs = make(_opt()), make(_opt())
    catch_up_scheduler(ours, epoch)
    _hivemind_loop(theirs, epoch)
    assert ours.last_epoch == theirs.last_epoch and ours._step_count == theirs._step_count
    assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr())
    assert ours.optimizer.param_groups[0]["lr"] == pytest.approx(theirs.optimizer.param_groups[0]["lr"])


def test_a_huge_epoch_is_instant_and_never_goes_backwards():
    scheduler = torch.optim.lr_scheduler.LambdaLR(_opt(), warmup_cosine(10, 500))
    started = time.perf_counter()
    catch_up_scheduler(scheduler, 2**40)
    assert time.perf_counter() - started < 0.1
    assert scheduler.last_epoch == MAX_EPOCH  # clamped to the largest believable epoch
    catch_up_scheduler(scheduler, 5)
    assert scheduler.last_epoch == MAX_EPOCH
    catch_up_scheduler(None, 10)  # no scheduler: nothing to do


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_scheduler_without_closed_form_is_stepped_a_bounded_number_of_times(caplog):
    scheduler = torch.optim.lr_scheduler.MultiplicativeLR(_opt(), lambda e: 0.99)
    catch_up_scheduler(scheduler, 50, max_steps=20)
    assert scheduler._step_count == 21
    assert "is 50 epochs behind; caught up 20 of them this time" in caplog.text
    catch_up_scheduler(scheduler, 50, max_steps=100)
    assert scheduler.last_epoch == 50


@pytest.mark.parametrize(("own", "others", "expected"), [
    (10, [10, 11, 2**40], 11),          # one liar among agreeing peers moves nothing
    (10, [10, 5000], 10),               # a peer agreeing with us outweighs one far ahead
    (0, [40, 41, 5000], 41),            # a newcomer follows the agreeing peers
    (0, [40, 5000], 40),                # no agreement: the modest claim
    (13, [10, 5000], 13),               # a lagging honest peer and a liar: the liar is not followed
    (0, [40], 40),                      # a run of one: followed
    (0, [2**40], 0),                    # out of range: ignored
    (7, [], 7),
    (50, [40, 41], 50),                 # never below our own
    (0, [5000, 5001], 5001),            # two agreeing liars win (a Sybil crowd is out of scope)
])
def test_robust_global_epoch(own, others, expected):
    assert robust_global_epoch(own, others) == expected


def test_quorum_can_be_raised_and_unsupported_claims_ignored():
    assert robust_global_epoch(0, [40, 41, 90], quorum=3) == 41
    assert robust_global_epoch(0, [40], unsupported=False) == 0
    assert robust_global_epoch(0, [40, 41], unsupported=False) == 41
