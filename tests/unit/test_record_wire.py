"""Peer records on the wire and their summary, without a DHT."""

from __future__ import annotations

import math

from p2ptrain.records import summarize, to_wire
from p2ptrain.status import PeerRecord


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
