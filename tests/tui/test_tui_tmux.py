"""End to end in a real terminal: ``p2ptrain top`` under tmux against a node API on loopback."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakenode import TOKEN, FakeNode

from p2ptrain.tui.widgets.format import short_id
from p2ptrain.waiting import wait_until
from tests.support.tmuxterm import TMUX, Terminal, private_socket

if TMUX is None and os.environ.get("CI"):
    raise RuntimeError("tmux is required in CI (apt-get install -y tmux)")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux)")


@pytest.fixture
def terminal(tmp_path: Path, fake_node: FakeNode, token_file: Path) -> Iterator[Terminal]:
    socket = private_socket()
    command = shlex.join([sys.executable, "-m", "p2ptrain.cli", "top", "--url", fake_node.url,
                          "--token-file", str(token_file)])
    term = Terminal(socket, f"env TERM=xterm-256color {command}", (120, 40))
    yield term
    term.close()


def test_top_in_a_real_terminal(terminal: Terminal, fake_node: FakeNode) -> None:
    terminal.wait_for(lambda s: "● connected to" in s and "TRAINING" in s)
    terminal.keys("2")
    screen = terminal.wait_for(lambda s: "Σ 5 peers" in s)
    for peer in fake_node.swarm.peers:
        assert short_id(peer.peer_id) in screen
    assert "p Pause/Resume" in screen and "q Quit" in screen
    terminal.keys("c")
    wait_until(lambda: fake_node.controls, 10, "the checkpoint request", interval=0.1)
    assert fake_node.controls == [("checkpoint", f"Bearer {TOKEN}", {})]
    terminal.keys("q")
    wait_until(lambda: not terminal.alive(), 10, "exit of p2ptrain top on q", interval=0.1)
