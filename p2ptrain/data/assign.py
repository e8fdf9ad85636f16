"""Which peer reads which shard: rendezvous (highest-random-weight) hashing, reshuffled each pass.

Every peer scores every ``(pass, shard, peer)`` triple with the same hash, and a shard belongs to
the live peer with the highest score.  Peers that see the same live set therefore split the
shards into disjoint sets that together cover all of them, without talking to each other; when
a peer joins or leaves, only the shards it wins or held move.  The pass number is part of the
hash, so each pass hands every peer a fresh mix of the data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

#: A live-peer list longer than this is cut (sorted first, so every node cuts the same way).
MAX_PEERS = 4096
MAX_PEER_ID_CHARS = 128


def weight(pass_number: int, shard_id: str, peer_id: str) -> int:
    """The rendezvous score of ``peer_id`` for ``shard_id`` in pass ``pass_number``."""
    digest = hashlib.blake2b(f"{pass_number}\x1f{shard_id}\x1f{peer_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(pass_number: int, shard_id: str, peers: Sequence[str]) -> str:
    """The peer that reads ``shard_id`` in this pass (ties, which need a hash collision, go to the smaller ID)."""
    return max(peers, key=lambda peer: (weight(pass_number, shard_id, peer), peer))


def owned_shards(pass_number: int, shard_ids: Iterable[str], peers: Sequence[str], me: str) -> list[str]:
    """The shards of ``shard_ids`` that ``me`` reads in this pass, given the live ``peers``."""
    live = sorted(set(peers) | {me})
    return [shard for shard in shard_ids if owner(pass_number, shard, live) == me]


def clean_peers(raw: object, me: str) -> tuple[str, ...]:
    """A bounded, sorted, de-duplicated live set that always contains ``me``.

    The list comes from the node's swarm view; anything that is not a short string is dropped,
    so a malformed entry cannot break the assignment.
    """
    found = {me}
    if isinstance(raw, Iterable) and not isinstance(raw, str | bytes):
        for peer in raw:
            if isinstance(peer, str) and 0 < len(peer) <= MAX_PEER_ID_CHARS:
                found.add(peer)
    ordered = sorted(found)
    if len(ordered) > MAX_PEERS:
        ordered = sorted([me, *[peer for peer in ordered if peer != me][: MAX_PEERS - 1]])
    return tuple(ordered)
