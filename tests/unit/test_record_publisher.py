"""The record publisher: a newcomer's first swarm view arrives within a second, not a period or two."""

from __future__ import annotations

import threading
import time

from p2ptrain.daemon.record_publisher import RecordPublisher
from p2ptrain.status import LatestSnapshot, PeerRecord, StatusSnapshot, SwarmView
from p2ptrain.trust.evidence import PeerEvidence


class FakeBook:
    """A record book whose lookups come back empty ``empty_polls`` times, then with one peer."""

    def __init__(self, empty_polls: int) -> None:
        self.empty_polls = empty_polls
        self.polls = self.publishes = 0
        self.lock = threading.Lock()
        self.bound_keys: dict[bytes, str] = {}
        self.dht_peers: frozenset[str] = frozenset()

    def publish(self, record: PeerRecord, fingerprint: str = "") -> None:
        with self.lock:
            self.publishes += 1

    def poll(self) -> SwarmView:
        with self.lock:
            self.polls += 1
            if self.polls <= self.empty_polls:
                return SwarmView()
        return SwarmView(peers=(PeerRecord(peer_id="QmPeer", state="training", epoch=3),))


def start(book: FakeBook, period: float) -> tuple[RecordPublisher, PeerEvidence]:
    latest = LatestSnapshot()
    latest.publish(StatusSnapshot(peer_id="QmSelf"))
    evidence = PeerEvidence()
    publisher = RecordPublisher(book, latest, period=period, evidence=evidence)  # type: ignore[arg-type]
    publisher.start()
    return publisher, evidence


def test_the_first_view_is_polled_quickly_and_records_go_out_once_a_period() -> None:
    book = FakeBook(empty_polls=2)
    publisher, evidence = start(book, period=5.0)
    try:
        started = time.monotonic()
        assert evidence.records_seen.wait(3.0), "the first view with records took more than 3 s"
        assert time.monotonic() - started < 2.5
        time.sleep(1.2)  # the view is in: no more quick polls, and no second publish within the period
        assert book.polls == 3 and book.publishes == 1
        assert publisher.view.peers[0].peer_id == "QmPeer"
    finally:
        publisher.stop()


def test_quick_polls_stop_after_two_periods_when_no_record_ever_arrives() -> None:
    book = FakeBook(empty_polls=10**6)
    publisher, evidence = start(book, period=0.6)
    try:
        time.sleep(3.0)  # quick polls for 1.2 s (about 3), then one poll and one publish a period
        polls = book.polls
        assert not evidence.records_seen.is_set()
        assert 4 <= polls <= 3 + 4 + 1, polls
        assert 3 <= book.publishes <= 6, book.publishes
    finally:
        publisher.stop()
