"""Per-client request pacing for the local API: a generic cell rate algorithm with a short queue.

A client within its rate is served at once; one a little over it waits for its turn (at most
``max_wait`` seconds), so a burst from a well-behaved monitor is smoothed, not refused; one whose
turn is further away is refused (HTTP 429).  A waiting or refused client costs the server a
sleeping coroutine, not CPU, so however hard local readers pull, the node spends a bounded share
of its time answering them.  The table of clients is bounded too.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RateDecision:
    """What to do with one request: wait ``wait`` seconds then serve it, or refuse it
    (``refused``) and tell the client to come back after ``retry_after`` whole seconds."""

    wait: float
    refused: bool = False
    retry_after: int = 0


class ClientLimiter:
    """``rate`` requests per second per client, bursts of up to ``burst`` served at once."""

    def __init__(self, rate: float, burst: int, max_wait: float = 1.0, *, max_clients: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1 or max_wait < 0:
            raise ValueError("rate must be > 0, burst >= 1, max_wait >= 0")
        self.interval = 1.0 / rate
        self.tolerance = self.interval * (burst - 1)
        self.max_wait = max_wait
        self.max_clients = max_clients
        self.clock = clock
        #: Per client: the theoretical arrival time of its next request (GCRA's "TAT").
        self._due: OrderedDict[str, float] = OrderedDict()
        self.refused_total = 0

    def admit(self, client: str) -> RateDecision:
        now = self.clock()
        due = max(self._due.get(client, now), now)
        wait = due - self.tolerance - now
        if wait > self.max_wait:
            self.refused_total += 1
            return RateDecision(self.max_wait, refused=True, retry_after=max(1, math.ceil(wait - self.max_wait)))
        self._due[client] = due + self.interval
        self._due.move_to_end(client)
        self._forget_idle(now)
        return RateDecision(max(0.0, wait))

    def _forget_idle(self, now: float) -> None:
        """Keep the table bounded: drop clients whose budget is full again, then the least recent."""
        if len(self._due) <= self.max_clients:
            return
        for client in [c for c, due in self._due.items() if due <= now]:
            del self._due[client]
        while len(self._due) > self.max_clients:
            self._due.popitem(last=False)

    def __len__(self) -> int:
        return len(self._due)
