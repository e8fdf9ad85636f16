"""The TUI against the node's real API server (``p2ptrain.daemon.api``): the contract, not a copy of it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fakenode import NOW, SELF_ID, TOKEN, status_script, swarm_view
from prometheus_client import CollectorRegistry
from textual.pilot import Pilot

from p2ptrain.client.http import NodeAuthError, NodeClient
from p2ptrain.daemon.api import ApiServer
from p2ptrain.daemon.control import Command, ControlQueue
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.status import LatestSnapshot
from p2ptrain.tui.app import TopApp
from p2ptrain.tui.widgets.logs import LogPane


@pytest.fixture
def real_api() -> Iterator[tuple[ApiServer, LatestSnapshot, LogRing, ControlQueue]]:
    latest, ring, queue = LatestSnapshot(), LogRing(capacity=100), ControlQueue()
    status = dataclasses.replace(status_script()[-1], loss=float("nan"))  # a diverged loss
    latest.publish(status, swarm_view())
    log = logging.getLogger("p2ptrain.tui-contract-test")
    log.addHandler(ring)
    log.propagate = False
    log.setLevel(logging.DEBUG)  # other tests may have set the level of the "p2ptrain" parent logger
    for i in range(3):
        log.warning("line %d", i)
    server = ApiServer(host="127.0.0.1", port=0, latest=latest, logs=ring, control=queue,
                       registry=CollectorRegistry(), token=TOKEN, clock=lambda: NOW)
    server.start()
    yield server, latest, ring, queue
    server.stop()
    log.removeHandler(ring)


def test_client_reads_the_real_api(real_api: tuple[ApiServer, LatestSnapshot, LogRing, ControlQueue]) -> None:
    server, _, ring, queue = real_api
    client = NodeClient(server.url, TOKEN)
    status = client.status()
    assert status.peer_id == SELF_ID and status.loss is None  # NaN travels as null
    assert len(client.peers().peers) == 5
    lines, last = client.logs(0)
    assert [line["message"] for line in lines] == ["line 0", "line 1", "line 2"] and last == ring.last_seq
    assert lines[0]["level"] == "WARNING" and isinstance(lines[0]["time"], float)
    assert client.logs(last) == ([], last)
    answer = client.control("pause", duration_seconds=7200)
    assert answer.get("accepted") in (True, "pause")
    [request] = queue.drain()
    assert request.command is Command.PAUSE and request.duration == 7200
    with pytest.raises(NodeAuthError):
        NodeClient(server.url, "wrong").control("leave")
    assert queue.drain() == []


def test_app_on_the_real_api(real_api: tuple[ApiServer, LatestSnapshot, LogRing, ControlQueue],
                             token_file: Any) -> None:
    server, _, _, queue = real_api
    app = TopApp(NodeClient(server.url, None), token_file, poll_interval=0.05, clock=lambda: NOW,
                 local_time=time.gmtime)

    async def scenario(pilot: Pilot[Any]) -> None:
        for _ in range(200):
            if app.status is not None and app.swarm.peers:
                break
            await pilot.pause(0.05)
        assert app.status is not None and app.status.peer_id == SELF_ID
        await pilot.press("3")
        pane = app.screen.query_one(LogPane)
        for _ in range(100):
            if len(pane.lines) == 3:
                break
            await pilot.pause(0.05)
        assert "line 2" in pane.lines[2].text
        await pilot.press("c")
        for _ in range(100):
            if requests := queue.drain():
                assert [r.command for r in requests] == [Command.CHECKPOINT]
                return
            await pilot.pause(0.05)
        raise AssertionError("the checkpoint request never reached the node's control queue")

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await scenario(pilot)

    asyncio.run(main())
