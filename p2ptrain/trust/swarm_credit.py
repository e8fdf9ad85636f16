"""The swarm's credit and data coverage, from its peers' records, with every claim bounded.

A record's ``samples_contributed`` and shard counts are what that peer says about itself, and
identities are free.  The record checks (:mod:`p2ptrain.swarm.recordcheck`) refuse values no node
could have (counts beyond their bounds, more shards read than there are); here:

- **samples**: a peer is credited only what this node can vouch for (:mod:`p2ptrain.trust.vouching`:
  its share of this node's rounds, or what the peers this node joined through vouch for), never its
  own claim; the claims are summed apart (``samples_claimed``), labelled as claims.  Both are held to
  the run's pace: a peer cannot have contributed more than ``(epochs + 1) x`` the most samples one
  peer can put into one epoch (:func:`epoch_samples_bound`), its epoch taken as at most one past the
  swarm's epoch as the optimizer believes it (robust against peers that agree on a far-off epoch
  among themselves), not as the records' majority has it.
- **coverage**: only records of the same shard list (``data_source``, ``shards_total``) as this
  node's are combined; the swarm's pass is the lower median of their passes (one peer far ahead or
  behind moves nothing); each count is at most ``shards_total`` and so is their sum.

Peers' pass counters drift apart (their shares of a pass differ in size), so a record carries the
shards read in its current pass and in each of the few passes before it; the coverage of pass X is
the sum of what every peer reports for X.  Rendezvous hashing gives peers that see the same live set
disjoint shares of a pass, so the sum is the union; when the live set changed during the pass (a
peer joined or left) a shard may be read twice, and the figure can run ahead of the truth until the
pass ends.  Standard library only.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from p2ptrain.status import PeerRecord, SwarmView
from p2ptrain.trust.vouching import Vouchers, vouched_credit

#: How far a DiLoCo peer may out-train one round's length (as the robust reduce allows).
DILOCO_SPEED_RATIO = 16


def epoch_samples_bound(training: Any) -> int:
    """The most samples one peer can put into one epoch (DiLoCo: outer round) of this run's config.

    Gradient mode: an epoch ends when the swarm has ``target_batch_size`` samples, so one peer
    holds at most that, plus the steps its progress reports lag by (twice over, to be generous).
    DiLoCo: a round is ``inner_steps`` inner batches of the fastest peer (the pace is bounded by
    ``p2ptrain.trust.pace.SPREAD``); no peer does ``DILOCO_SPEED_RATIO`` times that.
    """
    batch = int(training.batch_size)
    if getattr(training, "mode", "gradient") == "diloco":
        # TrainingSection.inner_batch: inner_batch_size or its automatic value (config imports pydantic).
        inner = int(getattr(training, "inner_batch", 0) or getattr(training, "inner_batch_size", 0) or batch)
        return DILOCO_SPEED_RATIO * int(training.inner_steps) * inner
    return 2 * (int(training.target_batch_size) + batch)


def credit_cap(record: PeerRecord, swarm_epoch: int, samples_per_epoch: int) -> int:
    """The most ``record`` may be credited with (``samples_per_epoch`` 0: no cap)."""
    if samples_per_epoch <= 0:
        return sys.maxsize
    return (min(record.epoch, swarm_epoch + 1) + 1) * samples_per_epoch


def credited_view(view: SwarmView, samples_per_epoch: int, own_peer: str = "", *,
                  vouchers: Vouchers | None = None, swarm_epoch: int | None = None) -> SwarmView:
    """``view`` with each peer's ``samples_contributed`` as credited and the swarm's totals filled in.

    ``vouchers``: what this node can vouch for (None: the peer checks are off, and each record's claim is
    credited, bounded).  ``swarm_epoch``: the swarm's epoch as the optimizer believes it, which the view
    then shows and bounds credit by (None: the records' agreed epoch)."""
    epoch = view.global_epoch if swarm_epoch is None else swarm_epoch
    vouched = vouched_credit(view.peers, vouchers, own_peer) if vouchers is not None else None
    peers, claimed = [], 0
    for p in view.peers:
        cap = credit_cap(p, epoch, samples_per_epoch)
        claimed += min(p.samples_contributed, cap)
        figure = p.samples_contributed if vouched is None else vouched.get(p.peer_id, 0)
        peers.append(dataclasses.replace(p, samples_contributed=max(0, min(figure, cap))))
    data_pass, coverage, last, total = coverage_of(peers, own_peer)
    return dataclasses.replace(view, peers=tuple(peers), global_epoch=epoch,
                               samples_contributed=sum(p.samples_contributed for p in peers),
                               samples_claimed=claimed, data_pass=data_pass, data_coverage=coverage,
                               data_last_pass_coverage=last, shards_total=total)


def coverage_of(peers: Sequence[PeerRecord], own_peer: str = "") -> tuple[int, float | None, float | None, int]:
    """(the swarm's pass, share of it read, share of the pass before read, shards) over ``peers``.

    The swarm's pass is the lower median of the peers' passes: the pass the swarm is still finishing.
    The shard list is this node's (``own_peer``) if it has one in view, else the one most peers read.
    A peer too far ahead to still report a pass counts nothing for it (the figure is then low).
    """
    sharded = [p for p in peers if p.shards_total > 0 and p.data_source]
    if not sharded:
        return 0, None, None, 0
    lists = Counter((p.data_source, p.shards_total) for p in sharded)
    own = next(((p.data_source, p.shards_total) for p in sharded if own_peer and p.peer_id == own_peer), None)
    source, total = own if own is not None else max(lists, key=lambda key: (lists[key], key))
    same = [p for p in sharded if (p.data_source, p.shards_total) == (source, total)]
    passes = sorted(p.data_pass for p in same)
    current = passes[(len(passes) - 1) // 2]

    def read(pass_number: int) -> int:
        counts = 0
        for p in same:
            reported = (p.shards_consumed, *p.past_pass_shards)
            behind = p.data_pass - pass_number
            if 0 <= behind < len(reported):
                counts += min(reported[behind], total)
        return min(total, counts)

    last = read(current - 1) / total if current > 0 else None
    return current, read(current) / total, last, total
