"""The held-out split: which shards are validation, and the fixed validation windows cut from them.

Shards are assigned to train or validation by a SHA-256 of their ID (a path relative to the
corpus root, a name in the index), so the split is identical on every node and independent of
listing order or location.  Validation reads a bounded prefix of every held-out shard, so it
costs the same memory whatever the dataset's size, and cuts the same windows on every node.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import torch

from p2ptrain.data.readers import RecordFailure, ShardMalformed, ShardUnreadable, read_prefix
from p2ptrain.data.sources import ShardRef

log = logging.getLogger(__name__)

VALIDATION_MAX_SHARDS = 64
"""Held-out shards read for validation at most (the first by ID): a bound on downloads and start-up time."""


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` via SHA-256: the same in every process (unlike ``hash()``)."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def is_validation(key: str, fraction: float) -> bool:
    """Whether the shard named ``key`` is held out for validation."""
    score = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return score < fraction


def split_shards(shards: Sequence[ShardRef], fraction: float) -> tuple[list[ShardRef], list[ShardRef]]:
    """(train, validation) shards, each sorted by ID.

    When the hash puts every shard on one side, the shard with the lowest (highest) score moves
    to validation (train) so both sides have data; still deterministic.
    """
    ordered = sorted(shards, key=lambda shard: shard.id)
    held = {shard.id for shard in ordered if is_validation(shard.id, fraction)}
    if len(ordered) >= 2 and len(held) in (0, len(ordered)):
        by_score = sorted(ordered, key=lambda shard: hashlib.sha256(shard.id.encode()).digest())
        if held:
            held.discard(by_score[-1].id)
        else:
            held.add(by_score[0].id)
    return [s for s in ordered if s.id not in held], [s for s in ordered if s.id in held]


def validation_text(shards: Sequence[ShardRef], files: Any, cap: int, block_bytes: int, text_field: str) -> bytes:
    """Up to ``cap`` bytes: an equal share from the start of each held-out shard, in ID order.

    A held-out shard that cannot be read is left out with a warning (the node still starts), and
    records that do not decode are skipped with one (the shard's first named);
    every node that can read the same shards gets the same text.
    """
    chosen = list(shards)[:VALIDATION_MAX_SHARDS]
    if not chosen:
        return b""
    quota = max(1, cap // len(chosen))
    parts: list[bytes] = []
    for shard in chosen:
        failed: list[RecordFailure] = []
        try:
            parts.append(bytes(read_prefix(shard, files.local_path(shard), quota, block_bytes, text_field, failed)))
        except (ShardUnreadable, ShardMalformed) as exc:
            log.warning("validation shard %s left out: %s", shard.id, exc)
        if failed:
            log.warning("validation shard %s: %d record(s) skipped, the first: %s", shard.id,
                        sum(failure.count for failure in failed), failed[0].reason)
    return b"".join(parts)


def validation_windows(data: torch.Tensor, seq_len: int, batch_size: int, batches: int) -> list[torch.Tensor]:
    """Fixed validation batches: up to ``batches * batch_size`` windows spread evenly over ``data``.

    The same on every node; fewer (and a short last batch) when the validation text is small.
    """
    available = (len(data) - 1) // seq_len
    wanted = min(batches * batch_size, available)
    starts: Sequence[int] = [(k * available // wanted) * seq_len for k in range(wanted)]
    rows = [data[start : start + seq_len + 1] for start in starts]
    return [torch.stack(rows[i : i + batch_size]).long() for i in range(0, len(rows), batch_size)]
