"""Commands from outside the training loop (API, signals, TUI) to the node, in one direction only.

Producers (HTTP handlers, signal handlers) only enqueue; the node loop drains the queue between
steps and acts.  That keeps every state change on the node's own thread.
"""

from __future__ import annotations

import enum
import queue
from dataclasses import dataclass


class Command(enum.StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CHECKPOINT = "checkpoint"
    LEAVE = "leave"
    RELOAD = "reload"


@dataclass(frozen=True)
class ControlRequest:
    command: Command
    #: Seconds a pause lasts (None: until resumed).
    duration: float | None = None
    #: Who asked, for the log line ("api", "SIGTERM", ...).
    source: str = ""


class ControlQueue:
    """A bounded queue: a flood of requests is refused, never allowed to grow memory."""

    def __init__(self, maxsize: int = 64) -> None:
        self._queue: queue.Queue[ControlRequest] = queue.Queue(maxsize=maxsize)

    def submit(self, request: ControlRequest) -> bool:
        """Enqueue without blocking; False when the queue is full."""
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            return False
        return True

    def drain(self) -> list[ControlRequest]:
        requests: list[ControlRequest] = []
        while True:
            try:
                requests.append(self._queue.get_nowait())
            except queue.Empty:
                return requests
