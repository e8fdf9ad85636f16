"""SVG snapshots of every view at 120x40 and 80x24, from fixed data and a fixed clock.

The fake node listens on a fixed loopback port because the URL is part of the picture.
Regenerate after an intended change with ``pytest tests/tui --snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakenode import NOW, SCRIPT_LENGTH, FakeNode
from textual.pilot import Pilot

from p2ptrain.client.http import NodeClient
from p2ptrain.tui.app import TopApp

SNAPSHOT_PORT = 47913


@pytest.fixture(scope="module")
def snapshot_node() -> Iterator[FakeNode]:
    node = FakeNode(port=SNAPSHOT_PORT).start()
    yield node
    node.stop()


def _prepare(app: TopApp, view: str) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        for _ in range(200):  # every scripted snapshot seen: the sparklines are complete and stable
            if len(app.history.loss) == SCRIPT_LENGTH and app.swarm.peers and app.token_problem is None:
                break
            await pilot.pause(0.05)
        else:
            raise AssertionError("the app never loaded the fake node's data")
        app.poll_interval = 5.0  # quiet from here on: the picture needs no more polls
        await pilot.press(view)
        await pilot.pause(0.2)

    return run_before


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
@pytest.mark.parametrize("view", ["1", "2", "3", "4"], ids=["node", "swarm", "logs", "contributors"])
def test_view_snapshot(snap_compare: Any, snapshot_node: FakeNode, token_file: Path, view: str,
                       size: tuple[int, int]) -> None:
    snapshot_node.status_gets = 0  # replay the same history for every picture
    app = TopApp(NodeClient(snapshot_node.url, None), token_file, poll_interval=0.02, clock=lambda: NOW,
                 local_time=time.gmtime)
    assert snap_compare(app, terminal_size=size, run_before=_prepare(app, view))
