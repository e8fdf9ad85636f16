"""A stop request that a signal handler can raise safely and every wait can watch.

Signal handlers must only record (a handler that takes a lock can deadlock the thread it
interrupted), so :meth:`Stopper.request` sets a plain attribute and writes one byte to a
self-pipe; :meth:`Stopper.wait` sleeps in ``select`` on that pipe, so a stop interrupts any wait
at once.  The same object is the SIGTERM/SIGINT handler (:meth:`Stopper.handle_stop_signals`):
the first signal asks for a clean stop, a second *signal* means the sender insists and the
process exits at once.  A stop already requested from inside (``leave``, ``max_epochs``, a
manifest update) is no second signal: one ``systemctl stop`` during the final checkpoint waits
for it.  A second pipe lets whoever hands the loop work (control requests) cut its idle wait
short (:meth:`Stopper.wake`, :meth:`Stopper.wait_for_work`) without cutting anyone else's waits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from types import FrameType

from p2ptrain.errors import killed_by


class Stopper:
    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        self._wake_read_fd, self._wake_write_fd = os.pipe()
        for fd in (self._read_fd, self._write_fd, self._wake_read_fd, self._wake_write_fd):
            os.set_blocking(fd, False)
        self.reason: str | None = None
        #: SIGTERM/SIGINT received so far (only the main thread runs signal handlers: a plain counter).
        self.signals = 0

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

    # -- signals ------------------------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: FrameType | None = None) -> None:
        """The SIGTERM/SIGINT handler: the first signal asks for a clean stop (final checkpoint and
        all), whatever else asked for one already; the second ends the process at once with
        128 + the signal's number (forked helpers die with it: PDEATHSIG)."""
        self.signals += 1
        if self.signals > 1:
            os._exit(killed_by(signum))
        self.request(signal.Signals(signum).name)

    def handle_stop_signals(self) -> None:
        """Make :meth:`on_signal` the handler of SIGTERM and SIGINT (from the main thread)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)

    # -- waking the loop ----------------------------------------------------------------------------

    def wake(self) -> None:
        """Cut short the loop's :meth:`wait_for_work` in progress, or its next one: work was handed
        to it.  Safe in signal handlers and other threads (one byte to a non-blocking pipe)."""
        with contextlib.suppress(OSError):  # full: a wake-up is pending already
            os.write(self._wake_write_fd, b"x")

    def wait_for_work(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, until a stop is requested or :meth:`wake` is called (since
        the previous call returned); True if a stop was requested.  For one waiter only, the loop:
        the wake-ups are consumed here, and no other wait sees them."""
        if self.is_set():
            return True
        with contextlib.suppress(InterruptedError):
            select.select([self._read_fd, self._wake_read_fd], [], [], timeout)
        with contextlib.suppress(OSError):  # BlockingIOError: all consumed
            while os.read(self._wake_read_fd, 4096):
                pass
        return self.is_set()

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd, self._wake_read_fd, self._wake_write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
