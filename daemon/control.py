"""Commands from outside the training loop (API, signals, TUI) to the node, in one direction only.

Producers (HTTP handlers, signal handlers) only enqueue; the node loop drains the queue between
steps and acts.  That keeps every state change on the node's own thread.

A signal handler runs on the main thread between two bytecodes, possibly while that same thread
is inside :meth:`ControlQueue.drain`; a queue guarded by a lock would then deadlock the node.
``queue.SimpleQueue`` is documented as reentrant (its ``put`` is safe in signal handlers), and
nothing here takes a lock of its own.  For the same reason a refused request is only counted
where it is refused; :meth:`ControlQueue.drain`, on the loop's thread, says so in one line.  A
reload is never lost to a full queue: one reload reads the config file as it is by then, so a
refused one is kept as a flag and handed out with the next drain.  Whatever will be handed out
calls ``wake`` (the node's :meth:`~p2ptrain.daemon.stopper.Stopper.wake`, a write to a pipe), so a
paused loop acts on it at once instead of at the end of its idle wait.
"""

from __future__ import annotations

import enum
import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


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

    def __init__(self, maxsize: int = 64, *, wake: Callable[[], None] = lambda: None) -> None:
        self._queue: queue.SimpleQueue[ControlRequest] = queue.SimpleQueue()
        self._maxsize = maxsize
        #: Signal-safe: called from submit(), which signal handlers call.
        self._wake = wake
        # Plain attributes, written by producers (signal handlers included) and read by drain().
        self._refused = 0
        self._reload_refused: ControlRequest | None = None

    def submit(self, request: ControlRequest) -> bool:
        """Enqueue without blocking (from any thread, or a signal handler); False when full."""
        if self._queue.qsize() >= self._maxsize:
            self._refused += 1
            if request.command is Command.RELOAD:
                self._reload_refused = request
                self._wake()
            return False
        self._queue.put(request)
        self._wake()
        return True

    def drain(self) -> list[ControlRequest]:
        """Every request waiting, oldest first; a reload refused while the queue was full comes last."""
        requests: list[ControlRequest] = []
        while True:
            try:
                requests.append(self._queue.get_nowait())
            except queue.Empty:
                break
        refused, self._refused = self._refused, 0
        reload, self._reload_refused = self._reload_refused, None
        if reload is not None:
            requests.append(reload)
        if refused:
            logger.warning("control: %d request%s refused, the queue was full%s", refused, "s" * (refused > 1),
                           f"; the {reload.source or 'refused'} reload runs now" if reload is not None else "")
        return requests
