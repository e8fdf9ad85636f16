"""Who may take part in a run: one answer, ``is_admitted(peer_id)``, shared by every process of a node.

hivemind runs the DHT and each averager in processes forked from the node, and their request
handlers are where a stranger must be refused. :class:`AdmissionGate` keeps the admitted and
excluded peer IDs in shared memory created before those forks: the node (one writer) replaces
the lists when it learns something new (a manifest version, the run's member invites); every
process answers ``is_admitted`` from a local copy that it refreshes only when the lists changed,
so a lookup is a set membership test.

Open runs admit everyone not excluded (banned or revoked in the manifest); invite runs admit only
peers with a valid invite, less the excluded ones.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import struct
from collections.abc import Callable, Iterable
from typing import Literal

from p2ptrain.status import SwarmView
from p2ptrain.trust.swarm_view import summarize

logger = logging.getLogger(__name__)

Policy = Literal["open", "invite"]
#: Peer IDs each list can hold (16 bytes each, 64 KiB per list at the default).
DEFAULT_CAPACITY = 4096
_DIGEST = 16
_HEADER = struct.Struct("<QBII")  # generation, policy (0 open, 1 invite), admitted count, excluded count


def _digest(peer_id: object) -> bytes:
    return hashlib.blake2b(str(peer_id).encode(), digest_size=_DIGEST).digest()


class AdmissionGate:
    """Admitted and excluded peers, readable from any process forked after construction."""

    def __init__(self, policy: Policy = "open", capacity: int = DEFAULT_CAPACITY) -> None:
        ctx = mp.get_context("fork")
        self.capacity = capacity
        self._lock = ctx.Lock()
        self._buffer = ctx.RawArray("B", _HEADER.size + 2 * capacity * _DIGEST)
        self._local: tuple[int, bool, frozenset[bytes], frozenset[bytes]] = (-1, policy == "invite",
                                                                           frozenset(), frozenset())
        self._overflow_warned = False
        # Refusals happen in the averagers' processes; the node reads the count.
        self._refused = ctx.Value("q", 0)
        self.update(policy, (), ())

    def update(self, policy: Policy, admitted: Iterable[object], excluded: Iterable[object]) -> None:
        """Replace both lists (the node calls this; it is the only writer)."""
        admitted_digests = sorted({_digest(p) for p in admitted})
        excluded_digests = sorted({_digest(p) for p in excluded})
        if len(admitted_digests) > self.capacity or len(excluded_digests) > self.capacity:
            if not self._overflow_warned:
                logger.warning("admission lists hold %d admitted and %d excluded peers; only %d of each are "
                               "kept (invite runs then refuse the rest)", len(admitted_digests),
                               len(excluded_digests), self.capacity)
                self._overflow_warned = True
            admitted_digests = admitted_digests[: self.capacity]
            excluded_digests = excluded_digests[: self.capacity]
        view = memoryview(self._buffer).cast("B")
        with self._lock:
            generation = _HEADER.unpack_from(view, 0)[0] + 1
            _HEADER.pack_into(view, 0, generation, 1 if policy == "invite" else 0,
                              len(admitted_digests), len(excluded_digests))
            offset = _HEADER.size
            for digest in admitted_digests:
                view[offset:offset + _DIGEST] = digest
                offset += _DIGEST
            offset = _HEADER.size + self.capacity * _DIGEST
            for digest in excluded_digests:
                view[offset:offset + _DIGEST] = digest
                offset += _DIGEST

    def _snapshot(self) -> tuple[int, bool, frozenset[bytes], frozenset[bytes]]:
        local = self._local
        view = memoryview(self._buffer).cast("B")
        with self._lock:
            generation, policy, n_admitted, n_excluded = _HEADER.unpack_from(view, 0)
            if generation == local[0]:
                return local
            start = _HEADER.size
            admitted = bytes(view[start:start + n_admitted * _DIGEST])
            start = _HEADER.size + self.capacity * _DIGEST
            excluded = bytes(view[start:start + n_excluded * _DIGEST])
        local = (generation, policy == 1,
                 frozenset(admitted[i:i + _DIGEST] for i in range(0, len(admitted), _DIGEST)),
                 frozenset(excluded[i:i + _DIGEST] for i in range(0, len(excluded), _DIGEST)))
        self._local = local  # one assignment: a racing reader sees the old or the new tuple
        return local

    @property
    def policy(self) -> Policy:
        return "invite" if self._snapshot()[1] else "open"

    def is_excluded(self, peer_id: object) -> bool:
        return _digest(peer_id) in self._snapshot()[3]

    def is_admitted(self, peer_id: object) -> bool:
        """Whether ``peer_id`` (a str or a hivemind PeerID) may take part in the run now."""
        _, invite_only, admitted, excluded = self._snapshot()
        digest = _digest(peer_id)
        if digest in excluded:
            return False
        return digest in admitted if invite_only else True

    __call__ = is_admitted

    def count_refusal(self) -> None:
        """One request of a non-admitted peer refused (averaging, state download); any process."""
        with self._refused.get_lock():
            self._refused.value += 1

    @property
    def refused_total(self) -> int:
        """Averaging and state-sharing requests refused so far, in every process of the node."""
        return int(self._refused.value)


def filter_view(view: SwarmView, is_admitted: Callable[[str], bool]) -> tuple[SwarmView, int]:
    """The swarm view without the records of non-admitted peers, and how many were dropped.

    Records name their peer ID themselves; binding that claim to the signer is the records'
    job (see :mod:`p2ptrain.swarm.records`), this only keeps excluded peers out of the totals and lists.
    """
    kept = tuple(record for record in view.peers if is_admitted(record.peer_id))
    dropped = len(view.peers) - len(kept)
    if not dropped:
        return view, 0
    return summarize(kept, view.rejected_records_total), dropped
