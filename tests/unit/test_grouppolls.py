"""Matchmaking's reads of its group key are spaced, pass their answer through, and are paced once."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from hivemind.averaging.key_manager import GroupKeyManager

from p2ptrain.averaging.matchmaking import POLL_INTERVAL, pace_group_polls, poll_interval


class _Keys:
    """A group key manager that records when it was read."""

    def __init__(self) -> None:
        self.read_at: list[float] = []

    async def get_averagers(self, group_key: Any, only_active: bool) -> list[tuple[str, float]]:
        self.read_at.append(time.monotonic())
        return [(f"peer-of-{group_key}", 1.0)] if only_active else []


def _read(matchmaking: Any, times: int) -> list[Any]:
    async def loop() -> list[Any]:
        return [await matchmaking.group_key_manager.get_averagers("run.0b", True) for _ in range(times)]
    return asyncio.run(loop())


def test_reads_in_a_tight_loop_are_spaced_by_the_interval() -> None:
    keys = _Keys()
    matchmaking = SimpleNamespace(group_key_manager=keys)
    pace_group_polls(matchmaking, interval=0.05)
    answers = _read(matchmaking, 4)
    assert answers == [[("peer-of-run.0b", 1.0)]] * 4
    gaps = [b - a for a, b in zip(keys.read_at, keys.read_at[1:], strict=False)]
    assert len(gaps) == 3 and min(gaps) >= 0.045


def test_reads_are_a_tenth_of_the_matchmaking_time_apart_by_default() -> None:
    # A follower learns of a leader at most a tenth of the leader's wait late; the swarm's DHT answers
    # ten reads per round and seeker, not one every 0.1 s (50 a round at the shipped 5 s).
    keys = _Keys()
    matchmaking = SimpleNamespace(group_key_manager=keys, min_matchmaking_time=0.6)
    pace_group_polls(matchmaking)
    _read(matchmaking, 3)
    gaps = [b - a for a, b in zip(keys.read_at, keys.read_at[1:], strict=False)]
    assert min(gaps) >= 0.055
    assert poll_interval(5.0) == 0.5 and poll_interval(0.2) == POLL_INTERVAL


def test_the_first_read_is_not_delayed() -> None:
    keys = _Keys()
    matchmaking = SimpleNamespace(group_key_manager=keys)
    pace_group_polls(matchmaking, interval=5.0)
    started = time.monotonic()
    _read(matchmaking, 1)
    assert keys.read_at[0] - started < 1.0


def test_pacing_twice_wraps_once() -> None:
    keys = _Keys()
    matchmaking = SimpleNamespace(group_key_manager=keys)
    pace_group_polls(matchmaking, interval=0.05)
    wrapped = keys.get_averagers
    pace_group_polls(matchmaking, interval=0.05)
    assert keys.get_averagers is wrapped
    _read(matchmaking, 2)
    assert len(keys.read_at) == 2


class _EmptyDht:
    """What hivemind's GroupKeyManager touches of a DHT: its peer id and an awaitable ``get``."""

    peer_id = "self"

    def __init__(self) -> None:
        self.read_at: list[float] = []

    async def _nothing(self) -> None:
        return None

    def get(self, key: str, latest: bool = False, return_future: bool = False) -> Any:
        self.read_at.append(time.monotonic())
        return self._nothing()


def test_hivemind_group_key_manager_reads_are_paced() -> None:
    dht = _EmptyDht()
    keys = GroupKeyManager(dht, "run", initial_group_bits="", target_group_size=None)  # type: ignore[arg-type]
    matchmaking = SimpleNamespace(group_key_manager=keys)
    pace_group_polls(matchmaking, interval=0.05)
    assert _read(matchmaking, 3) == [[], [], []]  # nobody declared: hivemind's own parsing of the answer
    gaps = [b - a for a, b in zip(dht.read_at, dht.read_at[1:], strict=False)]
    assert len(gaps) == 2 and min(gaps) >= 0.045
