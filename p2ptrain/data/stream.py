"""This node's endless, resumable walk over its share of the training shards, in bounded memory.

Each pass, the node reads the shards it wins by rendezvous hashing over the live peers (asked
again at every shard boundary, so a peer that joins or leaves shifts the split at once), in an
order seeded by ``(peer_seed, pass)``.  A shard is read one block at a time; a block's
``(seq_len + 1)``-byte windows are taken in a permutation seeded by ``(peer_seed, pass, shard,
offset)``.  All randomness derives from the position, so ``(pass, shard, offset, index)`` plus
the shards already read this pass is the whole state: a restarted node continues exactly.

Shards are input from strangers.  A record that does not decode (not JSON, nested too deep, too
large, no text field) is skipped and counted, with one warning line naming the shard and the offset
for the first of each shard in a pass; a shard whose records keep failing (``FAILED_RECORDS_LIMIT``
in one pass) is skipped for the rest of the pass.  A shard that cannot be read (I/O error, download
refused or given up) is skipped and a malformed one abandoned, each with one warning line and a
count; whatever a reader raises is one of those, never an exception out of the stream.  All are tried
again next pass.

Peers' passes drift apart: their shares of a pass differ in size, and a node that trained alone
for a while (the first one) is passes ahead of those that joined later.  Shares are disjoint per
pass number, so the swarm still covers every pass, just not at the same time; to keep the swarm in
step, a node that finds itself more than one pass behind the other peers on the same shard list
(the lower median of their passes, ``swarm_passes``) moves on to their pass when its own ends.  For
the swarm's coverage figures the stream also remembers how many shards it read in each of its last
few passes (``past_pass_shards``, kept in the position).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p2ptrain.config.schema import ConfigError
from p2ptrain.data.assign import clean_peers, owned_shards, weight
from p2ptrain.data.corpus import stable_seed
from p2ptrain.data.readers import (
    BlockRead,
    MissingTextField,
    ShardMalformed,
    ShardUnreadable,
    first_offset,
    read_block,
)
from p2ptrain.data.sources import ShardRef

log = logging.getLogger(__name__)

POSITION_FORMAT = "shards-1"
#: Completed passes whose shard counts are remembered (newest first).
PAST_PASSES = 7
#: Passes in a row that produce no window at all before the stream gives up (bad data, not weather).
EMPTY_PASSES_LIMIT = 2
#: Records of one shard that may fail to decode in a pass before the rest of the shard is skipped.
FAILED_RECORDS_LIMIT = 32


class LocalFiles:
    """The file behind a shard: only local shards (see ``remote.ShardFetcher`` for URLs)."""

    def local_path(self, shard: ShardRef) -> Path:
        if shard.url or shard.compression:
            raise ShardUnreadable("remote or compressed shard without a downloader")
        return Path(shard.path)


@dataclass(frozen=True)
class Coverage:
    """How far this node is through the data, for the node to publish.

    ``consumed`` are the shards read through in ``pass_number``; the ``*_total`` counts are
    since the stream started (``bad_records``: records without text, e.g. a null field;
    ``failed_records``: records that did not decode or were too large, skipped).
    """

    pass_number: int
    shards_total: int
    consumed: tuple[str, ...]
    skipped_this_pass: tuple[str, ...]
    skipped_total: int
    malformed_total: int
    bad_records_total: int
    failed_records_total: int = 0

    @property
    def fraction(self) -> float:
        return len(self.consumed) / self.shards_total if self.shards_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_number, "shards_total": self.shards_total, "consumed": list(self.consumed),
                "skipped_this_pass": list(self.skipped_this_pass), "skipped_total": self.skipped_total,
                "malformed_total": self.malformed_total, "bad_records_total": self.bad_records_total,
                "failed_records_total": self.failed_records_total}


@dataclass
class _Block:
    data: torch.Tensor
    order: torch.Tensor
    shift: int
    read: BlockRead


@dataclass
class _Lane:
    """One shard being read: where, and its current block (re-read from the position after a restart)."""

    shard: str | None = None
    offset: int = -1
    index: int = 0
    block: _Block | None = None
    idle: bool = False
    #: Records of this shard that failed to decode in this pass (since this process read it).
    failed: int = 0


class ShardStream:
    """A :class:`~p2ptrain.tasks.base.BatchStream` of ``(batch_size, seq_len + 1)`` int64 windows.

    ``LANES`` shards are read side by side and windows are taken from them in turn, so that a
    batch mixes several shards even when shards are small files; each lane holds one block of
    ``block_bytes / LANES`` bytes, which bounds the memory.
    """

    LANES = 8
    done: list[str]
    failed: list[str]
    _seen: set[str]

    def __init__(
        self,
        shards: Sequence[ShardRef],
        *,
        seq_len: int,
        batch_size: int,
        peer_seed: int,
        peer_id: str,
        live_peers: Callable[[], Sequence[str]],
        block_bytes: int,
        text_field: str = "text",
        files: Any = None,
    ) -> None:
        if not shards:
            raise ValueError("a shard stream needs at least one shard")
        self._shards = {shard.id: shard for shard in shards}
        self._ids = sorted(self._shards)
        self.source = hashlib.sha256("\n".join(self._ids).encode()).hexdigest()[:16]
        self.seq_len, self.batch_size, self.peer_seed = seq_len, batch_size, peer_seed
        self.peer_id, self._live_peers = peer_id, live_peers
        # Every full block holds a few windows, whatever the buffer.
        self.lane_bytes = max(block_bytes // self.LANES, 4 * (seq_len + 1))
        self.text_field = text_field
        self._files = files if files is not None else LocalFiles()
        self._peers: tuple[str, ...] = (peer_id,)
        self._owned: tuple[int, tuple[str, ...], list[str]] | None = None
        self.skipped_total = self.malformed_total = self.bad_records_total = self.failed_records_total = 0
        self._empty_passes = 0
        self._last_pass: Coverage | None = None
        self._past: list[int] = []
        #: The other training peers' (shard list, pass) as their records say; set by the node (None:
        #: this stream follows nobody).
        self.swarm_passes: Callable[[], Sequence[tuple[str, int]]] | None = None
        self._reset(0)

    # ------------------------------------------------------------------ the BatchStream interface

    def next(self) -> torch.Tensor:
        return torch.stack([self._next_window() for _ in range(self.batch_size)]).long()

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": POSITION_FORMAT, "source": self.source, "lane_bytes": self.lane_bytes,
            "pass": self.pass_number, "done": list(self.done), "failed": list(self.failed),
            "lanes": [[lane.shard or "", lane.offset, lane.index] for lane in self.lanes], "draws": self.draws,
            "windows": self._windows_this_pass,
            "skipped_total": self.skipped_total, "malformed_total": self.malformed_total,
            "bad_records_total": self.bad_records_total, "failed_records_total": self.failed_records_total,
            "past_pass_shards": list(self._past),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # no saved position: the very start
            self._reset(0)
            return
        if state.get("format") != POSITION_FORMAT:
            # A checkpoint from before shard streams ({"epoch", "index", ...}): start a fresh pass.
            epoch = state.get("epoch", 0)
            self._reset(epoch + 1 if isinstance(epoch, int) and epoch >= 0 else 0)
            log.warning("data position %s is of an older format; starting pass %d", sorted(state), self.pass_number)
            return
        _check_position(state, self.LANES)
        self.skipped_total, self.malformed_total = state["skipped_total"], state["malformed_total"]
        self.bad_records_total = state["bad_records_total"]
        failed = state.get("failed_records_total", 0)  # positions saved before it existed have none
        self.failed_records_total = failed if _is_count(failed) else 0
        if state["source"] != self.source:
            self._reset(state["pass"] + 1)
            log.warning("training data changed since the checkpoint (shard list %s -> %s); starting pass %d",
                        state["source"], self.source, self.pass_number)
            return
        self._reset(state["pass"])
        past = state.get("past_pass_shards", [])  # positions saved before it existed have none
        self._past = [c for c in past if _is_count(c)][:PAST_PASSES] if isinstance(past, list) else []
        self.done = [shard for shard in state["done"] if shard in self._shards]
        self.failed = [shard for shard in state["failed"] if shard in self._shards]
        self._seen = set(self.done) | set(self.failed)
        self.draws = state["draws"]
        # Windows handed out this pass: what lets a restart be checked for skipped or repeated samples.
        windows = state.get("windows", 0)
        self._windows_this_pass = windows if _is_count(windows) else 0
        resized = state["lane_bytes"] != self.lane_bytes
        for lane, (shard, offset, index) in zip(self.lanes, state["lanes"], strict=True):
            if shard in self._shards:
                lane.shard, lane.offset, lane.index = shard, offset, 0 if resized else index
        if resized:
            log.info("task.buffer_mb changed since the checkpoint: re-reading the current blocks from their start")

    def coverage(self) -> Coverage:
        """Where this node is in the current pass (``consumed`` restarts empty with each pass)."""
        return Coverage(self.pass_number, len(self._ids), tuple(self.done), tuple(self.failed),
                        self.skipped_total, self.malformed_total, self.bad_records_total, self.failed_records_total)

    def last_pass_coverage(self) -> Coverage | None:
        """The coverage of the pass this node completed last (since it started), or None."""
        return self._last_pass

    def past_pass_shards(self) -> tuple[int, ...]:
        """Shards read through in each of the last completed passes, newest first (kept across restarts)."""
        return tuple(self._past)

    @property
    def shard_ids(self) -> tuple[str, ...]:
        """The training shards' IDs, sorted (the same on every node of the run)."""
        return tuple(self._ids)

    # ------------------------------------------------------------------ walking the shards

    def _reset(self, pass_number: int) -> None:
        self.pass_number = pass_number
        self.done = []
        self.failed = []
        self._seen = set()
        #: Shards with a failed record this pass (the first one is a warning line, the rest debug).
        self._failing: set[str] = set()
        self.lanes = [_Lane() for _ in range(self.LANES)]
        self.draws = 0
        self._windows_this_pass = 0

    def _next_window(self) -> torch.Tensor:
        while True:
            lane = self.lanes[self.draws % self.LANES]
            self.draws += 1
            window = self._take(lane)
            if window is not None:
                self._windows_this_pass += 1
                return window
            if all(lane.idle for lane in self.lanes):
                self._end_pass()

    def _take(self, lane: _Lane) -> torch.Tensor | None:
        while not lane.idle:
            if lane.block is None:
                if lane.shard is None and not self._assign(lane):
                    lane.idle = True
                    return None
                self._load_block(lane)
                continue
            block = lane.block
            if lane.index < len(block.order):
                start = block.shift + int(block.order[lane.index]) * self.seq_len
                lane.index += 1
                return block.data[start : start + self.seq_len + 1]
            self._after_block(lane, block)
        return None

    def _after_block(self, lane: _Lane, block: _Block) -> None:
        lane.block = None
        if block.read.at_end:
            self._finish_shard(lane, failed=False)
            return
        if self._shards[lane.shard or ""].kind == "text":
            # Plain text goes on right after the last whole window (its last byte opens the next block).
            lane.offset += block.shift + len(block.order) * self.seq_len
        else:
            lane.offset = block.read.next_offset
        lane.index = 0

    def _load_block(self, lane: _Lane) -> None:
        shard = self._shards[lane.shard or ""]
        try:
            path = self._files.local_path(shard)
            if lane.offset < 0:
                lane.offset = first_offset(shard, path)
            read = read_block(shard, path, lane.offset, self.lane_bytes, self.text_field,  # records <= 2 blocks
                              max_failures=FAILED_RECORDS_LIMIT - lane.failed)
        except ShardUnreadable as exc:
            self.skipped_total += 1
            log.warning("shard %s skipped this pass: %s (%d skipped so far)", shard.id, exc, self.skipped_total)
            self._finish_shard(lane, failed=True)
            return
        except ShardMalformed as exc:
            hint = " (see task.text_field)" if isinstance(exc, MissingTextField) else ""
            self._malformed(lane, shard, str(exc), hint)
            return
        except Exception as exc:  # a downloader or reader bug must cost one shard, never the node
            log.debug("reading shard %s at %d failed", shard.id, lane.offset, exc_info=True)
            self._malformed(lane, shard, f"reading it at {lane.offset} failed ({type(exc).__name__}: "
                                         f"{str(exc).strip()[:200] or 'no message'})", "")
            return
        if lane.index == 0:  # re-reading a block after a restart must not count its records twice
            self.bad_records_total += read.bad_records
            self._count_failures(shard, read)
        lane.failed += len(read.failures)
        if lane.failed >= FAILED_RECORDS_LIMIT:
            hint = " (see task.text_field)" if any(f.missing_field for f in read.failures) else ""
            self._malformed(lane, shard, f"{lane.failed} records did not decode this pass, the last: "
                                         f"{read.failures[-1].reason}", hint)
            return
        if not read.at_end and read.next_offset <= lane.offset and shard.kind != "text":
            read.at_end = True  # a reader that made no progress must not spin
        data = torch.frombuffer(read.data, dtype=torch.uint8) if read.data else torch.empty(0, dtype=torch.uint8)
        generator = torch.Generator().manual_seed(
            stable_seed("block", self.peer_seed, self.pass_number, shard.id, lane.offset))
        shift = int(torch.randint(self.seq_len, (1,), generator=generator))
        count = (len(data) - 1 - shift) // self.seq_len
        if count < 1:
            shift, count = 0, max(0, (len(data) - 1) // self.seq_len)
        lane.block = _Block(data, torch.randperm(count, generator=generator), shift, read)

    def _count_failures(self, shard: ShardRef, read: BlockRead) -> None:
        """Count a block's failed records; the first of the shard in this pass is one warning line."""
        if not read.failures:
            return
        first = shard.id not in self._failing
        self.failed_records_total += read.failed_records
        self._failing.add(shard.id)
        for failure in read.failures[: 1 if first else 0]:
            log.warning("shard %s: record skipped: %s (%d records skipped so far)", shard.id, failure.reason,
                        self.failed_records_total)
        for failure in read.failures[1 if first else 0 :]:
            log.debug("shard %s: record skipped: %s", shard.id, failure.reason)

    def _malformed(self, lane: _Lane, shard: ShardRef, reason: str, hint: str) -> None:
        self.malformed_total += 1
        log.warning("shard %s is malformed, rest of it skipped this pass: %s%s (%d malformed so far)",
                    shard.id, reason, hint, self.malformed_total)
        self._finish_shard(lane, failed=True)

    def _finish_shard(self, lane: _Lane, *, failed: bool) -> None:
        shard = lane.shard or ""
        (self.failed if failed else self.done).append(shard)
        self._seen.add(shard)
        lane.shard, lane.offset, lane.index, lane.block, lane.failed = None, -1, 0, None, 0

    def _assign(self, lane: _Lane) -> bool:
        """Give ``lane`` this node's next shard of the pass; False when none is left."""
        reading = {other.shard for other in self.lanes if other.shard is not None}
        mine = self._remaining(reading)
        if mine is None and not self._seen and not reading:
            # More peers than shards: this node wins none this pass. Read the one that suits it
            # best rather than idle (a duplicate read, never a gap).
            mine = max(self._ids, key=lambda shard: weight(self.pass_number, shard, self.peer_id))
            log.info("no shard of pass %d falls to this node among %d peers: also reading %s",
                     self.pass_number, len(self._peers), mine)
        if mine is None:
            return False
        lane.shard, lane.offset, lane.index = mine, -1, 0
        return True

    def _remaining(self, reading: set[str]) -> str | None:
        try:
            self._peers = clean_peers(self._live_peers(), self.peer_id)
        except Exception as exc:  # the swarm view is the node's business: keep the last known set
            log.warning("live peer set unavailable (%r): keeping %d known peers", exc, len(self._peers))
        key = (self.pass_number, self._peers)
        if self._owned is None or self._owned[:2] != key:
            mine = owned_shards(self.pass_number, self._ids, self._peers, self.peer_id)
            mine.sort(key=lambda shard: stable_seed("order", self.peer_seed, self.pass_number, shard))
            self._owned = (*key, mine)
        return next((s for s in self._owned[2] if s not in self._seen and s not in reading), None)

    def _end_pass(self) -> None:
        self._empty_passes = self._empty_passes + 1 if self._windows_this_pass == 0 else 0
        if self._empty_passes >= EMPTY_PASSES_LIMIT:
            raise ConfigError(
                f"task.data_path: no training text could be read in {self._empty_passes} passes "
                f"({self.skipped_total} shard reads skipped, {self.malformed_total} malformed; see the warnings above)"
            )
        self._last_pass = self.coverage()
        self._past = [len(self.done), *self._past][:PAST_PASSES]
        following = self._swarm_pass()
        if following > self.pass_number + 1:
            log.info("pass %d done: %d shards read, %d skipped; the other peers are at pass %d: moving on to it",
                     self.pass_number, len(self.done), len(self.failed), following)
            self._past = [0] * min(PAST_PASSES, following - self.pass_number - 1) + self._past  # passes not read
            self._past = self._past[:PAST_PASSES]
        else:
            following = self.pass_number + 1
            log.info("pass %d done: %d shards read, %d skipped; starting pass %d",
                     self.pass_number, len(self.done), len(self.failed), following)
        self._reset(following)

    def _swarm_pass(self) -> int:
        """The lower median of the other peers' passes over this shard list (0 when none is known)."""
        if self.swarm_passes is None:
            return 0
        try:
            passes = sorted(p for source, p in self.swarm_passes() if source == self.source and _is_count(p))
        except Exception as exc:  # the swarm view is the node's business: go on by ourselves
            log.debug("peers' passes unavailable (%r)", exc)
            return 0
        return passes[(len(passes) - 1) // 2] if passes else 0


def _check_position(state: dict[str, Any], lanes: int) -> None:
    ints = ("pass", "draws", "lane_bytes", "skipped_total", "malformed_total", "bad_records_total")
    good = all(_is_count(state.get(key)) for key in ints) and isinstance(state.get("source"), str)
    good = good and all(isinstance(state.get(key), list) and all(isinstance(s, str) for s in state[key])
                        for key in ("done", "failed"))
    rows = state.get("lanes")
    good = good and isinstance(rows, list) and len(rows) == lanes and all(
        isinstance(row, list | tuple) and len(row) == 3 and isinstance(row[0], str)
        and _is_count(row[2]) and isinstance(row[1], int) and not isinstance(row[1], bool) and row[1] >= -1
        for row in rows)
    if not good:
        raise ValueError(f"bad data position {sorted(state)!r}: expected the fields of ShardStream.state_dict()")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
