"""The record publisher: a newcomer's first swarm view arrives within a second, not a period or two."""

from __future__ import annotations

import threading

import pytest

from p2ptrain.daemon.record_publisher import RecordPublisher
from p2ptrain.status import LatestSnapshot, PeerRecord, StatusSnapshot, SwarmView
from p2ptrain.trust.evidence import PeerEvidence
from tests.support.clock import ManualClock


class FakeBook:
    """A record book whose lookups come back empty ``empty_polls`` times, then with one peer."""

    def __init__(self, empty_polls: int) -> None:
        self.empty_polls = empty_polls
        self.polls = self.publishes = 0
        self.lock = threading.Lock()
        self.bound_keys: dict[bytes, str] = {}
        self.dht_peers: frozenset[str] = frozenset()
        self.polled = threading.Event()
        self.last_state = ""

    def publish(self, record: PeerRecord, fingerprint: str = "") -> None:
        with self.lock:
            self.publishes += 1
            self.last_state = record.state

    def poll(self) -> SwarmView:
        with self.lock:
            self.polls += 1
            self.polled.set()
            if self.polls <= self.empty_polls:
                return SwarmView()
        return SwarmView(peers=(PeerRecord(peer_id="QmPeer", state="training", epoch=3),))


def publisher(book: FakeBook, period: float, clock: ManualClock | None = None) -> tuple[RecordPublisher, PeerEvidence]:
    latest = LatestSnapshot()
    latest.publish(StatusSnapshot(peer_id="QmSelf"))
    evidence = PeerEvidence()
    kwargs = {"clock": clock} if clock is not None else {}
    return RecordPublisher(book, latest, period=period, evidence=evidence, **kwargs), evidence  # type: ignore[arg-type]


def passes_until(records: RecordPublisher, clock: ManualClock, end: float) -> list[float]:
    """Run the publisher's passes on ``clock`` as its thread would, until ``end``; when each one ran."""
    when = []
    while clock.now < end:
        when.append(clock.now - 1000.0)
        clock.now += records.tick()
        assert len(when) < 1000, "the publisher never waits"
    return when


def test_the_first_view_is_polled_quickly_and_records_go_out_once_a_period() -> None:
    book, clock = FakeBook(empty_polls=2), ManualClock(1000.0)
    records, evidence = publisher(book, period=5.0, clock=clock)
    # Two empty views, polled half a second apart; the third has the peer: from then on one pass
    # (a poll and a publish) a period.
    assert passes_until(records, clock, 1001.0) == [0.0, 0.5]
    assert not evidence.records_seen.is_set()
    assert passes_until(records, clock, 1010.0) == [1.0, 5.0]
    assert evidence.records_seen.is_set()
    assert book.polls == 4 and book.publishes == 2
    assert records.view.peers[0].peer_id == "QmPeer"


def test_quick_polls_stop_after_two_periods_when_no_record_ever_arrives() -> None:
    book, clock = FakeBook(empty_polls=10**6), ManualClock(1000.0)
    records, evidence = publisher(book, period=0.6, clock=clock)
    # Quick polls (every 0.5 s) for two periods (1.2 s), then one poll and one publish a period.
    assert passes_until(records, clock, 1003.0) == pytest.approx([0.0, 0.5, 1.0, 1.5, 1.6, 2.2, 2.8])
    assert not evidence.records_seen.is_set()
    assert book.polls == 7 and book.publishes == 5  # every pass but the quick ones between two publishes


def test_a_failing_book_is_logged_and_the_passes_go_on(caplog) -> None:
    class Broken(FakeBook):
        def poll(self) -> SwarmView:
            raise TimeoutError("the DHT is slow")

    clock = ManualClock(1000.0)
    records, _ = publisher(Broken(empty_polls=0), period=5.0, clock=clock)
    assert passes_until(records, clock, 1001.0) == [0.0, 0.5]
    assert caplog.text.count("peer records unavailable") == 2


def test_the_thread_runs_the_passes_and_a_stop_ends_its_wait_at_once() -> None:
    book = FakeBook(empty_polls=0)
    records, evidence = publisher(book, period=3600.0)  # the real clock: the next pass is an hour away
    records.start()
    try:
        assert book.polled.wait(30), "the thread never polled"
    finally:
        records.stop()  # joins for up to period + 5 s if the stop did not end the wait
    assert not records._thread.is_alive()
    assert book.publishes == 2 and evidence.records_seen.is_set()  # the pass, and the last record on leaving


def test_a_leaving_node_publishes_a_last_record_that_says_so() -> None:
    """Its peers see it leave at their next read, not a training peer until the record's TTL."""
    book, clock = FakeBook(empty_polls=0), ManualClock(1000.0)
    records, _ = publisher(book, period=5.0, clock=clock)
    records.tick()
    assert (book.publishes, book.last_state) == (1, "starting")
    records._latest.publish(StatusSnapshot(peer_id="QmSelf", state="stopping"))
    records.stop()
    assert (book.publishes, book.last_state) == (2, "stopping")


def test_a_node_that_never_published_says_nothing_when_it_stops() -> None:
    book = FakeBook(empty_polls=0)
    records, _ = publisher(book, period=5.0, clock=ManualClock(1000.0))
    records.stop()
    assert book.publishes == 0
