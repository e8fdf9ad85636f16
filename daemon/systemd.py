"""Talk to systemd: the sd_notify protocol (READY, STATUS, WATCHDOG, EXTEND_TIMEOUT, STOPPING).

A few datagrams over ``$NOTIFY_SOCKET`` are the whole protocol, so no libsystemd binding is
needed.  Without ``$NOTIFY_SOCKET`` (a terminal, a test, another init system) every call is a
silent no-op, which keeps the node loop free of ``if under_systemd:`` checks.  Send failures are
logged once and never raised: losing a status line must not stop training.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


def _usec(seconds: float) -> int:
    return max(0, int(seconds * 1_000_000))


def _one_line(text: str) -> str:
    # The protocol is newline-separated assignments; a newline in a STATUS would start a new one.
    return " ".join(text.split())


class SystemdNotifier:
    """Sends sd_notify messages to ``address`` (a path, or ``@name`` for an abstract socket).

    ``address=None`` makes a notifier that sends nothing (not running under systemd).
    ``watchdog_usec`` is systemd's ``$WATCHDOG_USEC`` for this process, 0 when the watchdog is off.
    """

    def __init__(self, address: str | None, watchdog_usec: int = 0) -> None:
        self.address = address or None
        self.watchdog_usec = watchdog_usec if self.address else 0
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], pid: int | None = None) -> SystemdNotifier:
        """The notifier systemd asked for: ``$NOTIFY_SOCKET``, ``$WATCHDOG_USEC``, ``$WATCHDOG_PID``."""
        address = environ.get("NOTIFY_SOCKET") or None
        watchdog_usec = 0
        raw_usec = environ.get("WATCHDOG_USEC", "")
        raw_pid = environ.get("WATCHDOG_PID", "")
        own_pid = os.getpid() if pid is None else pid
        # WATCHDOG_PID names the process the watchdog is meant for; a child that inherited the
        # environment must not ping on its parent's behalf.
        if raw_usec.isdigit() and (not raw_pid or (raw_pid.isdigit() and int(raw_pid) == own_pid)):
            watchdog_usec = int(raw_usec)
        return cls(address, watchdog_usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; True when it was sent."""
        if self.address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode("utf-8", "replace")
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        with self._lock:
            try:
                if self._socket is None:
                    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._socket.sendto(payload, target)
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    logger.warning("cannot notify systemd at %s: %s (further failures not logged)",
                                   self.address, exc)
                return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """The node has joined the swarm and synced its state: systemd may consider it started."""
        lines = ["READY=1"] + ([f"STATUS={_one_line(status)}"] if status else [])
        return self.notify(*lines, f"MAINPID={os.getpid()}")

    def status(self, text: str) -> bool:
        """A one-line human status shown by ``systemctl status``."""
        return self.notify(f"STATUS={_one_line(text)}")

    def reloading(self) -> bool:
        """A SIGHUP reload starts; follow with :meth:`ready` once it is applied."""
        return self.notify("RELOADING=1")

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun (graceful leave, final checkpoint)."""
        return self.notify("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for ``seconds`` more before the start or stop timeout fires (long downloads, checkpoints)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={_usec(seconds)}")

    def watchdog(self) -> bool:
        """One raw ``WATCHDOG=1``; prefer :meth:`watchdog_pacer`, which rate-limits it."""
        return self.notify("WATCHDOG=1") if self.watchdog_usec else False

    def watchdog_pacer(self, clock: Clock) -> WatchdogPacer:
        return WatchdogPacer(self, clock)

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None


class WatchdogPacer:
    """Turns "a training step finished" into ``WATCHDOG=1`` at most every half watchdog period.

    The node calls :meth:`progress` after each completed step (and on each pass of its loop while
    it is deliberately idle, e.g. paused).  A loop stuck inside a step never calls it, the pings
    stop, and systemd restarts the service: that is the point, so nothing here pings on a timer.
    """

    def __init__(self, notifier: SystemdNotifier, clock: Clock) -> None:
        self._notifier = notifier
        self._clock = clock
        self.base_usec = notifier.watchdog_usec
        self._current_usec = self.base_usec
        self._last_ping: float | None = None

    @property
    def enabled(self) -> bool:
        return self._notifier.enabled and self.base_usec > 0

    @property
    def interval(self) -> float:
        """Seconds between pings: half of the current watchdog timeout (0 when disabled)."""
        return self._current_usec / 2_000_000 if self.enabled else 0.0

    def progress(self) -> bool:
        """Ping if half a period has passed since the last ping; True when a ping was sent."""
        if not self.enabled:
            return False
        now = self._clock()
        widened = self._current_usec != self.base_usec
        if not widened and self._last_ping is not None and now - self._last_ping < self.interval:
            return False
        lines = ["WATCHDOG=1"]
        if widened:
            # A long operation had widened the timeout; progress means it is over, so restore it now.
            self._current_usec = self.base_usec
            lines.append(f"WATCHDOG_USEC={self.base_usec}")
        self._last_ping = now
        return self._notifier.notify(*lines)

    def expect_delay(self, seconds: float) -> bool:
        """Before an operation that may take ``seconds`` without a step (a state download, a big
        checkpoint): ping now and widen the timeout so it covers it; the next ping restores it."""
        if not self.enabled:
            return False
        wanted = max(self.base_usec, _usec(seconds))
        self._current_usec = wanted
        self._last_ping = self._clock()
        return self._notifier.notify("WATCHDOG=1", f"WATCHDOG_USEC={wanted}")
