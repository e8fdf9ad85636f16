"""DiLoCo's round clock without a swarm: the round target that grows with the peers reporting
progress, by their speed, the LR schedule position and its O(1) jump."""

from __future__ import annotations

import pytest
import torch
from hivemind.utils import ValueWithExpiration, get_dht_time

from p2ptrain.averaging.progress import SwarmProgressTracker
from p2ptrain.averaging.roundclock import RoundTarget
from p2ptrain.config.schema import ConfigError, parse_config
from p2ptrain.optim.inner import warmup_cosine
from p2ptrain.optim.round_clock import (
    group_round,
    micro_batches_per_inner_step,
    schedule_position,
    set_schedule_position,
)
from p2ptrain.trust.pace import SPREAD, effective_peers, swarm_pace
from tests.support.trackerdht import TrackerDht

PER_PEER = 800  # inner_steps x inner_batch_size


def _tracker() -> SwarmProgressTracker:
    return SwarmProgressTracker(TrackerDht(), "run_x", round_target=RoundTarget(PER_PEER), start=False)  # type: ignore[arg-type]


def _entries(*peers: tuple[float, bool] | None) -> dict[bytes, ValueWithExpiration]:
    """Progress entries: (samples per second, client mode) per peer; None: a withdrawn (paused) entry."""
    now = get_dht_time()
    found = {}
    for i, peer in enumerate(peers):
        value = None if peer is None else {"peer_id": b"p%d" % i, "epoch": 0, "samples_accumulated": 0,
                                           "samples_per_second": peer[0], "time": now, "client_mode": peer[1]}
        found[b"key%d" % i] = ValueWithExpiration(value, now + 60)
    return found


def test_the_round_target_is_the_per_peer_length_times_the_peers_reporting_by_speed() -> None:
    tracker = _tracker()
    assert tracker.target_batch_size == PER_PEER  # alone (nobody reported yet): one peer's round
    progress = tracker._parse_swarm_progress_data(_entries((10.0, False), (2.5, False), (5.0, True)))
    # Three peers, a client-mode one among them (it trains too), at 1, 1/4 and 1/2 of the fastest
    # one's speed: 1.75 peers' worth of samples, so the fastest makes about inner_steps steps.
    assert tracker.target_batch_size == progress.target_batch_size == 1.75 * PER_PEER
    assert progress.num_peers == 3
    tracker._parse_swarm_progress_data(_entries((10.0, False), (10.0, False), (9.5, True)))
    assert tracker.target_batch_size == round(2.95 * PER_PEER)  # equal peers: the classic fixed H


def test_effective_peers_count_unmeasured_peers_whole_and_bound_a_boastful_one() -> None:
    assert effective_peers([]) == 1.0 and effective_peers([0.0, 0.0]) == 2.0
    assert effective_peers([20.0, 0.0, float("nan")]) == 3.0  # not measured yet: a whole peer each
    assert effective_peers([20.0, 5.0]) == 1.25
    assert effective_peers([1.0]) == effective_peers([0.1]) == 1.0
    # A peer claiming to be a million times faster than two honest ones: they count 1/SPREAD each
    # (the pace is at most SPREAD x the lower median rate), so rounds shrink by that factor at most.
    assert effective_peers([10.0, 10.0, 1e7]) == pytest.approx(1 + 2 / SPREAD)
    assert effective_peers([10.0, 1e7]) == pytest.approx(1 + 1 / SPREAD)


def test_the_pace_is_the_fastest_measured_rate_bounded_by_the_lower_median_and_kept_by_the_tracker() -> None:
    assert swarm_pace([]) == swarm_pace([0.0, float("nan")]) == 0.0
    assert swarm_pace([20.0, 5.0, 0.0]) == 20.0
    assert swarm_pace([10.0, 10.0, 1e7]) == SPREAD * 10.0
    tracker = _tracker()
    tracker._parse_swarm_progress_data(_entries((10.0, False), (2.5, False)))
    assert tracker.pace == 10.0


def test_inner_steps_shrink_with_a_peer_s_share_of_the_pace_to_one_micro_batch() -> None:
    assert micro_batches_per_inner_step(4, 100.0, 100.0) == 4
    assert micro_batches_per_inner_step(4, 96.0, 100.0) == 4  # within 5% of the pace: as configured
    assert micro_batches_per_inner_step(4, 90.0, 100.0) == 4  # rounded up: never more steps than the fastest
    assert micro_batches_per_inner_step(4, 50.0, 100.0) == 2
    assert micro_batches_per_inner_step(4, 25.0, 100.0) == 1
    assert micro_batches_per_inner_step(4, 1.0, 100.0) == 1
    assert micro_batches_per_inner_step(4, 400.0, 100.0) == 4  # faster than a bounded pace
    assert micro_batches_per_inner_step(8, 30.0, 100.0) == 3
    for own, pace in ((0.0, 100.0), (float("nan"), 100.0), (50.0, 0.0), (50.0, float("inf"))):
        assert micro_batches_per_inner_step(4, own, pace) == 4  # a rate not measured: as configured
    assert micro_batches_per_inner_step(1, 10.0, 100.0) == 1


def test_paused_peers_withdrawn_entries_do_not_count_and_the_target_shrinks_back() -> None:
    tracker = _tracker()
    tracker._parse_swarm_progress_data(_entries((10.0, False), (10.0, False), (10.0, False)))
    assert tracker.target_batch_size == 3 * PER_PEER
    tracker._parse_swarm_progress_data(_entries((10.0, False), None, None))
    assert tracker.target_batch_size == PER_PEER
    tracker._parse_swarm_progress_data({})  # nobody left, not even our own entry yet: never a zero target
    assert tracker.target_batch_size == PER_PEER


def test_fast_and_slow_peers_see_one_end_of_round() -> None:
    """The end of round comes from the swarm's totals: 1.25 x 800 samples at 16 + 4 samples/s is 50 s,
    whichever of the two peers computes it, and the time the fast peer alone takes for 800."""
    progress = _tracker()._parse_swarm_progress_data(_entries((16.0, False), (4.0, False)))
    assert progress.eta_next_epoch - get_dht_time() == pytest.approx(1.25 * PER_PEER / 20.0, abs=1.0)
    assert 1.25 * PER_PEER / 20.0 == PER_PEER / 16.0


def _scheduler() -> torch.optim.lr_scheduler.LambdaLR:
    param = torch.nn.Parameter(torch.zeros(1))
    return torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW([param], lr=0.01), warmup_cosine(30, 3000))


def test_a_groups_round_is_the_lower_median_of_the_others_claims() -> None:
    assert group_round({"me": 7, "a": 8}, "me") == 8  # our round-7 control met the swarm's round 8
    assert group_round({"me": 7, "a": 7, "b": 8}, "me") == 7  # one member ahead does not decide it
    assert group_round({"me": 7, "a": 8, "b": 8, "c": 2**40}, "me") == 8  # an absurd claim is not counted
    # Nothing usable from the others: no round (our own entry never counts).
    for gathered in ({"me": 7}, {"me": 7, "a": None}, {"me": 7, "a": True}, {"me": 7, "a": -1}, {"me": 7, "a": "8"}):
        assert group_round(gathered, "me") is None


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


def test_a_new_node_takes_inner_steps_of_several_micro_batches_and_rounds_as_long_as_before() -> None:
    """The default inner batch is 4 micro-batches (32 sequences at the default batch_size 8: 0.96 of
    ideal measured, against 0.86 for one-micro-batch steps), and the default H is 25, so a default
    round is still 800 sequences per peer; a batch_size of 16 keeps its 100 micro-batches too."""
    training = parse_config({"training": {"mode": "diloco"}}, "x").training
    assert (training.inner_steps, training.inner_batch, training.round_sequences) == (25, 32, 800)
    bigger = parse_config({"training": {"mode": "diloco", "batch_size": 16}}, "x").training
    assert (bigger.inner_batch, bigger.round_sequences) == (64, 1600)
    pinned = parse_config({"training": {"inner_steps": 100, "inner_batch_size": 8}}, "x").training
    assert (pinned.inner_batch, pinned.round_sequences) == (8, 800)  # the old behaviour, said explicitly


def test_the_optimizer_accumulates_the_automatic_inner_batch(monkeypatch) -> None:
    """DiLoCo's optimizer steps AdamW once per automatic inner batch and paces its round clock by it."""
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.optim.swarm_stats import SwarmStats

    seen: dict[str, int] = {}

    class Tracker:
        def __init__(self, *args: object, round_target: RoundTarget, **kwargs: object) -> None:
            seen["per_peer"] = round_target.per_peer_samples

    class Averager:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

    monkeypatch.setattr(diloco, "SwarmProgressTracker", Tracker)
    monkeypatch.setattr(diloco, "DiLoCoAverager", Averager)
    training = parse_config({"training": {"mode": "diloco"}}, "x").training
    optimizer = diloco.DiLoCoOptimizer([torch.nn.Parameter(torch.zeros(2))], None, "run", training,
                                       client_mode=False, stats=SwarmStats())
    assert optimizer._accumulate == 4 and seen["per_peer"] == 800
