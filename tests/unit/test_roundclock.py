"""DiLoCo's round clock pieces that need no swarm: the LR schedule position and its O(1) jump."""

from __future__ import annotations

import pytest
import torch

from p2ptrain.config import ConfigError, parse_config
from p2ptrain.optim import warmup_cosine
from p2ptrain.roundclock import schedule_position, set_schedule_position


def _scheduler() -> torch.optim.lr_scheduler.LambdaLR:
    param = torch.nn.Parameter(torch.zeros(1))
    return torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW([param], lr=0.01), warmup_cosine(30, 3000))


def test_jumping_matches_stepping() -> None:
    stepped, jumped = _scheduler(), _scheduler()
    for _ in range(137):
        stepped.step()
    set_schedule_position(jumped, 137)
    assert jumped.get_last_lr() == pytest.approx(stepped.get_last_lr())
    assert jumped.optimizer.param_groups[0]["lr"] == pytest.approx(stepped.optimizer.param_groups[0]["lr"])
    jumped.step(), stepped.step()  # and both go on from there alike
    assert jumped.get_last_lr() == pytest.approx(stepped.get_last_lr())


def test_a_huge_position_is_instant() -> None:
    scheduler = _scheduler()
    set_schedule_position(scheduler, 2**40)  # a loop of scheduler.step() would never end
    assert scheduler.get_last_lr() == pytest.approx([0.001])  # the cosine floor (0.1 x lr)


def test_fast_and_slow_peers_share_the_schedule_curve() -> None:
    # Round 3 of H=100: a slow peer at its 10th step, a fast one at its 250th.
    assert schedule_position(3, 10, 100) == 310
    assert schedule_position(3, 250, 100) == 399  # capped at the round's last position
    assert schedule_position(4, 0, 100) == 400


def test_inner_batch_must_be_whole_micro_batches() -> None:
    assert parse_config({"training": {"batch_size": 8, "inner_batch_size": 32}}, "x").training.inner_batch_size == 32
    with pytest.raises(ConfigError, match=r"inner_batch_size \(12\) must be a multiple of batch_size \(8\)"):
        parse_config({"training": {"batch_size": 8, "inner_batch_size": 12}}, "x")
