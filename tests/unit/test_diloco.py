"""DiLoCo: the outer step's math against hand-computed numbers (averaging done by an in-process fake)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from p2ptrain.optim.outer_step import OuterStep

torch.set_num_threads(1)


def fake_all_reduce(*peer_grads: list[torch.Tensor], weights: list[float]) -> list[torch.Tensor]:
    """What the swarm's weighted all-reduce returns, computed in-process."""
    total = sum(weights)
    return [sum(w * g[i] for w, g in zip(weights, peer_grads, strict=True)) / total
            for i in range(len(peer_grads[0]))]


def test_pseudo_gradient_is_start_minus_current() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    outer = OuterStep([param], lr=0.7, momentum=0.9, nesterov=True)
    with torch.no_grad():
        param.sub_(torch.tensor([0.5, -1.0]))  # what the inner steps did
    (grad,) = outer.pseudo_gradients([param])
    assert torch.allclose(grad, torch.tensor([0.5, -1.0]))


def test_two_outer_rounds_match_hand_computed_nesterov() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    outer = OuterStep([param], lr=0.7, momentum=0.9, nesterov=True)

    # Round 1: we moved to [0.8, -1.6]; the other peer's delta is [0.4, -0.2] with twice our samples.
    with torch.no_grad():
        param.copy_(torch.tensor([0.8, -1.6]))
    ours = outer.pseudo_gradients([param])  # [0.2, -0.4]
    averaged = fake_all_reduce(ours, [torch.tensor([0.4, -0.2])], weights=[1.0, 2.0])
    # g1 = (0.2 + 2*0.4)/3, (-0.4 + 2*-0.2)/3 = [1/3, -0.8/3]; buf1 = g1; step = g1 + 0.9*buf1 = 1.9*g1
    g1 = torch.tensor([1 / 3, -0.8 / 3])
    assert torch.allclose(averaged[0], g1)
    outer.apply(averaged, [param])
    expected1 = torch.tensor([1.0, -2.0]) - 0.7 * 1.9 * g1
    assert torch.allclose(param.detach(), expected1, atol=1e-6)
    assert torch.allclose(outer.params[0], expected1, atol=1e-6)

    # Round 2, alone: the local delta is the pseudo-gradient; buf2 = 0.9*buf1 + g2; step = g2 + 0.9*buf2.
    with torch.no_grad():
        param.sub_(torch.tensor([0.1, 0.1]))
    g2 = torch.tensor([0.1, 0.1])
    outer.apply(outer.pseudo_gradients([param]), [param])
    buf2 = 0.9 * g1 + g2
    expected2 = expected1 - 0.7 * (g2 + 0.9 * buf2)
    assert torch.allclose(param.detach(), expected2, atol=1e-6)
    assert torch.allclose(outer.momentum_buffers()[0], buf2, atol=1e-6)


def test_plain_sgd_without_momentum_is_lr_times_delta() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    outer = OuterStep([param], lr=1.0, momentum=0.0, nesterov=True)
    with torch.no_grad():
        param.add_(torch.tensor([1.0, 2.0, 3.0]))
    outer.apply(outer.pseudo_gradients([param]), [param])
    assert torch.allclose(param.detach(), torch.tensor([1.0, 2.0, 3.0]))  # lr 1, no momentum: keep local


def test_overlapped_round_keeps_local_progress_made_meanwhile() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    outer = OuterStep([param], lr=1.0, momentum=0.0, nesterov=False)
    with torch.no_grad():
        param.copy_(torch.tensor([0.5, 0.0]))  # round k's inner steps
    pseudo = outer.pseudo_gradients([param])  # [0.5, 1.0], sent to the swarm
    snapshot = param.detach().clone()
    with torch.no_grad():
        param.add_(torch.tensor([-0.25, 0.5]))  # round k+1's first steps, while round k averages
    averaged = [torch.tensor([0.75, 0.5])]  # what the swarm agreed on
    outer.apply(averaged, [param], carry=[param.detach() - snapshot])
    # New outer params = start - averaged; the steps taken meanwhile stay on top of them.
    assert torch.allclose(outer.params[0], torch.tensor([0.25, 0.5]))
    assert torch.allclose(param.detach(), torch.tensor([0.0, 1.0]))
    # The next pseudo-gradient counts those steps exactly once.
    assert torch.allclose(outer.pseudo_gradients([param])[0], torch.tensor([0.25, -0.5]))
    assert pseudo[0].tolist() == [0.5, 1.0]


class _NoSwarm:
    """Stands in for the round tracker and the averager: a swarm of one, never at the end of a round."""

    client_mode = False
    state_sharing_priority = 0.0
    global_epoch = 0
    ready_to_update_epoch = False
    global_progress = SimpleNamespace(num_peers=1, samples_accumulated=0)
    estimated_next_update_time = float("inf")
    pace = 0.0  # no rate measured yet: inner steps of the configured size
    performance_ema = SimpleNamespace(samples_per_second=0.0)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def report_local_progress(self, *args: object) -> None:
        pass

    def pause_updates(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def update_epoch(self, epoch: int) -> None:
        pass


def test_a_nonfinite_micro_batch_anywhere_in_an_inner_batch_is_dropped_alone(monkeypatch) -> None:
    """The trainer drops a micro-batch with NaN gradients by calling zero_grad; in the middle of an inner
    batch (inner_batch_size > batch_size) that must drop it and keep the micro-batches before it."""
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats

    monkeypatch.setattr(diloco, "SwarmProgressTracker", _NoSwarm)
    monkeypatch.setattr(diloco, "DiLoCoAverager", _NoSwarm)
    param = torch.nn.Parameter(torch.zeros(3))
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_batch_size=16, inner_steps=10, lr=0.1, warmup_epochs=0)
    optimizer = diloco.DiLoCoOptimizer([param], None, "run", cfg, client_mode=False, stats=SwarmStats())
    seen: list[torch.Tensor] = []
    inner_step = optimizer.inner.step
    monkeypatch.setattr(optimizer.inner, "step", lambda: (seen.append(param.grad.clone()), inner_step())[1])

    def micro_batch(grad: float, dropped: bool = False) -> None:  # what Trainer.step does with the optimizer
        param.grad = torch.full((3,), grad)
        if dropped:
            optimizer.zero_grad()
            return
        optimizer.step(batch_size=8)
        optimizer.zero_grad()

    micro_batch(1.0)
    micro_batch(math.nan, dropped=True)  # second in its inner batch
    micro_batch(3.0)
    micro_batch(math.inf, dropped=True)  # first in the next one
    micro_batch(5.0)
    micro_batch(7.0)
    assert [g.tolist() for g in seen] == [[2.0] * 3, [6.0] * 3]  # the means of the accepted micro-batches
    assert torch.isfinite(param).all() and optimizer.inner_step == 2


class _TwoPeerClock(_NoSwarm):
    """A round tracker that sees two peers and a round ending within the matchmaking time, but whose
    own reading of the clock never says the round is over (as a peer whose view lags the other's)."""

    global_progress = SimpleNamespace(num_peers=2, samples_accumulated=0)

    @property
    def estimated_next_update_time(self) -> float:
        from hivemind.utils import get_dht_time

        return get_dht_time() + 0.1


class _Control:
    """hivemind's StepControl as the optimizer uses it: a stage, a weight, a trigger."""

    def __init__(self) -> None:
        from hivemind.averaging.control import AveragingStage

        self.stage, self.weight, self.triggered = AveragingStage.LOOKING_FOR_GROUP, 0.0, False

    def allow_allreduce(self) -> None:
        self.triggered = True

    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


class _Averager(_NoSwarm):
    """Schedules rounds and hands out their controls; holds the tensors to average."""

    def __init__(self, tensors: list[torch.Tensor], *args: object, **kwargs: object) -> None:
        self.tensors, self.controls = tensors, []

    def step(self, **kwargs: object) -> _Control:
        self.controls.append(_Control())
        return self.controls[-1]

    def get_tensors(self) -> contextlib.AbstractContextManager[list[torch.Tensor]]:
        return contextlib.nullcontext(self.tensors)


def _two_peer_optimizer(monkeypatch, inner_batch_size: int = 8) -> tuple[Any, list[_Averager], Callable[[], None]]:
    """A DiLoCo optimizer on a two-peer clock (:class:`_TwoPeerClock`) and fake averagers (the list
    collects them), and one micro-batch of it (8 samples; one inner step with the default inner batch)."""
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats

    monkeypatch.setattr(diloco, "SwarmProgressTracker", _TwoPeerClock)
    averagers: list[_Averager] = []

    def make_averager(*args: object, **kwargs: object) -> _Averager:
        averagers.append(_Averager(*args, **kwargs))
        return averagers[-1]

    monkeypatch.setattr(diloco, "DiLoCoAverager", make_averager)
    param = torch.nn.Parameter(torch.zeros(3))
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_batch_size=inner_batch_size, inner_steps=10, lr=0.1,
                          warmup_epochs=0, matchmaking_time=5.0)
    optimizer = diloco.DiLoCoOptimizer([param], None, "run", cfg, client_mode=False, stats=SwarmStats())

    def micro_batch() -> None:
        param.grad = torch.ones(3)
        optimizer.step(batch_size=8)
        optimizer.zero_grad()

    return optimizer, averagers, micro_batch


def test_a_peer_at_a_quarter_of_the_swarm_s_pace_steps_every_micro_batch_and_a_fast_one_every_four(
        monkeypatch, caplog) -> None:
    """A slower peer trains fewer samples a round; in smaller inner steps it still makes about as many of
    them as the fastest peer.  The size follows the measured rates, and changes only between inner steps."""
    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch, inner_batch_size=32)
    tracker = optimizer._tracker
    tracker.pace, tracker.performance_ema = 100.0, SimpleNamespace(samples_per_second=97.0)
    for _ in range(4):
        micro_batch()
    assert optimizer.inner_step == 1  # near the pace: the configured four micro-batches
    tracker.performance_ema.samples_per_second = 25.0
    with caplog.at_level(logging.DEBUG, logger="p2ptrain.optim.diloco"):
        for _ in range(3):
            micro_batch()
    assert optimizer.inner_step == 4  # a step per micro-batch
    said = [r for r in caplog.records if "inner steps of 8 sequences (32 configured)" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "25% of the swarm's pace" in said[0].getMessage()
    tracker.performance_ema.samples_per_second = 50.0
    micro_batch()
    assert optimizer.inner_step == 4 and optimizer._micro.per_step == 2
    tracker.performance_ema.samples_per_second = 25.0
    micro_batch()  # an inner batch under way keeps its size
    assert optimizer.inner_step == 5 and optimizer._micro.per_step == 2
    micro_batch()
    assert optimizer.inner_step == 6 and optimizer._micro.per_step == 1


def test_a_peer_ends_its_round_when_its_group_has_assembled_whatever_its_clock_says(monkeypatch) -> None:
    """Peers read the round clock from their own views of the DHT, seconds apart; the all-reduce drops a
    member later than its sender timeout.  Once the group for the round has assembled, every member ends
    its round at that moment instead."""
    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch)
    micro_batch()
    [control] = averagers[0].controls  # matchmaking for the round has started
    for _ in range(3):  # still looking for the group: the round goes on
        micro_batch()
    assert not control.triggered and optimizer.local_epoch == 0
    control.stage = AveragingStage.AWAITING_TRIGGER  # the group has assembled
    micro_batch()
    assert control.triggered and control.weight == 5 * 8  # ended now, weighted by this round's samples
    assert optimizer.local_epoch == 1 and optimizer.inner_step == 0


def test_a_round_ends_on_the_micro_batch_its_group_assembles_cutting_the_inner_batch_short(monkeypatch) -> None:
    """A peer at a quarter of a core takes most of a second for an inner step of four micro-batches; the
    group's other members wait for its part, so its round ends at the next micro-batch, with an inner
    step on the micro-batches it has, and the swarm's new model is applied at the first micro-batch
    after the round lands."""
    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch, inner_batch_size=32)
    for _ in range(4):  # the first inner step: matchmaking for the round starts
        micro_batch()
    [control] = averagers[0].controls
    micro_batch()
    assert not control.triggered and optimizer.inner_step == 1  # one micro-batch of the next inner batch in
    control.stage = AveragingStage.AWAITING_TRIGGER
    micro_batch()
    assert control.triggered and control.weight == 6 * 8 and optimizer.local_epoch == 1
    assert optimizer.inner_step == 0 and optimizer._micro.count == 0  # the two micro-batches were stepped on
    micro_batch()  # the round in flight has not landed: nothing to apply
    assert not optimizer.round_settled.is_set()
    monkeypatch.setattr(control, "done", lambda: True)
    monkeypatch.setattr(control, "result", lambda timeout=None: {None: 0, "peer-b": 0}, raising=False)
    micro_batch()  # the second micro-batch of four: applied now
    assert optimizer.round_settled.is_set() and optimizer._micro.count == 2


@pytest.mark.parametrize(("their_round", "then_at"), [(1, 2), (0, 1)])
def test_a_round_that_averaged_with_the_swarms_next_round_moves_the_peer_to_the_swarms_round(
        monkeypatch, their_round: int, then_at: int) -> None:
    """A peer whose view lagged ended its round 0 after the swarm had moved on: its control met the
    swarm's round 1.  When it lands, the peer counts the round it is in as the swarm does (2), so its
    next control meets the swarm's round 2, not 3 (one round apart for good, each landing a round late)."""
    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch)
    micro_batch()
    [control] = averagers[0].controls
    control.stage = AveragingStage.AWAITING_TRIGGER
    micro_batch()  # round 0 ends: its all-reduce runs while round 1 trains
    assert control.triggered and optimizer.local_epoch == 1
    # It lands: each member's round as it sent it (the fake node has no DHT: its own entry is under None).
    monkeypatch.setattr(control, "done", lambda: True)
    monkeypatch.setattr(control, "result", lambda timeout=None: {None: 0, "peer-b": their_round}, raising=False)
    micro_batch()
    assert optimizer.local_epoch == then_at


def test_a_peer_one_round_behind_when_its_last_round_lands_ends_its_round_with_the_swarm(monkeypatch) -> None:
    """The swarm has ended round 1 and waits for this peer's part of it when the peer's round 0 lands:
    the peer ends round 1 now (its control joins the swarm's group), instead of skipping to round 2 and
    leaving the swarm's round 1 without it (each peer then met the other's next round, turn by turn)."""
    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch)
    micro_batch()
    averagers[0].controls[0].stage = AveragingStage.AWAITING_TRIGGER
    micro_batch()  # round 0 ends; its all-reduce runs while round 1 trains
    micro_batch()  # matchmaking for round 1 starts
    first, second = averagers[0].controls
    optimizer._tracker.global_epoch, optimizer._tracker.ready_to_update_epoch = 2, True  # the swarm ended round 1
    monkeypatch.setattr(first, "done", lambda: True)
    monkeypatch.setattr(first, "result", lambda timeout=None: {None: 0, "peer-b": 0}, raising=False)
    micro_batch()
    assert not optimizer.round_settled.is_set()  # round 1 is in flight now
    assert second.triggered and optimizer.local_epoch == 2


def test_no_round_is_scheduled_while_the_round_in_flight_still_looks_for_its_group(monkeypatch) -> None:
    """A round the clock ended before its group assembled is still matchmaking; hivemind would queue a second
    step behind it, and that peer's later rounds would each meet the others' next one (seen once in a
    benchmark's equal swarm: every round after it half averaged)."""
    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch)
    micro_batch()
    [first] = averagers[0].controls
    optimizer._tracker.ready_to_update_epoch = True  # the clock ends round 0; its group has not assembled
    micro_batch()
    optimizer._tracker.ready_to_update_epoch = False
    assert first.triggered and optimizer.local_epoch == 1
    micro_batch()
    assert len(averagers[0].controls) == 1  # round 1's matchmaking waits
    first.stage = AveragingStage.RUNNING_ALLREDUCE
    micro_batch()
    assert len(averagers[0].controls) == 2


class _Behind(_Averager):
    """Tracker and averager in one: a swarm of two whose round number is set by the test."""

    global_progress = SimpleNamespace(num_peers=2, samples_accumulated=0)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*(args or ([],)), **kwargs)
        self.global_epoch, self.ready_to_update_epoch, self.epochs_published = 0, False, []

    @property
    def estimated_next_update_time(self) -> float:
        return float("inf")  # matchmaking is never due by the clock: only a round that ends schedules one

    def update_epoch(self, epoch: int) -> None:
        self.epochs_published.append(epoch)


def _behind_optimizer(monkeypatch) -> tuple[object, _Behind, _Behind, list[int], torch.nn.Parameter]:
    """A DiLoCo optimizer on fakes; the list collects the epochs at which it started a state download."""
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats

    made: list[_Behind] = []

    def make(*args: object, **kwargs: object) -> _Behind:
        made.append(_Behind(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(diloco, "SwarmProgressTracker", make)
    monkeypatch.setattr(diloco, "DiLoCoAverager", make)
    param = torch.nn.Parameter(torch.zeros(3))
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_batch_size=8, inner_steps=10, lr=0.1, warmup_epochs=0)
    optimizer = diloco.DiLoCoOptimizer([param], None, "run", cfg, client_mode=False, stats=SwarmStats())
    downloads: list[int] = []
    monkeypatch.setattr(optimizer, "load_state_from_peers", lambda: downloads.append(optimizer.local_epoch) or False)
    tracker, averager = made
    optimizer.restore({"epoch": 3})
    return optimizer, tracker, averager, downloads, param


def test_one_round_behind_joins_the_next_round_without_a_download(monkeypatch) -> None:
    optimizer, tracker, _, downloads, param = _behind_optimizer(monkeypatch)
    before = param.detach().clone()
    tracker.global_epoch = 4
    optimizer._catch_up()
    assert optimizer.local_epoch == 4 and downloads == []
    assert tracker.epochs_published[-1] == 4  # the swarm's progress now counts this node in round 4
    assert torch.equal(param.detach(), before)  # nothing replaced: its own parameters, averaged next round
    assert optimizer.join_next_round(6) is False and optimizer.local_epoch == 4  # two ahead: not joinable


def test_further_behind_downloads_the_state_and_level_or_ahead_does_nothing(monkeypatch) -> None:
    optimizer, tracker, _, downloads, _ = _behind_optimizer(monkeypatch)
    tracker.global_epoch = 6
    optimizer._catch_up()
    assert downloads == [3] and optimizer.local_epoch == 3  # the download (failed here) decides the epoch
    for swarm_round in (3, 2):  # level with the swarm, or a stale view of it behind us
        tracker.global_epoch = swarm_round
        optimizer._catch_up()
    assert downloads == [3] and optimizer.local_epoch == 3


def test_two_rounds_behind_no_round_is_scheduled_or_ended_until_caught_up(monkeypatch) -> None:
    """A round of ours would average with nobody: the step trains on, tries the download, and neither
    schedules matchmaking nor ends a round, even when the round clock says the round is over."""
    optimizer, tracker, averager, downloads, param = _behind_optimizer(monkeypatch)
    tracker.global_epoch, tracker.ready_to_update_epoch = 5, True

    def micro_batch() -> None:
        param.grad = torch.ones(3)
        optimizer.step(batch_size=8)
        optimizer.zero_grad()

    for _ in range(3):
        micro_batch()
    assert averager.controls == [] and optimizer.local_epoch == 3 and optimizer.inner_step == 3
    assert downloads == [3, 3, 3]  # retried at each step (load_state_from_peers bounds how often it really runs)
    tracker.global_epoch = 4  # now one behind: this round ends and the node moves with the swarm
    micro_batch()
    assert len(averager.controls) == 1 and averager.controls[0].triggered and optimizer.local_epoch == 4


def test_a_fast_peer_past_inner_steps_serves_a_state_newcomers_accept() -> None:
    """With the shared round clock a fast peer makes more inner steps than inner_steps in a round;
    the round position it serves must still pass the newcomers' check, or they reject an honest donor."""
    import threading

    from p2ptrain.averaging.diloco import DiLoCoAverager
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.diloco_state import DiLoCoState
    from p2ptrain.trust.verdicts import check_diloco_metadata

    settled = threading.Event()
    settled.set()
    outer = OuterStep([torch.nn.Parameter(torch.zeros(2))], lr=0.7, momentum=0.9, nesterov=True)
    cfg = TrainingSection(mode="diloco", inner_steps=100)
    owner = SimpleNamespace(cfg=cfg, local_epoch=7, inner_step=250, round_settled=settled, outer=outer,
                            served_state=lambda: DiLoCoState.served_state(owner))  # type: ignore[arg-type]
    # The methods only read their owner: called on stand-ins, no averager process is started.
    metadata, tensors, _ = DiLoCoAverager.get_current_state(SimpleNamespace(_owner=owner))
    assert metadata == {"epoch": 7, "inner_step": 99} and len(tensors) == 2
    assert check_diloco_metadata(metadata, cfg.inner_steps).ok


class _Flickering(_Behind):
    """A swarm whose other peer shows in the progress or not, as the test says; every step ends a round."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.ready_to_update_epoch = True
        self.global_progress = SimpleNamespace(num_peers=1, samples_accumulated=0)

    def step(self, **kwargs: object) -> _Control:
        raise AssertionError("no round may start with nobody to average with")


def test_rounds_ended_alone_are_failed_when_a_peer_was_there_and_said_once_when_training_alone(
        monkeypatch, caplog) -> None:
    import logging

    import p2ptrain.optim.diloco as diloco
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats

    made: list[_Flickering] = []

    def make(*args: object, **kwargs: object) -> _Flickering:
        made.append(_Flickering(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(diloco, "SwarmProgressTracker", make)
    monkeypatch.setattr(diloco, "DiLoCoAverager", make)
    param = torch.nn.Parameter(torch.zeros(3))
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_batch_size=8, inner_steps=10, lr=0.1, warmup_epochs=0)
    stats = SwarmStats()
    optimizer = diloco.DiLoCoOptimizer([param], None, "run", cfg, client_mode=False, stats=stats)
    tracker = made[0]

    def round_ending(peers_while_training: int) -> None:
        """One micro-batch, during which the swarm shows ``peers_while_training``; its round ends alone."""
        tracker.global_progress = SimpleNamespace(num_peers=peers_while_training, samples_accumulated=0)
        param.grad = torch.ones(3)
        monkeypatch.setattr(tracker, "report_local_progress", lambda *a: None)
        original = optimizer._begin_average

        def lapsed(params: list[torch.Tensor]) -> object:  # the other peer's entry lapsed at the round's end
            tracker.global_progress = SimpleNamespace(num_peers=1, samples_accumulated=0)
            return original(params)

        monkeypatch.setattr(optimizer, "_begin_average", lapsed)
        optimizer.step(batch_size=8)
        optimizer.zero_grad()

    with caplog.at_level(logging.INFO, logger="p2ptrain"):
        for _ in range(3):  # a swarm of one: its rounds are the swarm's, said once
            round_ending(1)
        figures, credit = stats.rounds.figures(), stats.credit.figures()
        assert (figures.rounds_ok, figures.rounds_failed) == (0, 0) and credit.contributed == 3 * 8
        round_ending(2)  # a peer in the swarm during the round, gone from the progress at its end
        round_ending(1)  # ... and still not seen: this round missed it too
        figures, credit = stats.rounds.figures(), stats.credit.figures()
        assert figures.rounds_failed == 2 and credit.not_averaged == 2 * 8 and optimizer.solo.missed == 2
        round_ending(1)  # two rounds without it: training alone again, said once more
    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name in ("p2ptrain.optim.diloco", "p2ptrain.optim.solo_round")]
    assert [level for level, _ in lines] == [logging.INFO, logging.WARNING, logging.WARNING, logging.INFO], lines
    assert lines[0][1].startswith("DiLoCo round 0: no other peer in the swarm; training alone")
    assert lines[1][1] == ("DiLoCo round 3 ended alone: no other peer in the swarm's progress at its end (one was "
                           "there in round 3); applied the local pseudo-gradient (1 such round so far)")
    assert lines[2][1].endswith("(2 such rounds so far)") and lines[3][1].startswith("DiLoCo round 5: no other peer")
    assert optimizer.local_epoch == 6


class _NoDonor(_NoSwarm):
    """An averager whose every download finds no usable state (each attempt rejects one donor)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.attempts = 0
        self.last_download_rejections: list[tuple[str, str]] = []

    def load_state_from_peers(self, timeout: float | None = None) -> None:
        self.attempts += 1
        self.last_download_rejections = [("QmLiar", "tensor 0 has NaN")]
        return None


def _no_donor_optimizer(monkeypatch, wait):
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats

    monkeypatch.setattr(diloco, "SwarmProgressTracker", _NoSwarm)
    averagers: list[_NoDonor] = []
    monkeypatch.setattr(diloco, "DiLoCoAverager", lambda *a, **k: averagers.append(_NoDonor()) or averagers[-1])
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_steps=10, load_state_attempts=3, warmup_epochs=0)
    optimizer = diloco.DiLoCoOptimizer([torch.nn.Parameter(torch.zeros(3))], None, "run", cfg, client_mode=False,
                                       stats=SwarmStats(), wait=wait)
    return optimizer, averagers[0]


def test_a_download_waits_between_attempts_on_the_node_s_stop_event_and_a_stop_ends_it(monkeypatch) -> None:
    waits: list[float] = []
    optimizer, averager = _no_donor_optimizer(monkeypatch, lambda seconds: waits.append(seconds) or False)
    assert optimizer.load_state_from_peers() is False
    assert averager.attempts == 3 and waits == [2.0, 4.0]  # no plain sleeps: the node's stop event's wait
    stopping: list[float] = []
    optimizer, averager = _no_donor_optimizer(monkeypatch, lambda seconds: stopping.append(seconds) or True)
    assert optimizer.load_state_from_peers() is False
    assert averager.attempts == 1 and stopping == [2.0]  # a stop asked during the pause: no more attempts


def test_a_fresh_node_with_only_bad_donors_says_so_once_per_download(monkeypatch, caplog) -> None:
    import logging

    optimizer, _ = _no_donor_optimizer(monkeypatch, lambda seconds: False)
    with caplog.at_level(logging.INFO, logger="p2ptrain"):
        optimizer.load_state_from_peers()
    said = [r for r in caplog.records if "every donor's state was rejected" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_without_peer_checks_a_round_s_received_share_is_still_measured(monkeypatch) -> None:
    """A node with ``swarm.peer_checks = false`` runs the counting averager: what its reducer received
    decides whether the round was full, as with the checks on."""
    import time

    import p2ptrain.optim.diloco as diloco
    from p2ptrain.averaging.robust_reduce import AllReduceReport
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats

    monkeypatch.setattr(diloco, "SwarmProgressTracker", _TwoPeerClock)
    made: list[dict[str, object]] = []

    def make_averager(*args: object, **kwargs: object) -> _Averager:
        made.append(kwargs)
        return _Averager(*args, **kwargs)

    monkeypatch.setattr(diloco, "DiLoCoAverager", make_averager)
    param = torch.nn.Parameter(torch.zeros(3))
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_steps=10, lr=0.1, warmup_epochs=0)
    stats = SwarmStats()
    optimizer = diloco.DiLoCoOptimizer([param], SimpleNamespace(peer_id="QmMe"), "run", cfg, client_mode=False,
                                       stats=stats)
    reports = made[0]["round_reports"]  # the queue the averager's process reports to
    reports.put(AllReduceReport(averager="diloco", group_size=2, peers=("QmMe", "QmPeer"), senders=2,
                              contributions_expected=6, contributions_received=2, results_expected=3,
                              results_received=3, rejected=(), clipped=0, ok=True, finished_at=0.0))
    optimizer._finish_round({"QmMe": None, "QmPeer": None}, [torch.zeros(3)], None, time.perf_counter())
    figures = stats.rounds.figures()
    assert figures.rounds_partial == 1 and figures.rounds_ok == 0
    assert figures.last_received_fraction == pytest.approx(1 / 3)


def test_at_a_stop_a_round_still_looking_for_its_group_gets_two_matchmaking_windows_not_the_timeout(
        monkeypatch, caplog) -> None:
    """A node that ended its round by the clock while its group never formed (its peers stopped first)
    lands it as a failed round within two matchmaking windows, not the averaging timeout; one whose
    group has assembled is waited for."""
    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch)
    optimizer.cfg = optimizer.cfg.model_copy(update={"matchmaking_time": 0.2, "averaging_timeout": 60.0})
    micro_batch()
    [control] = averagers[0].controls
    optimizer._tracker.ready_to_update_epoch = True  # the clock ends the round; the group is still looked for
    micro_batch()
    assert control.triggered and optimizer.local_epoch == 1 and not optimizer.round_settled.is_set()
    cancelled: list[bool] = []

    def cancel() -> None:
        cancelled.append(True)
        monkeypatch.setattr(control, "done", lambda: True)
        monkeypatch.setattr(control, "result", lambda timeout=None: (_ for _ in ()).throw(CancelledError()),
                            raising=False)

    monkeypatch.setattr(control, "cancel", cancel)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="p2ptrain"):
        optimizer.flush()
    assert time.monotonic() - began < 2.0 and cancelled and optimizer.round_settled.is_set()
    assert optimizer.stats.rounds.figures().rounds_failed == 1
    assert [r.getMessage() for r in caplog.records
            if r.levelno >= logging.INFO and r.name == "p2ptrain.optim.diloco"] == [
        "DiLoCo round 0 found no group before the stop: applying the local pseudo-gradient"]

    # A round whose group has assembled lands as the swarm's.
    optimizer._tracker.ready_to_update_epoch = False
    micro_batch()
    second = averagers[0].controls[-1]
    second.stage = AveragingStage.AWAITING_TRIGGER
    micro_batch()
    second.stage = AveragingStage.RUNNING_ALLREDUCE
    monkeypatch.setattr(second, "result", lambda timeout=None: {None: 0, "peer-b": 0}, raising=False)
    optimizer.flush()
    assert optimizer.round_settled.is_set() and optimizer.stats.rounds.figures().rounds_ok == 1


def test_a_paused_peer_applies_the_round_that_landed_and_serves_its_state_at_once(monkeypatch) -> None:
    """A peer paused with a round in flight (overlap) no longer trains, and only the training thread
    applies a round: without the paused loop's ``settle``, a newcomer's download would wait the whole
    averaging timeout for that round, and give up on this donor first."""
    import time

    from hivemind.averaging.control import AveragingStage

    optimizer, averagers, micro_batch = _two_peer_optimizer(monkeypatch)
    micro_batch()
    [control] = averagers[0].controls
    control.stage = AveragingStage.AWAITING_TRIGGER
    micro_batch()  # the round ends: its all-reduce in flight; then the node pauses
    assert optimizer._in_flight is not None
    optimizer.settle()  # a paused pass before the round lands: nothing to apply, nothing waited for
    assert optimizer._in_flight is not None and not optimizer.round_settled.is_set()
    control.done = lambda: True  # type: ignore[method-assign]
    control.result = lambda timeout=None: {"QmMe": None, "QmPeer": None}  # type: ignore[attr-defined]
    optimizer.settle()
    assert optimizer._in_flight is None and optimizer.round_settled.is_set()
    started = time.monotonic()
    metadata, _ = optimizer.served_state()
    assert time.monotonic() - started < 1.0 and metadata["epoch"] == optimizer.local_epoch
