"""A stop request that a signal handler can raise safely and every wait can watch.

Signal handlers must only record (a handler that takes a lock can deadlock the thread it
interrupted), so :meth:`Stopper.request` sets a plain attribute and writes one byte to a
self-pipe; :meth:`Stopper.wait` sleeps in ``select`` on that pipe, so a stop interrupts any wait
at once.
"""

from __future__ import annotations

import contextlib
import os
import select


class Stopper:
    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        """Ask the node to stop; the first reason wins. Safe in signal handlers and other threads."""
        if self.reason is None:
            self.reason = reason
        # A full or closed pipe means a wake-up is already pending or nobody waits any more.
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"x")

    def is_set(self) -> bool:
        return self.reason is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds or until a stop is requested; True if one was."""
        if self.is_set():
            return True
        with contextlib.suppress(InterruptedError):
            select.select([self._read_fd], [], [], timeout)
        return self.is_set()

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
