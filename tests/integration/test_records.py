"""Signed peer records: bound to libp2p identities, bounded, capped; bad ones dropped and counted by reason."""

from __future__ import annotations

import contextlib
import time

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.dhtkeys import peers_key
from p2ptrain.status import PeerRecord
from p2ptrain.swarm.identity import IdentityKey
from p2ptrain.swarm.records import (
    MAX_RECORD_BYTES,
    PeerRecordModel,
    RecordBook,
    binding_message,
    bound_fingerprints,
    record_validators,
    to_wire,
)
from p2ptrain.trust.swarm_view import agreed_epoch
from p2ptrain.waiting import WaitTimeout, wait_until

RUN = "records-test"
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False}


def _dht(identity_path=None, initial_peers=(), validators=()) -> hivemind.DHT:
    extra = {"identity_path": str(identity_path)} if identity_path else {}
    return hivemind.DHT(initial_peers=list(initial_peers), start=True, record_validators=list(validators),
                        **LOOPBACK, **extra)


def _record(peer_id: str, sps: float, epoch: int, **extra) -> PeerRecord:
    return PeerRecord(peer_id=peer_id, version="0.1.0", state="training", epoch=epoch, samples_per_second=sps,
                      loss=2.5, val_loss=None, reachability="direct", uptime_seconds=12.0, **extra)


def _bound(identity: IdentityKey, record_key: bytes, record: PeerRecord, run: str = RUN, **extra) -> dict:
    """A record as a node publishes it: the fields, its identity key and the identity's proof."""
    return {**to_wire(record), "identity_key": identity.public_key,
            "key_proof": identity.sign(binding_message(run, record_key)), **extra}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """A and B are honest nodes with identity files; C is a forger whose DHT only checks signatures."""
    root = tmp_path_factory.mktemp("identities")
    ids = {name: IdentityKey.generate() for name in "abc"}
    for name, identity in ids.items():
        identity.write(root / f"{name}.key")
    val_a = record_validators(RUN, RSAPrivateKey())
    val_b = record_validators(RUN, RSAPrivateKey())
    forger_key = RSAPrivateKey()
    dhts = []
    try:
        a = _dht(root / "a.key", validators=val_a)
        dhts.append(a)
        maddrs = [str(m) for m in a.get_visible_maddrs()]
        b = _dht(root / "b.key", maddrs, val_b)
        dhts.append(b)
        c = _dht(root / "c.key", maddrs, [RSASignatureValidator(forger_key)])
        dhts.append(c)
        yield a, b, c, val_a, val_b, forger_key, ids
    finally:
        for dht in dhts:
            dht.shutdown()
        for dht in dhts:
            dht.join(timeout=10)


def _wait_for_peers(book: RecordBook, count: int, timeout: float = 15.0):
    """The view once it lists ``count`` peers (the last view read, if it never does)."""
    views = [book.read()]

    def enough() -> bool:
        views.append(book.read())
        return views[-1].peers_online >= count

    with contextlib.suppress(WaitTimeout):
        wait_until(enough, timeout, f"{count} peers", interval=0.2)
    return views[-1]


def test_bound_records_seen_forged_unbound_impersonating_and_malformed_dropped_and_counted(swarm):
    a, b, c, val_a, val_b, forger_key, ids = swarm
    pa, pb = str(a.peer_id), str(b.peer_id)
    assert (pa, pb) == (ids["a"].peer_id, ids["b"].peer_id)
    book_a = RecordBook(a, RUN, val_a, ttl=30.0, fingerprint="aaaa")  # identity read from the DHT's key file
    book_b = RecordBook(b, RUN, val_b, ttl=30.0, fingerprint="aaaa")
    book_a.publish(_record(pa, 10.0, 5))
    book_b.publish(_record(pb, 30.0, 6))
    view = _wait_for_peers(book_a, 2)
    assert [p.peer_id for p in view.peers] == sorted([pa, pb])
    assert view.rejected_records_total == 0

    now = time.time()
    key = peers_key(RUN)
    forger_pub = RSASignatureValidator(forger_key).local_public_key
    b_pub = val_b[1].local_public_key
    good = to_wire(_record(pb, 1000.0, 99, published_at=now))
    # Forged: claims B's record key; the fake signature can never verify against it.
    assert c.store(key, dict(good, version="[signature:Zm9yZ2Vk]"), now + 30, subkey=b_pub) is False
    # Malformed: properly signed by the forger, but not a PeerRecord.
    assert c.store(key, {"peer_id": 5}, now + 30, subkey=forger_pub + b"bad") is False
    # Oversized: properly signed, far beyond the size limit.
    huge = dict(to_wire(_record("peer-c", 1.0, 1, published_at=now)), version="x" * (4 * MAX_RECORD_BYTES))
    assert c.store(key, huge, now + 30, subkey=forger_pub + b"big") is False
    # Absurd numbers: the schema bounds every field, so the DHT drops it.
    absurd = _bound(ids["c"], forger_pub, _record(ids["c"].peer_id, 1.0, 2**63 - 1, published_at=now))
    assert c.store(key, absurd, now + 30, subkey=forger_pub + b"abs") is False
    # The rest are signed and well-formed, so the DHT keeps them, but the view drops them.  The forger
    # has one record key, so each replaces the one before (a later expiration wins) and is read in turn:
    # B's peer ID under the forger's key, bound with the forger's own identity (impersonation);
    impostor = _bound(ids["c"], forger_pub, _record(pb, 1e6, 999_999, published_at=now))
    # a record with no identity binding at all; a bound record published an hour in the future.
    unbound = to_wire(_record(ids["c"].peer_id, 5.0, 7, published_at=now))
    future = _bound(ids["c"], forger_pub, _record(ids["c"].peer_id, 5.0, 7, published_at=now + 3600))
    for offset, junk in enumerate((impostor, unbound, future)):
        assert c.store(key, junk, now + 30 + offset, subkey=forger_pub) is True
        assert [p.peer_id for p in book_a.read().peers] == sorted([pa, pb])

    view = book_a.read()
    assert [p.peer_id for p in view.peers] == sorted([pa, pb])
    by_peer = {p.peer_id: p for p in view.peers}
    assert by_peer[pb].epoch == 6 and by_peer[pb].samples_per_second == 30.0
    assert view.swarm_samples_per_second == pytest.approx(40.0)
    assert view.global_epoch == 6
    assert (view.slowest_peer, view.fastest_peer) == (pa, pb)
    reasons = book_a.rejected_by_reason()
    assert {r: n for r, n in reasons.items() if n} == {"signature": 1, "schema": 2, "size": 1, "wrong_identity": 1,
                                                       "unbound": 1, "future": 1}
    assert view.rejected_records_total == 7 == book_a.rejected_total
    # Reading again sees the same bad records but does not count them twice.
    assert book_a.read().rejected_records_total == 7
    # poll() never waits: the first call only starts a lookup, a later one returns its result.
    assert book_b.poll().peers_online == 0
    polled = wait_until(lambda: (view := book_b.poll()).peers_online >= 2 and view, 10, "two peers polled",
                        interval=0.1)
    assert [p.peer_id for p in polled.peers] == sorted([pa, pb])
    # The fingerprints the bound records name (the forger's impersonation names none).
    assert bound_fingerprints(a.get(key, latest=True), RUN, time.time()) == {pa: "aaaa", pb: "aaaa"}


def test_publish_refuses_oversized_own_record_and_stamps_time(swarm):
    a, _b, _c, val_a, _val_b, _key, _ids = swarm
    now = 1_700_000_000.0
    book = RecordBook(a, RUN + "-own", val_a, clock=lambda: now)
    assert book._key == peers_key(RUN + "-own")
    wire = to_wire(PeerRecord.from_dict({**_record("p", 1.0, 1).to_dict(), "published_at": now}))
    assert PeerRecordModel.parse_obj(wire).dict() == wire
    with pytest.raises(ValueError, match="record_validators"):
        RecordBook(a, RUN, [RSASignatureValidator(RSAPrivateKey())])


class _NoDht:
    """RecordBook's view logic needs no DHT: records are handed to ``_view`` directly."""

    def store(self, *args, **kwargs):
        raise AssertionError("not used")


class _Item:
    def __init__(self, value, expiration_time):
        self.value, self.expiration_time = value, expiration_time


class _Found:
    def __init__(self, value):
        self.value = value


@pytest.fixture(scope="module")
def identities():
    return [IdentityKey.generate() for _ in range(4)]


def _entries(identities, now, epochs):
    entries = {}
    for index, (identity, epoch) in enumerate(zip(identities, epochs, strict=False)):
        record_key = RSASignatureValidator(RSAPrivateKey()).local_public_key if index == 0 else \
            RSASignatureValidator(RSAPrivateKey()).local_public_key
        entries[record_key] = _Item(_bound(identity, record_key, _record(identity.peer_id, 1.0, epoch,
                                                                         published_at=now)), now + 30)
    return entries


def test_view_is_capped_keeps_known_peers_and_counts_the_overflow(identities):
    now = time.time()
    book = RecordBook(_NoDht(), RUN, record_validators(RUN), max_records=2)
    entries = _entries(identities[:3], now, [5, 5, 6])
    first = book._view(_Found(entries), now)
    assert first.peers_online == 2 and book.rejected_by_reason()["over_cap"] == 1
    book._last_view = first
    entries.update(_entries(identities[3:], now + 1, [6]))
    second = book._view(_Found(entries), now + 1)
    assert {p.peer_id for p in second.peers} == {p.peer_id for p in first.peers}  # known peers stay listed
    assert book.rejected_by_reason()["over_cap"] == 2


def test_a_record_bound_for_another_run_is_not_accepted(identities):
    now = time.time()
    book = RecordBook(_NoDht(), RUN, record_validators(RUN))
    record_key = RSASignatureValidator(RSAPrivateKey()).local_public_key
    replayed = _bound(identities[0], record_key, _record(identities[0].peer_id, 1.0, 3, published_at=now),
                      run="another-run")
    view = book._view(_Found({record_key: _Item(replayed, now + 30)}), now)
    assert view.peers_online == 0 and book.rejected_by_reason()["wrong_identity"] == 1


@pytest.mark.parametrize(("epochs", "expected"), [
    ([], 0), ([7], 7), ([40, 41, 9_223_372_036], 41), ([40, 5000], 40), ([3, 9, 20], 9)])
def test_the_swarm_epoch_is_what_records_agree_on(epochs, expected):
    assert agreed_epoch(epochs) == expected
