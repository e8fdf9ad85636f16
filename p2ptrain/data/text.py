"""From the ``[task]`` settings to text data: this node's shard stream and the fixed validation batches.

``task.buffer_mb`` is split here: a quarter for the training block being read, a quarter for
the validation text, the rest for the transient copies while a block is parsed and cut.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from p2ptrain.config.schema import ConfigError
from p2ptrain.data.corpus import split_shards, validation_text, validation_windows
from p2ptrain.data.readers import (
    MissingTextField,
    RecordFailure,
    ShardMalformed,
    ShardUnreadable,
    first_offset,
    read_block,
    read_prefix,
)
from p2ptrain.data.remote import ShardFetcher
from p2ptrain.data.sources import ShardRef, ShardSet, discover, names_an_index
from p2ptrain.data.stream import ShardStream
from p2ptrain.paths import resolve_state_dir

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection

MIB = 1024 * 1024
VALIDATION_MIN_BYTES = 1 * MIB
"""Validation text read when the buffer allows (windows are spread evenly over it)."""


PROBE_MAX_RECORD = 1 * MIB
"""The start-up check of ``task.text_field`` looks at the first record shorter than this."""

SCORE_MAX_BYTES = 4 * MIB
"""``p2ptrain eval --data PATH`` scores at most this much text (the first, in shard order)."""
SCORE_BLOCK_BYTES = 1 * MIB


@dataclass(frozen=True)
class TextData:
    stream: ShardStream
    validation: list[torch.Tensor]
    source: str


def default_cache_dir() -> Path:
    """``<state_dir>/data-cache`` for the state dir the environment implies (the node passes its own)."""
    return resolve_state_dir(None, os.environ) / "data-cache"


def make_fetcher(cfg: TaskSection, cache_dir: Path | None, *, offline: bool = False) -> ShardFetcher:
    """The downloader of ``cfg``'s URL shards; ``offline``: only what is already in the cache (no network)."""
    directory = cfg.cache_dir or cache_dir or default_cache_dir()
    return ShardFetcher(Path(directory).expanduser(), attempts=cfg.download_attempts, timeout=cfg.download_timeout,
                        max_cache_bytes=cfg.cache_max_mb * MIB, offline=offline, max_shard_bytes=cfg.max_shard_mb * MIB)


def budget(cfg: TaskSection, batch_size: int) -> tuple[int, int]:
    """(training block bytes, validation text cap) out of ``task.buffer_mb``."""
    buffer = cfg.buffer_mb * MIB
    needed = cfg.validation_batches * batch_size * (cfg.seq_len + 1)
    return max(buffer // 4, 4 * (cfg.seq_len + 1)), min(buffer // 4, max(16 * needed, VALIDATION_MIN_BYTES))


def find_shards(cfg: TaskSection, fetcher: ShardFetcher) -> tuple[ShardSet, list[ShardRef], list[ShardRef]]:
    """Every shard of ``task.data_path`` and its (train, validation) split; ConfigError if unusable."""
    found = discover(cfg.data_path, cfg.data_format, cfg.seq_len, fetcher.read_index, cfg.data_index_sha256,
                     cfg.data_compression)
    if len(found.shards) < 2:
        raise ConfigError(
            f"task.data_path: {found.source} is a single shard; training and validation need at least two "
            "(list more files, or a bigger file)"
        )
    train, held_out = split_shards(found.shards, cfg.validation_fraction)
    return found, train, held_out


def index_digest(cfg: TaskSection, cache_dir: Path | None = None) -> str | None:
    """The sha256 of the shard index ``task.data_path`` names (read, or downloaded, and listed as a node would),
    or None when the data is not an index. Raises :class:`ConfigError` as a node would."""
    if not names_an_index(cfg.data_path):
        return None
    return discover(cfg.data_path, cfg.data_format, cfg.seq_len, make_fetcher(cfg, cache_dir).read_index,
                    compression=cfg.data_compression).index_sha256


def build_text_data(
    cfg: TaskSection,
    *,
    batch_size: int,
    peer_seed: int,
    peer_id: str,
    live_peers: Callable[[], Sequence[str]],
    cache_dir: Path | None = None,
    fetcher: ShardFetcher | None = None,
) -> TextData:
    """This node's stream over its training shards and the validation batches every node shares."""
    fetcher = fetcher or make_fetcher(cfg, cache_dir)
    found, train, held_out = find_shards(cfg, fetcher)
    check_text_field(cfg, [*train, *held_out], fetcher)
    block_bytes, validation_cap = budget(cfg, batch_size)
    text = validation_text(held_out, fetcher, validation_cap, block_bytes, cfg.text_field)
    known = [shard.size for shard in train if shard.kind == "text" and not shard.compression]
    train_bytes = sum(known) if len(known) == len(train) else None
    needed = 2 * cfg.seq_len
    if len(text) < needed or (train_bytes is not None and train_bytes < needed):
        shown = "?" if train_bytes is None else str(train_bytes)
        raise ConfigError(
            f"task.data_path: {found.source} is too small (split {shown}/{len(text)} bytes of train/validation "
            f"text); training and validation each need at least {needed} bytes (2 x task.seq_len)"
        )
    stream = ShardStream(train, seq_len=cfg.seq_len, batch_size=batch_size, peer_seed=peer_seed, peer_id=peer_id,
                         live_peers=live_peers, block_bytes=block_bytes, text_field=cfg.text_field, files=fetcher)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return TextData(stream, validation_windows(data, cfg.seq_len, batch_size, cfg.validation_batches), found.source)


def check_text_field(cfg: TaskSection, shards: Sequence[ShardRef], files: ShardFetcher | None = None) -> None:
    """Fail at start-up, naming ``task.text_field``, when the first local record shard lacks the field.

    Only a missing field is a config error; other problems are the stream's to skip and count.  A
    compressed shard is read through ``files`` (its decompressed copy); without it, it is not probed.
    """
    first = next((s for s in shards if s.kind in ("jsonl", "parquet") and not s.url
                  and (files is not None or not s.compression)), None)
    if first is None:
        return
    try:
        path = files.local_path(first) if files is not None else Path(first.path)
        read = read_block(first, path, first_offset(first, path), 1, cfg.text_field, max_record=PROBE_MAX_RECORD,
                          max_failures=1)
    except MissingTextField as exc:
        raise ConfigError(f"task.text_field: {first.id}: {exc}") from None
    except (ShardMalformed, ShardUnreadable):
        return
    if read.failures and read.failures[0].missing_field and not read.data:
        raise ConfigError(f"task.text_field: {first.id}: {read.failures[0].reason}")


def data_problems(cfg: TaskSection, cache_dir: Path | None = None) -> list[str]:
    """What a node would refuse to start on in ``cfg``'s data, one line each (empty: none), for ``config check``.

    Finds the shards and reads the first block of the first record shard exactly as a starting node
    does (a URL index is downloaded, with its pins checked), so the lines are the node's own.
    """
    try:
        fetcher = make_fetcher(cfg, cache_dir)
        _, train, held_out = find_shards(cfg, fetcher)
        check_text_field(cfg, [*train, *held_out], fetcher)
    except ConfigError as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True)
class ScoredText:
    """Text to score, as batches of non-overlapping windows, and what reading it met."""

    batches: list[torch.Tensor]
    text_bytes: int
    #: The text went on past ``SCORE_MAX_BYTES`` (only its start is scored).
    truncated: bool
    #: ``"shard: reason"`` of each shard left out (unreadable or malformed), in shard order.
    skipped: tuple[str, ...]
    #: Records skipped because they did not decode, and ``"shard: reason"`` of the first.
    failed_records: int = 0
    first_failure: str = ""


def text_batches(data_path: str, cfg: TaskSection, batch_size: int, fetcher: ShardFetcher, *, label: str,
                 max_bytes: int = SCORE_MAX_BYTES) -> ScoredText:
    """The text of ``data_path`` read as ``task.data_path`` is (a file, a directory, a glob, an index, a URL;
    text, JSONL's ``task.text_field``, Parquet), at most ``max_bytes`` of it, cut into ``seq_len + 1`` windows.

    Memory stays within ``max_bytes`` plus one block whatever the size of the data.  Errors are
    :class:`ConfigError` lines that begin with ``label`` (the flag or field the path came from).
    """
    try:
        found = discover(data_path, cfg.data_format, cfg.seq_len, fetcher.read_index,
                         compression=cfg.data_compression)
    except ConfigError as exc:
        raise ConfigError(label + str(exc).removeprefix("task.data_path")) from None
    data, skipped, failed, first_failure = bytearray(), [], 0, ""
    for shard in found.shards:
        if len(data) >= max_bytes:
            break
        failures: list[RecordFailure] = []
        try:
            text = read_prefix(shard, fetcher.local_path(shard), max_bytes - len(data),
                               min(SCORE_BLOCK_BYTES, max_bytes), cfg.text_field, failures)
        except MissingTextField as exc:
            raise ConfigError(f"{label}: {shard.id}: {exc} (the model's task.text_field)") from None
        except (ShardMalformed, ShardUnreadable) as exc:
            skipped.append(f"{shard.id}: {exc}")
            continue
        if failures and not failed:
            first_failure = f"{shard.id}: {failures[0].reason}"
        failed += sum(failure.count for failure in failures)
        data += text
        del text
    tensor = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    count = (len(tensor) - 1) // cfg.seq_len if len(tensor) > cfg.seq_len else 0
    rows = [tensor[i * cfg.seq_len : i * cfg.seq_len + cfg.seq_len + 1] for i in range(count)]
    batches = [torch.stack(rows[i : i + batch_size]).long() for i in range(0, len(rows), batch_size)]
    return ScoredText(batches, len(data), len(data) >= max_bytes, tuple(skipped), failed, first_failure)
