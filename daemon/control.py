"""Commands from outside the training loop (API, signals, TUI) to the node, in one direction only.

Producers (HTTP handlers, signal handlers) only enqueue; the node loop drains the queue between
steps and acts.  That keeps every state change on the node's own thread.

A signal handler runs on the main thread between two bytecodes, possibly while that same thread
is inside :meth:`ControlQueue.drain`; a queue guarded by a lock would then deadlock the node.
``queue.SimpleQueue`` is documented as reentrant (its ``put`` is safe in signal handlers), and
nothing here takes a lock of its own.
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
    """A bounded, signal-safe queue: a flood of requests is refused, never allowed to grow memory.

    The bound is checked without a lock, so concurrent producers may overshoot it by one each.
    """

    def __init__(self, maxsize: int = 64) -> None:
        self._queue: queue.SimpleQueue[ControlRequest] = queue.SimpleQueue()
        self._maxsize = maxsize

    def submit(self, request: ControlRequest) -> bool:
        """Enqueue without blocking (from any thread, or a signal handler); False when full."""
        if self._queue.qsize() >= self._maxsize:
            return False
        self._queue.put(request)
        return True

    def drain(self) -> list[ControlRequest]:
        requests: list[ControlRequest] = []
        while True:
            try:
                requests.append(self._queue.get_nowait())
            except queue.Empty:
                return requests
