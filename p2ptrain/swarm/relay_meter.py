"""What this node's p2p daemon relays for peers that cannot be dialled: read from the daemon's own metrics.

A node others can dial serves as a libp2p circuit relay for the run's peers behind NAT (libp2p turns
the service on only while AutoNAT finds the node public), within the budget of ``swarm.relay_*``
(:mod:`p2ptrain.swarm.daemon_flags`).  Every relayed byte passes through the daemon, not through this
process, so the daemon's counters (``libp2p_relaysvc_*``, served on 127.0.0.1) are the only true
figures: :class:`RelayMeter` reads them, at most every ``every`` seconds, bounded in time and size.
"""

from __future__ import annotations

import http.client
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Far above the daemon's whole metrics page (tens of KiB); a larger page is not its page.
MAX_PAGE_BYTES = 1 << 20
_PREFIX = "libp2p_relaysvc_"
_SAMPLE = re.compile(r'^libp2p_relaysvc_(\w+)(?:\{(\w+)="([^"]*)"\})?\s+(\S+)$')


@dataclass(frozen=True)
class RelayFigures:
    """The relay service as the daemon counts it; ``active`` None: its counters could not be read."""

    active: bool | None = None
    bytes_total: int = 0
    reservations: int = 0
    circuits: int = 0
    refused_total: int = 0


#: Nothing read (yet): no daemon counters behind these figures.
UNREAD = RelayFigures()


def parse_relay_metrics(page: str) -> RelayFigures:
    """The relay figures in a p2pd metrics page (Prometheus text format); lines that do not parse are
    skipped.  A libp2p page without the relay service's lines is a daemon without relays
    (``swarm.use_relay`` off): ``active=False``; a page with no libp2p line at all gives ``active=None``."""
    values: dict[tuple[str, str], float] = {}
    libp2p = False
    for line in page.splitlines():
        libp2p = libp2p or line.startswith("libp2p_")
        if not line.startswith(_PREFIX):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, _, label, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if value == value and 0 <= value < 1e18:  # finite, not negative: counters and a 0/1 status
            key = (name, label or "")
            values[key] = values.get(key, 0.0) + value

    def total(name: str) -> int:
        return int(sum(v for (n, _), v in values.items() if n == name))

    def held(name: str) -> int:
        return max(0, int(values.get((name, "opened"), 0) - values.get((name, "closed"), 0)))

    status = values.get(("status", ""))
    return RelayFigures(
        active=(False if libp2p else None) if status is None else status >= 1,
        bytes_total=total("data_transferred_bytes_total"),
        reservations=held("reservations_total"),
        circuits=held("connections_total"),
        refused_total=total("reservation_rejections_total") + total("connection_rejections_total"),
    )


def read_page(port: int, timeout: float = 1.0) -> str:
    """The daemon's metrics page from 127.0.0.1:``port``, straight (no proxy from the environment); raises
    OSError or ``http.client.HTTPException``, or ValueError for an error status or a page too large."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        if response.status != 200:
            raise ValueError(f"the p2p daemon's metrics page answered {response.status}")
        body: bytes = response.read(MAX_PAGE_BYTES + 1)
    finally:
        connection.close()
    if len(body) > MAX_PAGE_BYTES:
        raise ValueError(f"the p2p daemon's metrics page is over {MAX_PAGE_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


class RelayMeter:
    """The latest :class:`RelayFigures`, read again when older than ``every`` seconds.

    A failed read keeps the counters last read (they only grow) and reports ``active`` as unknown.
    """

    def __init__(self, port: int | None, *, every: float = 10.0, fetch: Callable[[int], str] = read_page,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._port, self._every, self._fetch, self._clock = port, every, fetch, clock
        self._figures = RelayFigures()
        self._read_at: float | None = None

    def figures(self) -> RelayFigures:
        if self._port is None:
            return self._figures
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._every:
            return self._figures
        self._read_at = now
        try:
            read = parse_relay_metrics(self._fetch(self._port))
        except (OSError, ValueError, http.client.HTTPException):
            read = RelayFigures()
        last = self._figures
        self._figures = RelayFigures(  # the counters never go back, even past a failed read
            active=read.active, bytes_total=max(last.bytes_total, read.bytes_total),
            reservations=read.reservations if read.active is not None else last.reservations,
            circuits=read.circuits if read.active is not None else last.circuits,
            refused_total=max(last.refused_total, read.refused_total))
        return self._figures
