"""Small pieces of the node loop: stop requests, rates, LR schedule, per-peer seeds."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest

from p2ptrain.daemon.builder import peer_seed
from p2ptrain.daemon.smoothing import Ema, WindowRate
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.optim.inner import warmup_cosine
from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.status import ROUND_DURATION_BUCKETS


def test_stopper_wakes_a_wait_at_once() -> None:
    stopper = Stopper()
    threading.Timer(0.1, stopper.request, args=("test",)).start()
    started = time.monotonic()
    assert stopper.wait(10) is True
    assert time.monotonic() - started < 5
    assert stopper.reason == "test"
    stopper.request("second")
    assert stopper.reason == "test"  # the first reason wins


def test_stopper_is_safe_in_a_signal_handler() -> None:
    stopper = Stopper()
    previous = signal.signal(signal.SIGUSR1, lambda *_: stopper.request("SIGUSR1"))
    try:
        threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGUSR1)).start()
        assert stopper.wait(10) is True and stopper.reason == "SIGUSR1"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_window_rate_counts_recent_events_only() -> None:
    rate = WindowRate(window=10)
    for second in range(10):
        rate.add(float(second), 8)
    assert rate.rate(9.0) == pytest.approx(80 / 9)
    assert rate.rate(100.0) == 0.0


def test_ema_ignores_non_finite_samples() -> None:
    ema = Ema(alpha=0.5)
    ema.add(4.0)
    ema.add(math.nan)
    ema.add(2.0)
    assert ema.value == 3.0


def test_warmup_then_cosine() -> None:
    factor = warmup_cosine(warmup=4, total=104, floor=0.1)
    assert [factor(e) for e in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(54) == pytest.approx(0.55)
    assert factor(104) == pytest.approx(0.1) and factor(10_000) == pytest.approx(0.1)


def test_peer_seed_is_stable_and_distinct() -> None:
    assert peer_seed("QmA") == peer_seed("QmA")
    assert peer_seed("QmA") != peer_seed("QmB")
    assert 0 <= peer_seed("QmA") < 2**63


def test_round_histogram_buckets_and_traffic() -> None:
    stats = SwarmStats()
    stats.record_round(RoundSummary(ok=True, duration=0.1, group_size=2, peers_online=2, received_fraction=1.0), 1000)
    stats.record_round(RoundSummary(ok=False, duration=1000.0, group_size=0, peers_online=2,
                                   received_fraction=0.0), 1000)
    rounds = stats.rounds.figures()
    assert rounds.duration_bucket_counts[0] == 1 and rounds.duration_bucket_counts[len(ROUND_DURATION_BUCKETS)] == 1
    assert rounds.rounds_ok == 1 and rounds.rounds_failed == 1 and rounds.last_group_size == 2
    assert stats.view().bytes_sent == 1000  # 2 x payload x (n-1)/n for a pair
