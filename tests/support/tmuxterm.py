"""A real terminal for end-to-end TUI tests: one tmux session on a private server socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from p2ptrain.waiting import wait_until

TMUX = shutil.which("tmux")


def private_socket() -> Path:
    # Short path under /tmp: unix socket paths are limited to ~107 bytes.
    return Path("/tmp") / f"p2ptrain-top-{os.getpid()}-{time.monotonic_ns()}.sock"


class Terminal:
    """One tmux session on a private server socket, so no user session is ever touched."""

    def __init__(self, socket: Path, command: str, size: tuple[int, int]) -> None:
        self.socket = socket
        self.base = [str(TMUX), "-S", str(socket)]
        self.tmux("new-session", "-d", "-s", "top", "-x", str(size[0]), "-y", str(size[1]), command)

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=10).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, condition: Callable[[str], bool], timeout: float = 15.0) -> str:
        def matching() -> tuple[str] | None:  # a tuple: an empty screen (the session ended) may match
            text = self.screen()
            return (text,) if condition(text) else None

        return wait_until(matching, timeout, "matching screen", interval=0.1,
                          detail=lambda: f"last screen:\n{self.screen()}")[0]

    def alive(self) -> bool:
        return subprocess.run([*self.base, "has-session", "-t", "top"], capture_output=True,
                              timeout=10).returncode == 0

    def close(self) -> None:
        self.tmux("kill-server")
        self.socket.unlink(missing_ok=True)
