"""The swarm's totals from a set of peer records: throughput, the epoch peers agree on, the slowest
and fastest trainer.  Pure: the records were checked before they got here."""

from __future__ import annotations

from collections.abc import Sequence

from p2ptrain.status import NodeState, PeerRecord, SwarmView


def agreed_epoch(epochs: Sequence[int]) -> int:
    """The highest epoch that at least two records agree on within 1; else the lower median.

    One record claiming a far higher epoch than everyone else moves nothing."""
    if not epochs:
        return 0
    supported = [c for c in set(epochs) if sum(abs(e - c) <= 1 for e in epochs) >= 2]
    if supported:
        return max(supported)
    ordered = sorted(epochs)
    return ordered[(len(ordered) - 1) // 2]


def summarize(peers: tuple[PeerRecord, ...], rejected_total: int = 0) -> SwarmView:
    """Totals of a set of records: throughput, the agreed epoch, slowest and fastest trainer."""
    trainers = [p for p in peers if p.state == NodeState.TRAINING and p.samples_per_second > 0]
    slowest = min(trainers, key=lambda p: (p.samples_per_second, p.peer_id)).peer_id if trainers else ""
    fastest = max(trainers, key=lambda p: (p.samples_per_second, p.peer_id)).peer_id if trainers else ""
    return SwarmView(
        peers=peers,
        swarm_samples_per_second=float(sum(p.samples_per_second for p in peers)),
        global_epoch=agreed_epoch([p.epoch for p in peers]),
        slowest_peer=slowest,
        fastest_peer=fastest,
        rejected_records_total=rejected_total,
    )
