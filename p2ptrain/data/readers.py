"""Reading one block of a shard's text: plain text, JSONL records or Parquet rows, in bounded memory.

A block starts at an offset (a byte for text and JSONL, a row for Parquet) and holds at most
about ``block_bytes`` of text, so memory stays bounded whatever the size of the file.  The
same offset always gives the same block, which is what lets a stream resume exactly.

Problems with the data are exceptions with a one-line message, for the stream to count and skip:
:class:`ShardUnreadable` (I/O errors) and :class:`ShardMalformed` (not JSON, no text field...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2ptrain.data.sources import ShardRef

#: Parquet rows converted to Python strings at a time.
PARQUET_BATCH_ROWS = 512
#: Bytes of a Parquet column chunk read from disk at a time (instead of whole column chunks).
PARQUET_READ_BUFFER = 1 << 20


class ShardUnreadable(Exception):
    """The shard cannot be read now (I/O error, download failed, checksum mismatch)."""


class ShardMalformed(Exception):
    """The shard's content is not what its format promises; the message names the place."""


class MissingTextField(ShardMalformed):
    """Records without the ``task.text_field`` field (or column): most likely a config mistake."""


@dataclass
class BlockRead:
    """``data``: the block's text. ``next_offset``: where the record after it starts (records
    formats) or where reading stopped (text). ``at_end``: nothing of the shard follows.
    ``bad_records``: records without usable text (null, not a string), skipped."""

    data: bytearray
    next_offset: int
    at_end: bool
    bad_records: int = 0


def first_offset(shard: ShardRef, path: Path) -> int:
    """Where the shard's first block starts: for JSONL, the first line that begins in the range."""
    if shard.kind != "jsonl" or shard.start == 0:
        return shard.start
    try:
        with path.open("rb") as file:
            file.seek(shard.start - 1)
            _skip_line(file)
            return file.tell()
    except OSError as exc:
        raise ShardUnreadable(_os_error(exc)) from None


def read_block(shard: ShardRef, path: Path, offset: int, block_bytes: int, text_field: str,
               max_record: int = 0) -> BlockRead:
    """The block at ``offset``: about ``block_bytes`` of text (whole records: a little more).

    A JSONL line longer than ``max_record`` bytes (default ``2 * block_bytes``) is skipped
    unread and counted as a bad record, so one huge line cannot take the memory.
    """
    try:
        if shard.kind == "text":
            return _text_block(shard, path, offset, block_bytes)
        if shard.kind == "jsonl":
            return _jsonl_block(shard, path, offset, block_bytes, text_field, max_record or 2 * block_bytes)
        return _parquet_block(shard, path, offset, block_bytes, text_field)
    except OSError as exc:
        raise ShardUnreadable(_os_error(exc)) from None


def _text_block(shard: ShardRef, path: Path, offset: int, block_bytes: int) -> BlockRead:
    with path.open("rb") as file:
        end = shard.end if shard.end >= 0 else file.seek(0, 2)
        wanted = max(0, min(block_bytes, end - offset))
        data = bytearray(wanted)
        file.seek(offset)
        view, got = memoryview(data), 0
        while got < wanted:
            count = file.readinto(view[got:])
            if not count:
                break
            got += count
        del view
        if got < wanted:  # the file shrank under us: what is there is still good text
            del data[got:]
    return BlockRead(data, offset + len(data), offset + len(data) >= end or got < wanted)


def _jsonl_block(shard: ShardRef, path: Path, offset: int, block_bytes: int, text_field: str,
                 max_record: int) -> BlockRead:
    data, bad = bytearray(), 0
    limit = max_record + 1
    with path.open("rb") as file:
        end = shard.end if shard.end >= 0 else file.seek(0, 2)
        file.seek(offset)
        position = offset
        while position < end and len(data) < block_bytes:
            line = file.readline(limit)
            if not line:
                position = end
                break
            if len(line) == limit and not line.endswith(b"\n"):
                _skip_line(file)  # one record bigger than the whole buffer: never held in memory
                bad += 1
                position = file.tell()
                continue
            start, position = position, position + len(line)
            if not line.strip():
                continue
            text = _record_text(line, start, text_field)
            if text is None:
                bad += 1
                continue
            data += text.encode("utf-8", "replace")
            data += b"\n"
    return BlockRead(data, position, position >= end, bad)


def _record_text(line: bytes, start: int, text_field: str) -> str | None:
    try:
        record = json.loads(line)
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise ShardMalformed(f"the line at byte {start} is not valid JSON ({reason})") from None
    if not isinstance(record, dict):
        raise ShardMalformed(f"the line at byte {start} is a JSON {type(record).__name__}, not an object")
    if text_field not in record:
        fields = ", ".join(sorted(str(key) for key in record)[:8]) or "none"
        raise MissingTextField(f"no {text_field!r} field in the record at byte {start} (its fields: {fields})")
    value = record[text_field]
    return value if isinstance(value, str) else None


def _parquet_block(shard: ShardRef, path: Path, offset: int, block_bytes: int, text_field: str) -> BlockRead:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path, buffer_size=PARQUET_READ_BUFFER)
    except pa.ArrowException as exc:
        raise ShardMalformed(f"not a readable Parquet file ({_first_line(exc)})") from None
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        columns = ", ".join(schema.names[:8]) or "none"
        raise MissingTextField(f"no {text_field!r} column (its columns: {columns})")
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise ShardMalformed(f"column {text_field!r} holds {column_type}, not text")
    metadata = parquet.metadata
    end = shard.end if shard.end >= 0 else metadata.num_rows
    groups: list[int] = []
    first_row, row = 0, 0
    for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        if row + rows > offset and row < end:
            if not groups:
                first_row = row
            groups.append(index)
        row += rows
    data, bad, position = bytearray(), 0, offset
    if groups:
        try:
            position, bad = _fill_from_parquet(parquet, groups, first_row, offset, end, block_bytes, text_field, data)
        except pa.ArrowException as exc:
            raise ShardMalformed(f"Parquet rows from {offset} do not decode ({_first_line(exc)})") from None
    return BlockRead(data, position, position >= end, bad)


def _fill_from_parquet(parquet: Any, groups: list[int], first_row: int, offset: int, end: int,
                       block_bytes: int, text_field: str, data: bytearray) -> tuple[int, int]:
    """Append the text of rows ``offset..`` to ``data`` until ``end`` or a full block.

    Returns the next row to read and how many rows had no text (null).
    """
    row, bad = first_row, 0
    for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups, columns=[text_field],
                                      use_threads=False):
        for value in batch.column(0).to_pylist():
            if row >= end or len(data) >= block_bytes:
                return row, bad
            if row >= offset:
                if isinstance(value, str):
                    data += value.encode("utf-8", "replace")
                    data += b"\n"
                else:
                    bad += 1
            row += 1
    return row, bad


def read_prefix(shard: ShardRef, path: Path, quota: int, block_bytes: int, text_field: str) -> bytearray:
    """Up to ``quota`` bytes of text from the start of ``shard`` (for the validation split)."""
    collected = bytearray()
    offset = first_offset(shard, path)
    while len(collected) < quota:
        block = read_block(shard, path, offset, min(block_bytes, quota - len(collected)), text_field)
        collected += block.data[: quota - len(collected)]
        if block.at_end or block.next_offset == offset:
            break
        offset = block.next_offset
    return collected


def _skip_line(file: Any) -> None:
    while True:
        chunk = file.readline(1 << 16)
        if not chunk or chunk.endswith(b"\n"):
            return


def _os_error(exc: OSError) -> str:
    return exc.strerror if exc.strerror else f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
