"""Peer records on the wire and their summary, without a DHT."""

from __future__ import annotations

import math

from p2ptrain.status import PeerRecord
from p2ptrain.swarm.records import to_wire
from p2ptrain.trust.swarm_view import summarize


def _record(peer_id: str, sps: float, epoch: int) -> PeerRecord:
    return PeerRecord(peer_id=peer_id, version="0.1.0", state="training", epoch=epoch, samples_per_second=sps,
                      loss=2.5, val_loss=None, reachability="direct", uptime_seconds=12.0)


def test_to_wire_makes_strict_finite_types():
    wire = to_wire(PeerRecord(peer_id="p", epoch=2, samples_per_second=float("nan"), loss=float("inf"),
                              val_loss=1, uptime_seconds=3, published_at=5))
    assert wire["samples_per_second"] == 0.0 and wire["loss"] is None
    assert isinstance(wire["uptime_seconds"], float) and isinstance(wire["val_loss"], float)
    assert all(not isinstance(v, float) or math.isfinite(v) for v in wire.values())


def test_summarize_empty_and_non_training_peers():
    assert summarize(()).peers_online == 0
    paused = PeerRecord(peer_id="x", state="paused", samples_per_second=0.0, epoch=4)
    view = summarize((paused, _record("y", 2.0, 3)), rejected_total=7)
    assert (view.global_epoch, view.slowest_peer, view.fastest_peer) == (4, "y", "y")
    assert view.rejected_records_total == 7


def test_a_dht_node_holds_a_bounded_number_of_records_under_the_run_key_refreshes_first():
    """hivemind sends a key's whole dictionary in one message: a flood must not make it unreadable."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import get_dht_time

    from p2ptrain.dhtkeys import peers_key
    from p2ptrain.swarm.records import RejectCounter, SubkeyCapValidator

    key = DHTID.generate(source=peers_key("capped")).to_bytes()
    counter = RejectCounter()
    cap = SubkeyCapValidator(key, counter, cap=3)
    later = get_dht_time() + 60

    def record(subkey: bytes, key_id: bytes = key, until: float = later) -> DHTRecord:
        return DHTRecord(key=key_id, subkey=subkey, value=b"v", expiration_time=until)

    assert all(cap.validate(record(bytes([n]))) for n in range(3))
    assert not cap.validate(record(b"flood")) and counter.by_reason()["over_cap"] == 1
    assert cap.validate(record(bytes([1])))  # a record already held is always refreshed
    assert cap.validate(record(b"other", key_id=b"another key"))  # other keys are not this validator's
    expired = SubkeyCapValidator(key, counter, cap=1)
    assert expired.validate(record(b"old", until=get_dht_time() - 1))
    assert expired.validate(record(b"new"))  # the expired one made room
