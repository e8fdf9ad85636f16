"""Helpers for tests against live nodes: raw HTTP calls, the node's token, bounded polling,
and a test-owned sd_notify socket that records what the node tells systemd."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2ptrain.localswarm import LocalNode


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(url: str, method: str = "GET", *, token: str | None = None, body: bytes | None = None,
         timeout: float = 10.0) -> Answer:
    """One HTTP request; 4xx/5xx answers are returned, not raised."""
    request = urllib.request.Request(url, data=body, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), error.read())


def node_token(node: LocalNode) -> str:
    return (node.state_dir / "api.token").read_text(encoding="utf-8").strip()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


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
