"""End to end in a real terminal: ``p2ptrain top`` under tmux against a node API on loopback."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakenode import TOKEN, FakeNode

from p2ptrain.tui.widgets.format import short_id

TMUX = shutil.which("tmux")
if TMUX is None and os.environ.get("CI"):
    raise RuntimeError("tmux is required in CI (apt-get install -y tmux)")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux)")


class Terminal:
    """One tmux session on a private server socket, so no user session is ever touched."""

    def __init__(self, socket: Path, command: str, size: tuple[int, int]) -> None:
        self.base = [str(TMUX), "-S", str(socket)]
        self.tmux("new-session", "-d", "-s", "top", "-x", str(size[0]), "-y", str(size[1]), command)

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=10).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, condition: Callable[[str], bool], timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if condition(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"screen never matched; last screen:\n{self.screen()}")

    def alive(self) -> bool:
        return subprocess.run([*self.base, "has-session", "-t", "top"], capture_output=True,
                              timeout=10).returncode == 0

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def terminal(tmp_path: Path, fake_node: FakeNode, token_file: Path) -> Iterator[Terminal]:
    # Short socket path: unix socket paths are limited to ~107 bytes.
    socket = Path("/tmp") / f"p2ptrain-top-{os.getpid()}-{time.monotonic_ns()}.sock"
    command = shlex.join([sys.executable, "-m", "p2ptrain.cli", "top", "--url", fake_node.url,
                          "--token-file", str(token_file)])
    term = Terminal(socket, f"env TERM=xterm-256color {command}", (120, 40))
    yield term
    term.close()
    socket.unlink(missing_ok=True)


def test_top_in_a_real_terminal(terminal: Terminal, fake_node: FakeNode) -> None:
    terminal.wait_for(lambda s: "● connected to" in s and "TRAINING" in s)
    terminal.keys("2")
    screen = terminal.wait_for(lambda s: "Σ 5 peers" in s)
    for peer in fake_node.swarm.peers:
        assert short_id(peer.peer_id) in screen
    assert "p Pause/Resume" in screen and "q Quit" in screen
    terminal.keys("c")
    deadline = time.monotonic() + 10
    while not fake_node.controls and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake_node.controls == [("checkpoint", f"Bearer {TOKEN}", {})]
    terminal.keys("q")
    deadline = time.monotonic() + 10
    while terminal.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not terminal.alive(), "p2ptrain top did not exit on q"
