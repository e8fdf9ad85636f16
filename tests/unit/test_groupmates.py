"""Groupmates' all-reduce streams: served once this averager has registered the group (not answered
BAD_GROUP_ID because our trigger came later than theirs), and not cut off by a shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import SimpleNamespace

import pytest

from p2ptrain.averaging.groupmates import DEFAULT_SERVE_GRACE, MAX_SERVE_GRACE
from p2ptrain.averaging.groupmates import POLL_SECONDS as POLL
from p2ptrain.averaging.hardened import AveragerLayer
from tests.support.clock import ManualClock

BAD_GROUP_ID = "BAD_GROUP_ID"


class _Matchmaking:
    """Finds ``group_id`` once ``found`` is set (at once by default)."""

    def __init__(self, group_id: bytes) -> None:
        self.group_id = group_id
        self.found: asyncio.Event | None = None
        self.group_key_manager = SimpleNamespace(get_averagers=None)  # paced by the layer, never read here
        self.min_matchmaking_time = 0.5

    async def _request_join_group(self, leader):
        return None

    async def look_for_group(self, step):
        if self.found is not None:
            await self.found.wait()
        return SimpleNamespace(group_id=self.group_id)


class _Averager:
    """hivemind 1.1.12's side, reduced to what the mixin relies on: a step matches a group, waits for
    its trigger, registers the group and runs; a stream for a group not registered gets BAD_GROUP_ID."""

    def __init__(self, next_chunk_timeout: float | None = None, group_id: bytes = b"g1") -> None:
        self.next_chunk_timeout = next_chunk_timeout
        self._matchmaking = _Matchmaking(group_id)
        self._running_groups: dict[bytes, object] = {}
        self.shut_down = False
        self.served_while: list[int] = []

    async def _step(self, *, step):
        group = await self._matchmaking.look_for_group(step)
        await step.trigger.wait()
        if step.cancelled:
            return
        with self._register_allreduce_group(group):
            await step.done.wait()

    @contextlib.contextmanager
    def _register_allreduce_group(self, group):
        self._running_groups[group.group_id] = object()
        try:
            yield
        finally:
            self._running_groups.pop(group.group_id)

    async def rpc_aggregate_part(self, stream, context):
        request = await stream.__anext__()
        if request.group_id not in self._running_groups:
            yield BAD_GROUP_ID
            return
        self.served_while.append(self.streams_serving)  # type: ignore[attr-defined]
        yield request.value * 2
        async for message in stream:
            yield message.value * 2

    def shutdown(self) -> None:
        self.shut_down = True


class _Node(AveragerLayer, _Averager):
    """The adapter's layer over the stand-in, without the peer checks (nothing gated here)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(peer_checks=False, **kwargs)


def _step():
    return SimpleNamespace(trigger=asyncio.Event(), done=asyncio.Event(), cancelled=False)


async def _settle() -> None:
    """Let every other task run until it waits on something (no clock involved: they wait on events)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def _parts(group_id: bytes, *values):
    for value in values:
        yield SimpleNamespace(group_id=group_id, value=value)


async def _serve(node, group_id: bytes, *values):
    context = SimpleNamespace(remote_id="QmPeer")
    return [m async for m in node.rpc_aggregate_part(_parts(group_id, *values), context)]


def test_a_stream_counts_while_it_is_served_and_not_after():
    node = _Node()
    node._running_groups[b"g1"] = object()
    assert asyncio.run(_serve(node, b"g1", 1, 2, 3)) == [2, 4, 6]
    assert node.served_while == [1]
    assert node.streams_serving == 0


def test_parts_that_arrive_before_our_trigger_wait_for_it_and_are_served():
    async def scenario():
        node, step = _Node(next_chunk_timeout=3.0), _step()
        stepping = asyncio.create_task(node._step(step=step))
        await _settle()  # matched, awaiting our trigger
        early = asyncio.create_task(_serve(node, b"g1", 5))
        await _settle()
        assert not early.done()  # hivemind alone would have answered BAD_GROUP_ID by now
        step.trigger.set()  # our round ends: the group is registered
        served = await asyncio.wait_for(early, 1.0)
        step.done.set()
        await stepping
        return served, node

    served, node = asyncio.run(scenario())
    assert served == [10]
    assert node._groupmates._assembled == {} and node._groupmates._matching == 0


def test_parts_that_arrive_before_a_follower_learns_its_group_wait_for_the_search():
    async def scenario():
        node, step = _Node(next_chunk_timeout=3.0), _step()
        node._matchmaking.found = asyncio.Event()
        step.trigger.set()  # our round has ended already: only the leader's word is missing
        stepping = asyncio.create_task(node._step(step=step))
        await _settle()
        early = asyncio.create_task(_serve(node, b"g1", 7))
        await _settle()
        assert not early.done()
        node._matchmaking.found.set()
        served = await asyncio.wait_for(early, 1.0)
        step.done.set()
        await stepping
        return served

    assert asyncio.run(scenario()) == [14]


def test_a_stream_for_a_group_we_never_assembled_gets_hiveminds_answer_at_once():
    async def scenario():
        node = _Node(next_chunk_timeout=3.0)
        started = time.monotonic()
        return await _serve(node, b"stranger", 5), time.monotonic() - started

    served, took = asyncio.run(scenario())
    assert served == [BAD_GROUP_ID]
    assert took < 0.5


def test_a_step_that_ends_before_its_trigger_releases_the_streams_waiting_for_it():
    async def scenario():
        node, step = _Node(next_chunk_timeout=3.0), _step()
        stepping = asyncio.create_task(node._step(step=step))
        await _settle()
        early = asyncio.create_task(_serve(node, b"g1", 5))
        await _settle()
        started = time.monotonic()
        step.cancelled = True
        step.trigger.set()  # the step ends without registering its group
        await stepping
        return await asyncio.wait_for(early, 1.0), time.monotonic() - started, node

    served, took, node = asyncio.run(scenario())
    assert served == [BAD_GROUP_ID]
    assert took < 0.5
    assert node._groupmates._assembled == {}


def test_parts_wait_for_our_trigger_no_longer_than_the_grace():
    async def scenario():
        node, step = _Node(serve_grace=0.2), _step()
        stepping = asyncio.create_task(node._step(step=step))
        await _settle()
        started = time.monotonic()
        served = await asyncio.wait_for(_serve(node, b"g1", 5), 2.0)
        took = time.monotonic() - started
        stepping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stepping
        return served, took

    served, took = asyncio.run(scenario())
    assert served == [BAD_GROUP_ID]
    assert 0.2 <= took < 1.0


def test_a_stream_that_fails_is_not_counted_forever():
    class _Failing(_Averager):
        async def rpc_aggregate_part(self, stream, context):
            yield 1
            raise ConnectionError("groupmate gone")

    class _FailingNode(AveragerLayer, _Failing):
        pass

    node = _FailingNode()
    with pytest.raises(ConnectionError):
        asyncio.run(_serve(node, b"g1", 1))
    assert node.streams_serving == 0


def test_shutdown_waits_until_the_last_stream_is_read():
    node, clock = _Node(next_chunk_timeout=3.0), ManualClock()
    node._groupmates._count(+1)

    def sleep(seconds):
        clock.now += seconds
        if clock.now >= 1000.5:
            node._groupmates._count(-1)  # the groupmate has read the last average

    waited = node.finish_serving(sleep=sleep, clock=clock)
    assert waited == pytest.approx(0.5, abs=POLL)
    assert node.streams_serving == 0


def test_shutdown_does_not_wait_for_a_groupmate_that_never_reads(caplog):
    node, clock = _Node(next_chunk_timeout=3.0), ManualClock()
    node._groupmates._count(+1)

    def sleep(seconds):
        clock.now += seconds

    with caplog.at_level(logging.INFO, logger="p2ptrain.averaging.groupmates"):
        waited = node.finish_serving(sleep=sleep, clock=clock)
    assert 3.0 <= waited < 3.1  # the groupmate's own chunk timeout: it has given up by then
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "1 groupmates still reading" in caplog.text


def test_shutdown_with_nothing_in_flight_returns_at_once_quietly_and_shuts_down(caplog):
    node = _Node()
    with caplog.at_level(logging.DEBUG, logger="p2ptrain.averaging.groupmates"):
        node.shutdown()
    assert node.shut_down
    assert not caplog.records


@pytest.mark.parametrize(("chunk_timeout", "grace", "expected"), [
    (None, None, DEFAULT_SERVE_GRACE),
    (2.5, None, 2.5),
    (600.0, None, MAX_SERVE_GRACE),
    (2.5, 1.0, 1.0),
    (2.5, -4.0, 0.0),
    (2.5, 1e9, MAX_SERVE_GRACE),
])
def test_the_wait_is_the_chunk_timeout_bounded(chunk_timeout, grace, expected):
    assert _Node(next_chunk_timeout=chunk_timeout, serve_grace=grace).serve_grace() == expected
