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


def test_a_record_whose_found_copy_expires_leaves_the_view_then_not_ttl_after_the_lookup() -> None:
    """A public peer that left: the last copy of its record is in our DHT's cache, refreshed by nobody."""
    book = _book()
    assert _polled(book, 1000.0, "QmA", "QmPublic", expiration=1005.0) == 2
    assert _polled(book, 1004.0, "QmA", "QmPublic", expiration=1005.0) == 2  # the cached copy, found again
    assert _polled(book, 1005.0, "QmA") == 2  # missed, not expired yet
    assert _polled(book, 1006.0, "QmA") == 1  # its copy expired: gone, 14 s before ttl after the lookup
