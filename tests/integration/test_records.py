"""Signed peer records through real hivemind DHT nodes on 127.0.0.1: good ones seen, bad ones counted."""

from __future__ import annotations

import contextlib
import time

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.records import (
    MAX_RECORD_BYTES,
    PeerRecordModel,
    RecordBook,
    peers_key,
    record_validators,
    to_wire,
)
from p2ptrain.status import PeerRecord
from p2ptrain.waiting import WaitTimeout, wait_until

RUN = "records-test"
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False}


def _dht(initial_peers=(), validators=()) -> hivemind.DHT:
    return hivemind.DHT(initial_peers=list(initial_peers), start=True, record_validators=list(validators),
                        **LOOPBACK)


def _record(peer_id: str, sps: float, epoch: int, **extra) -> PeerRecord:
    return PeerRecord(peer_id=peer_id, version="0.1.0", state="training", epoch=epoch, samples_per_second=sps,
                      loss=2.5, val_loss=None, reachability="direct", uptime_seconds=12.0, **extra)


@pytest.fixture(scope="module")
def swarm():
    """A and B are honest nodes; C is a forger whose DHT signs with its own key and checks nothing else."""
    val_a = record_validators(RUN, RSAPrivateKey())
    val_b = record_validators(RUN, RSAPrivateKey())
    forger_key = RSAPrivateKey()
    dhts = []
    try:
        a = _dht(validators=val_a)
        dhts.append(a)
        maddrs = [str(m) for m in a.get_visible_maddrs()]
        b = _dht(maddrs, val_b)
        dhts.append(b)
        c = _dht(maddrs, [RSASignatureValidator(forger_key)])
        dhts.append(c)
        yield a, b, c, val_a, val_b, forger_key
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


def test_honest_records_seen_forged_malformed_oversized_stale_dropped_and_counted(swarm):
    a, b, c, val_a, val_b, forger_key = swarm
    book_a = RecordBook(a, RUN, val_a, ttl=30.0)
    book_b = RecordBook(b, RUN, val_b, ttl=30.0)
    book_a.publish(_record("peer-a", 10.0, 3))
    book_b.publish(_record("peer-b", 30.0, 5))
    view = _wait_for_peers(book_a, 2)
    assert [p.peer_id for p in view.peers] == ["peer-a", "peer-b"]
    assert view.rejected_records_total == 0

    now = time.time()
    key = peers_key(RUN)
    forger_pub = RSASignatureValidator(forger_key).local_public_key
    b_pub = val_b[1].local_public_key
    good = to_wire(_record("peer-b", 1000.0, 99, published_at=now))
    # Forged: claims B's key; the fake signature can never verify against it.
    forged = dict(good, version="[signature:Zm9yZ2Vk]")
    assert c.store(key, forged, now + 30, subkey=b_pub) is False
    # Malformed: properly signed by the forger, but not a PeerRecord.
    assert c.store(key, {"peer_id": 5}, now + 30, subkey=forger_pub + b"bad") is False
    # Oversized: properly signed, far beyond the size limit.
    huge = dict(to_wire(_record("peer-c", 1.0, 1, published_at=now)), version="x" * (4 * MAX_RECORD_BYTES))
    assert c.store(key, huge, now + 30, subkey=forger_pub + b"big") is False
    # Well-formed and signed, so the DHT accepts it, but published an hour in the future: we drop it.
    future = to_wire(_record("peer-c", 5.0, 7, published_at=now + 3600))
    assert c.store(key, future, now + 30, subkey=forger_pub) is True

    view = book_a.read()
    assert [p.peer_id for p in view.peers] == ["peer-a", "peer-b"]
    assert view.peers[1].epoch == 5 and view.peers[1].samples_per_second == 30.0
    assert view.swarm_samples_per_second == pytest.approx(40.0)
    assert view.global_epoch == 5
    assert (view.slowest_peer, view.fastest_peer) == ("peer-a", "peer-b")
    assert view.rejected_records_total == 4 == book_a.rejected_total
    # Reading again sees the same bad records but does not count them twice.
    assert book_a.read().rejected_records_total == 4
    # poll() never waits: the first call only starts a lookup, a later one returns its result.
    assert book_b.poll().peers_online == 0
    polled = wait_until(lambda: (view := book_b.poll()).peers_online >= 2 and view, 10, "two peers polled",
                        interval=0.1)
    assert [p.peer_id for p in polled.peers] == ["peer-a", "peer-b"]


def test_publish_refuses_oversized_own_record_and_stamps_time(swarm):
    a, _b, _c, val_a, _val_b, _key = swarm
    now = 1_700_000_000.0
    book = RecordBook(a, RUN + "-own", val_a, clock=lambda: now)
    assert book._key == peers_key(RUN + "-own")
    wire = to_wire(PeerRecord.from_dict({**_record("p", 1.0, 1).to_dict(), "published_at": now}))
    assert PeerRecordModel.parse_obj(wire).dict() == wire
    with pytest.raises(ValueError, match="record_validators"):
        RecordBook(a, RUN, [RSASignatureValidator(RSAPrivateKey())])
