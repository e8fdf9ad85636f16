"""Reading one block of a shard's text: plain text, JSONL records or Parquet rows, in bounded memory.

A block starts at an offset (a byte for text and JSONL, a row for Parquet) and holds at most
about ``block_bytes`` of text, so memory stays bounded whatever the size of the file.  The
same offset always gives the same block, which is what lets a stream resume exactly.

The data is input from strangers, so reading it never raises anything but the two exceptions of
:mod:`p2ptrain.data.blocks`: each record is decoded inside a guard that turns any exception
(recursion, decode, schema) into a skipped record, a record over the size budget is skipped before
it is decoded, and anything else that goes wrong in a block becomes :class:`ShardMalformed`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from p2ptrain.data.blocks import BlockRead, MissingTextField, RecordFailure, ShardMalformed, ShardUnreadable
from p2ptrain.data.parquet import parquet_block
from p2ptrain.data.sources import ShardRef

__all__ = ["BlockRead", "MissingTextField", "RecordFailure", "ShardMalformed", "ShardUnreadable", "first_offset",
           "read_block", "read_prefix"]

#: Records that may fail to decode in one block before reading it stops (the stream decides the rest).
MAX_FAILURES = 64


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
               max_record: int = 0, max_failures: int = MAX_FAILURES) -> BlockRead:
    """The block at ``offset``: about ``block_bytes`` of text (whole records: a little more).

    A record longer than ``max_record`` bytes (default ``2 * block_bytes``) is skipped undecoded
    and counted as a failed record, so one huge record cannot take the memory; so is any record that
    does not decode. Reading stops after ``max_failures`` failed records (the block then ends there).
    """
    max_record = max_record or 2 * block_bytes
    max_failures = max(1, max_failures)
    try:
        if shard.kind == "text":
            return _text_block(shard, path, offset, block_bytes)
        if shard.kind == "jsonl":
            return _jsonl_block(path, offset, shard.end, block_bytes, text_field, max_record, max_failures)
        return parquet_block(shard, path, offset, block_bytes, text_field, max_record, max_failures)
    except (ShardUnreadable, ShardMalformed):
        raise
    except OSError as exc:
        raise ShardUnreadable(_os_error(exc)) from None
    except Exception as exc:  # anything a hostile file can make a decoder raise: this block only, never the node
        unit = "row" if shard.kind == "parquet" else "byte"
        raise ShardMalformed(f"the block at {unit} {offset} does not read ({_describe(exc)})") from exc


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


def _jsonl_block(path: Path, offset: int, end: int, block_bytes: int, text_field: str, max_record: int,
                 max_failures: int) -> BlockRead:
    read = BlockRead(bytearray(), offset, False)
    limit = max_record + 1
    with path.open("rb") as file:
        end = end if end >= 0 else file.seek(0, 2)
        file.seek(offset)
        position = offset
        while position < end and len(read.data) < block_bytes and len(read.failures) < max_failures:
            line = file.readline(limit)
            if not line:
                position = end
                break
            start = position
            if len(line) == limit and not line.endswith(b"\n"):
                _skip_line(file)  # one record bigger than the whole buffer: never held in memory
                position = file.tell()
                read.failures.append(RecordFailure(start, f"the line at byte {start} is longer than the "
                                                          f"{max_record} bytes a record may have"))
                continue
            position += len(line)
            if not line.strip():
                continue
            try:
                text = _record_text(line, start, text_field)
            except Exception as exc:  # recursion, decode, schema: this record only
                reason = str(exc) if isinstance(exc, ShardMalformed) else (
                    f"the line at byte {start} does not decode ({_describe(exc)})")
                read.failures.append(RecordFailure(start, reason, missing_field=isinstance(exc, MissingTextField)))
                continue
            if text is None:
                read.bad_records += 1
                continue
            read.data += text.encode("utf-8", "replace")
            read.data += b"\n"
    read.next_offset, read.at_end = position, position >= end
    return read


def _record_text(line: bytes, start: int, text_field: str) -> str | None:
    try:
        record = json.loads(line)
    except RecursionError:
        raise ShardMalformed(f"the line at byte {start} is nested too deep to decode") from None
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


def read_prefix(shard: ShardRef, path: Path, quota: int, block_bytes: int, text_field: str,
                failed: list[RecordFailure] | None = None) -> bytearray:
    """Up to ``quota`` bytes of text from the start of ``shard`` (for the validation split).

    Records that do not decode are skipped, as in training; a shard whose records keep failing
    (``MAX_FAILURES`` of them) is :class:`ShardMalformed`, and one whose records lack the text field
    before any text was found is :class:`MissingTextField`. ``failed`` collects the skipped records.
    """
    collected = bytearray()
    offset = first_offset(shard, path)
    failures: list[RecordFailure] = []
    while len(collected) < quota:
        block = read_block(shard, path, offset, min(block_bytes, quota - len(collected)), text_field,
                           max_record=2 * block_bytes, max_failures=MAX_FAILURES - len(failures))
        failures += block.failures
        missing = next((f for f in block.failures if f.missing_field), None)
        if missing is not None and not collected and not block.data:
            raise MissingTextField(missing.reason)
        if len(failures) >= MAX_FAILURES:
            raise ShardMalformed(f"{len(failures)} records do not decode; the first: {failures[0].reason}")
        collected += block.data[: quota - len(collected)]
        if failed is not None:
            failed += block.failures
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


def _describe(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = _first_line(exc)
    return text if text == type(exc).__name__ else f"{type(exc).__name__}: {text}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
