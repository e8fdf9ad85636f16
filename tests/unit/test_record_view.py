"""The record book's view over lookups: a record a lookup misses stays a while, and not longer."""

from __future__ import annotations

from typing import Any

from p2ptrain.status import PeerRecord
from p2ptrain.swarm.records import RecordBook, record_validators

TTL = 20.0


class _Item:
    def __init__(self, value: Any, expiration_time: float) -> None:
        self.value, self.expiration_time = value, expiration_time


class _Found:
    def __init__(self, value: dict[bytes, _Item]) -> None:
        self.value = value


def _book() -> RecordBook:
    book = RecordBook(object(), "viewrun", record_validators("viewrun"), ttl=TTL)
    # The signature and field checks have tests of their own: here every entry is a valid record
    # published, as it claims, an hour in the future (a skewed clock must not keep it alive).
    book._check = lambda subkey, value, expiration, now: PeerRecord(  # type: ignore[method-assign]
        peer_id=value, state="training", published_at=now + 3600.0)
    return book


def _polled(book: RecordBook, now: float, *peers: str, expiration: float = 1e12) -> int:
    """The view a poll makes of a lookup that found ``peers`` (copies expiring at ``expiration``): how
    many peers it lists."""
    book._last_view = book._view(_Found({peer.encode(): _Item(peer, expiration) for peer in peers}), now)
    return book._last_view.peers_online


def test_a_record_a_lookup_misses_stays_for_ttl_after_it_was_last_found_then_goes() -> None:
    book = _book()
    assert _polled(book, 1000.0, "QmA", "QmB") == 2
    assert _polled(book, 1000.0 + TTL, "QmA") == 2  # missed once: a lookup returns one node's copy
    assert _polled(book, 1000.0 + TTL + 1, "QmA") == 1  # not found for longer than ttl: it left
    assert _polled(book, 1100.0, "QmA", "QmB") == 2  # back when found again


def test_a_copy_found_again_unchanged_does_not_keep_a_record_that_nobody_refreshes() -> None:
    """A public peer that left: the last copy of its record is in our DHT's cache, refreshed by nobody,
    and a lookup finds that copy (same expiration) until it expires."""
    book = _book()
    assert _polled(book, 1000.0, "QmA", "QmPublic", expiration=1020.0) == 2
    assert _polled(book, 1015.0, "QmA", "QmPublic", expiration=1020.0) == 2  # the same copy, from our cache
    assert _polled(book, 1020.0, "QmA") == 2  # expired now: carried, ttl after its fresher copy was found
    assert _polled(book, 1000.0 + TTL + 1, "QmA") == 1  # gone ttl after the last fresh copy, not the last find


def test_an_older_copy_a_lookup_returns_under_a_flood_does_not_cut_a_live_record_short() -> None:
    book = _book()
    assert _polled(book, 1000.0, "QmA", "QmB", expiration=1020.0) == 2
    assert _polled(book, 1010.0, "QmA", "QmB", expiration=1030.0) == 2  # refreshed
    assert _polled(book, 1012.0, "QmA", "QmB", expiration=1012.5) == 2  # one node's older copy
    assert _polled(book, 1029.0, "QmA") == 2  # missed: carried ttl after the fresh copy of 1010
    assert _polled(book, 1031.0, "QmA") == 1


def test_a_copy_dated_far_ahead_does_not_make_the_real_refreshes_look_stale() -> None:
    book = _book()
    assert _polled(book, 1000.0, "QmA", "QmB", expiration=1e12) == 2  # one copy claims to live for ever
    assert _polled(book, 1010.0, "QmA", "QmB", expiration=1030.0) == 2  # the real refresh: fresher than 1020
    assert _polled(book, 1029.0, "QmA") == 2  # carried ttl after the refresh of 1010, not after 1000
    assert _polled(book, 1031.0, "QmA") == 1
