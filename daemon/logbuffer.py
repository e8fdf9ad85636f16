"""An in-memory ring of recent log lines, served by ``/api/v1/logs?since=N``."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

from p2ptrain.daemon.logsfilter import level_name


@dataclass(frozen=True)
class LogLine:
    seq: int
    time: float
    level: str
    logger: str
    message: str

    def to_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "time": self.time, "level": self.level, "logger": self.logger,
                "message": self.message}


class LogRing(logging.Handler):
    """Keeps the last ``capacity`` records; each gets an increasing sequence number for paging."""

    def __init__(self, capacity: int = 2000) -> None:
        super().__init__()
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=capacity)
        self._next_seq = 1
        self._ring_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break logging
            message = str(record.msg)
        with self._ring_lock:
            self._lines.append(LogLine(self._next_seq, record.created or time.time(),
                                       level_name(record.levelno),
                                       record.name, message))
            self._next_seq += 1

    def since(self, seq: int, limit: int = 500) -> list[LogLine]:
        """Lines with a sequence number above ``seq``, oldest first, at most ``limit``."""
        with self._ring_lock:
            lines = [line for line in self._lines if line.seq > seq]
        return lines[-limit:]

    @property
    def last_seq(self) -> int:
        with self._ring_lock:
            return self._next_seq - 1
