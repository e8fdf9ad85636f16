"""Fixtures for the TUI tests: a fake node on loopback, a token file, and an app wired to both."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakenode import NOW, TOKEN, FakeNode

from p2ptrain.client.http import NodeClient
from p2ptrain.tui.app import TopApp


@pytest.fixture
def fake_node() -> Iterator[FakeNode]:
    node = FakeNode().start()
    yield node
    node.stop()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "api.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def make_app(fake_node: FakeNode, token_file: Path) -> Callable[..., TopApp]:
    def make(**kwargs: Any) -> TopApp:
        options: dict[str, Any] = {"poll_interval": 0.05, "clock": lambda: NOW, "local_time": time.gmtime}
        options.update(kwargs)
        return TopApp(NodeClient(fake_node.url, None, timeout=2.0), options.pop("token_file", token_file),
                      **options)

    return make
