"""The catch-up before training: when it waits for the swarm, when it downloads, when it skips."""

from __future__ import annotations

import threading

from p2ptrain.daemon.stopper import Stopper
from p2ptrain.daemon.sync import SYNC_WAIT, sync_with_swarm
from p2ptrain.optim.protocol import GlobalProgress
from tests.support.clock import ManualClock


class FakeOptimizer:
    """Progress becomes known after ``known_after`` reads (never, when None)."""

    def __init__(self, swarm_epoch: int, local_epoch: int, known_after: int | None, clock: ManualClock) -> None:
        self.swarm_epoch, self.local_epoch, self.known_after, self.clock = swarm_epoch, local_epoch, known_after, clock
        self.reads = self.downloads = 0

    def global_progress(self) -> GlobalProgress:
        self.reads += 1
        self.clock.now += 0.2  # each read, as each pause of the wait loop, takes time
        known = self.known_after is not None and self.reads > self.known_after
        return GlobalProgress(epoch=self.swarm_epoch if known else 0, known=known)

    def load_state_from_peers(self) -> None:
        self.downloads += 1
        self.local_epoch = self.swarm_epoch

    def join_next_round(self, swarm_epoch: int) -> bool:
        return False  # gradient mode's answer


class FastStopper(Stopper):
    """Never sleeps: the fake clock moves with each progress read instead."""

    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


def _sync(optimizer: FakeOptimizer, clock: ManualClock, **options) -> list[str]:
    started: list[str] = []
    sync_with_swarm(optimizer, FastStopper(), clock, before_download=lambda: started.append("download"), **options)
    return started


def test_a_node_behind_the_swarm_downloads_once_progress_is_known():
    clock = ManualClock(0.0)
    optimizer = FakeOptimizer(swarm_epoch=40, local_epoch=3, known_after=5, clock=clock)
    assert _sync(optimizer, clock) == ["download"]
    assert optimizer.downloads == 1 and optimizer.local_epoch == 40
    assert clock.now < SYNC_WAIT


def test_the_wait_for_an_unknown_swarm_is_bounded_and_then_the_node_goes_on():
    clock = ManualClock(0.0)
    optimizer = FakeOptimizer(swarm_epoch=40, local_epoch=3, known_after=None, clock=clock)
    assert _sync(optimizer, clock) == []
    assert SYNC_WAIT <= clock.now <= SYNC_WAIT + 1.0 and optimizer.downloads == 0


def test_the_first_records_view_is_waited_for_too():
    clock = ManualClock(0.0)
    optimizer = FakeOptimizer(swarm_epoch=40, local_epoch=3, known_after=0, clock=clock)
    records = threading.Event()
    assert _sync(optimizer, clock, records=records) == ["download"]
    assert clock.now >= SYNC_WAIT  # never set: the whole bound, then the download anyway


def test_the_node_that_started_the_swarm_does_not_wait_for_anyone():
    clock = ManualClock(0.0)
    optimizer = FakeOptimizer(swarm_epoch=0, local_epoch=7, known_after=None, clock=clock)
    assert _sync(optimizer, clock, alone=True, records=threading.Event()) == []
    assert clock.now == 0.0 and optimizer.reads == 0 and optimizer.local_epoch == 7


class JoiningOptimizer(FakeOptimizer):
    """DiLoCo's optimizer: one round behind, it can join the swarm's next round."""

    def join_next_round(self, swarm_round: int) -> bool:
        if swarm_round != self.local_epoch + 1:
            return False
        self.local_epoch = swarm_round
        return True


def test_a_restarted_diloco_node_one_round_behind_joins_the_next_round_without_a_download():
    clock = ManualClock(0.0)
    optimizer = JoiningOptimizer(swarm_epoch=8, local_epoch=7, known_after=0, clock=clock)
    assert _sync(optimizer, clock) == []
    assert optimizer.downloads == 0 and optimizer.local_epoch == 8


def test_further_behind_or_never_trained_it_downloads_even_in_diloco_mode():
    clock = ManualClock(0.0)
    far = JoiningOptimizer(swarm_epoch=9, local_epoch=7, known_after=0, clock=clock)
    assert _sync(far, clock) == ["download"] and far.local_epoch == 9
    # A fresh node's parameters are the initial ones: averaged in, they would pull the swarm back.
    fresh = JoiningOptimizer(swarm_epoch=1, local_epoch=0, known_after=0, clock=clock)
    assert _sync(fresh, clock) == ["download"] and fresh.downloads == 1
