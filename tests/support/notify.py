"""A test-owned sd_notify socket that records what a live node tells systemd."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Notification:
    at: float  # time.monotonic() on arrival
    fields: tuple[tuple[str, str], ...]

    def get(self, key: str) -> str | None:
        return next((value for name, value in self.fields if name == key), None)


class NotifySocket:
    """An AF_UNIX datagram socket standing in for systemd's ``$NOTIFY_SOCKET``.

    A thread records every datagram; ``on_ready`` runs in that thread as soon as ``READY=1``
    arrives, so a test can look at the node at that very moment.
    """

    def __init__(self, on_ready: Callable[[], Any] | None = None) -> None:
        # Short path: sun_path is limited to 107 bytes, pytest's tmp_path can be longer.
        self.path = f"/tmp/p2ptrain-notify-{os.getpid()}-{time.monotonic_ns()}.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.2)
        self._on_ready = on_ready
        self.at_ready: Any = None
        self.messages: list[Notification] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = tuple(tuple(line.split("=", 1)) for line in data.decode().split("\n") if "=" in line)
            message = Notification(time.monotonic(), fields)  # type: ignore[arg-type]
            if message.get("READY") == "1" and self._on_ready is not None and self.at_ready is None:
                self.at_ready = self._on_ready()
            with self._lock:
                self.messages.append(message)

    def received(self) -> list[Notification]:
        with self._lock:
            return list(self.messages)

    def with_key(self, key: str, value: str | None = None) -> list[Notification]:
        return [m for m in self.received() if m.get(key) is not None and (value is None or m.get(key) == value)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        Path(self.path).unlink(missing_ok=True)
