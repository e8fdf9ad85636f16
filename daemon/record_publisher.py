"""Publishes this node's peer record and refreshes its swarm view on a timer of its own.

A training step can block for up to ``averaging_timeout`` while hivemind waits on a round. If
records went out only between steps, a node would vanish from its peers' swarm views exactly
when the swarm is in trouble. This thread reads only the latest snapshot (never the node's
internals) and talks only to the DHT, so the one-way flow is kept: snapshot -> record -> DHT.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from p2ptrain.status import LatestSnapshot, PeerRecord, SwarmView
from p2ptrain.swarm.records import RecordBook
from p2ptrain.trust.evidence import PeerEvidence

logger = logging.getLogger(__name__)

RECORD_PERIOD = 5.0
#: Until the first view with records is in, the swarm view is polled this often (a newcomer's
#: catch-up waits for that view; at the full period it would wait up to two periods), for at most
#: two periods after start.
FIRST_VIEW_POLL = 0.5


class RecordPublisher:
    """Every ``period`` seconds: publish our record from the latest snapshot, and poll everyone's.

    With ``evidence`` (the node's peer checks), each view's records and their bound record keys are
    handed to it: they are what the checks take the run's peers' word from.  ``clock`` is monotonic
    seconds (tests drive :meth:`tick` with their own).
    """

    def __init__(self, book: RecordBook, latest: LatestSnapshot, period: float = RECORD_PERIOD,
                 evidence: PeerEvidence | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._book = book
        self._latest = latest
        self._evidence = evidence
        self._period = period
        self._clock = clock
        self._started: float | None = None
        self._next_publish = 0.0
        self._seen = False
        self._stop = threading.Event()
        self._view = SwarmView()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="p2ptrain-records", daemon=True)

    @classmethod
    def for_run(cls, dht: Any, run_id: str, validators: list[Any], latest: LatestSnapshot,
                evidence: PeerEvidence | None, period: float = RECORD_PERIOD) -> RecordPublisher:
        """The publisher of ``run_id``'s records on ``dht``, its book trusting the peers ``evidence``
        trusts (the peers this node joined through)."""
        book = RecordBook(dht, run_id, validators, trusted=evidence.trusted_peers if evidence is not None else None)
        return cls(book, latest, period=period, evidence=evidence)

    @property
    def view(self) -> SwarmView:
        with self._lock:
            return self._view

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then publish a last record: the node is leaving (its state says so), and its
        peers' views show that at their next read instead of a training peer until the record's TTL.
        The store is not waited for: a DHT that is slow now must not hold the node's exit up."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._period + 5)
        status = self._latest.status()
        if status.peer_id and self._started is not None:
            try:
                self._book.publish(PeerRecord.from_status(status), status.model_fingerprint)
            except Exception as exc:  # leaving goes on whatever the DHT says
                logger.debug("last peer record not published: %r", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.tick()):
            pass

    def tick(self) -> float:
        """One pass: publish our record when due, poll the view; returns the seconds until the next pass."""
        now = self._clock()
        if self._started is None:
            self._started = self._next_publish = now
        try:
            self._seen = self._publish_and_poll(publish=now >= self._next_publish) or self._seen
        except Exception as exc:  # the DHT being slow or odd must never stop the node
            logger.warning("peer records unavailable: %r", exc)
        if now >= self._next_publish:
            self._next_publish = now + self._period
        quick = not self._seen and now - self._started < 2 * self._period
        return min(FIRST_VIEW_POLL, self._period) if quick else max(0.0, self._next_publish - now)

    def _publish_and_poll(self, *, publish: bool = True) -> bool:
        """Publish our record (when due) and poll the swarm view; whether the view has records."""
        status = self._latest.status()
        if publish and status.peer_id:
            self._book.publish(PeerRecord.from_status(status), status.model_fingerprint)
        view = self._book.poll()
        if self._evidence is not None and view.peers:
            self._evidence.update_records(view.peers, self._book.bound_keys, self._book.dht_peers)
        with self._lock:
            self._view = view
        return bool(view.peers)
