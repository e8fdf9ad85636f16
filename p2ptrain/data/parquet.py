"""One block of a Parquet shard's text column, decoded within a byte budget.

Everything a Parquet file says about its own sizes is checked before it costs memory:

* the footer's length is bounded before pyarrow parses it;
* the text column's page headers in each row group are read first (:mod:`p2ptrain.data.parquet_pages`):
  a row group with a page that would decompress past the page budget is skipped whole, counted as
  failed records, and never decoded (a 3.5 KB file can hold one row of 96 MiB);
* rows are decoded in batches sized by the densest data page and the dictionary page, so a batch
  stays within ``BATCH_BYTES`` whatever mix of short and long rows the file holds (a long dictionary
  value repeated in every row included: each row decodes to at most the dictionary page);
* a row longer than the record budget is skipped by its length, before it becomes a Python string.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from p2ptrain.data.blocks import BlockRead, MissingTextField, RecordFailure, ShardMalformed
from p2ptrain.data.parquet_pages import ChunkPages, PagesMalformed, chunk_pages
from p2ptrain.data.sources import ShardRef

#: Rows decoded at a time at most (fewer when the rows are long).
PARQUET_BATCH_ROWS = 512
#: Bytes of a Parquet column chunk read from disk at a time (instead of whole column chunks).
PARQUET_READ_BUFFER = 1 << 20
#: A footer (the file's metadata) larger than this is refused before it is parsed.
MAX_FOOTER_BYTES = 16 << 20
#: The smallest page budget, whatever the buffer: pyarrow and parquet-mr write pages of about 1 MiB.
MIN_PAGE_BUDGET = 8 << 20
#: What one batch of rows may decode to at most, in page budgets (its rows are sized for it): 64 MiB by default.
BATCH_PAGES = 8
_MAGIC = b"PAR1"


def page_budget(max_record: int) -> int:
    """The most one page of the text column may decompress to."""
    return max(max_record, MIN_PAGE_BUDGET)


def parquet_block(shard: ShardRef, path: Path, offset: int, block_bytes: int, text_field: str,
                  max_record: int, max_failures: int) -> BlockRead:
    """Text of the rows from ``offset``: about ``block_bytes``; rows over ``max_record`` bytes skipped."""
    import pyarrow.parquet as pq

    stat = path.stat()
    with path.open("rb") as file:
        _check_footer(file, stat.st_size)
    parquet = pq.ParquetFile(path, buffer_size=PARQUET_READ_BUFFER)
    column = _text_column(parquet, text_field)
    metadata = parquet.metadata
    end = shard.end if shard.end >= 0 else metadata.num_rows
    reading = _Fill(offset, end, block_bytes, max_record, max_failures)
    group_start = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        if group_start + rows > reading.position and group_start < end:
            pages = _pages(path, stat, group, column, metadata)
            budget = page_budget(max_record)
            if pages.largest > budget:
                reading.refuse(group_start, rows, pages.largest, budget)
            else:
                per_row = max(pages.densest, pages.dictionary, 1)
                batch = max(1, min(PARQUET_BATCH_ROWS, BATCH_PAGES * budget // per_row))
                reading.read_group(parquet, group, group_start, batch, text_field)
            if reading.full:
                break
        group_start += rows
    return BlockRead(reading.data, reading.position, reading.position >= end, reading.bad, reading.failures)


def _check_footer(file: Any, size: int) -> None:
    if size < 12:
        raise ShardMalformed(f"not a Parquet file ({size} bytes)")
    file.seek(size - 8)
    tail = file.read(8)
    if tail[4:] != _MAGIC:
        raise ShardMalformed("not a Parquet file (no PAR1 at its end)")
    footer = int.from_bytes(tail[:4], "little")
    if footer > MAX_FOOTER_BYTES or footer > size - 12:
        raise ShardMalformed(f"its footer claims {footer} bytes (at most {min(MAX_FOOTER_BYTES, size - 12)} here)")


def _text_column(parquet: Any, text_field: str) -> int:
    """The leaf column index of ``text_field``, which must hold text."""
    import pyarrow as pa

    schema = parquet.schema_arrow
    if text_field not in schema.names:
        columns = ", ".join(schema.names[:8]) or "none"
        raise MissingTextField(f"no {text_field!r} column (its columns: {columns})")
    column_type = schema.field(text_field).type
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise ShardMalformed(f"column {text_field!r} holds {column_type}, not text")
    leaves = parquet.metadata.schema
    for index in range(len(leaves)):
        if leaves.column(index).path == text_field:
            return index
    raise ShardMalformed(f"column {text_field!r} is not a plain column")


def _pages(path: Path, stat: Any, group: int, column: int, metadata: Any) -> ChunkPages:
    """The page summary of one row group's text column chunk."""
    chunk = metadata.row_group(group).column(column)
    start = chunk.data_page_offset
    dictionary = chunk.dictionary_page_offset
    # Where the reader itself starts: some writers leave the dictionary offset 0.
    if chunk.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
        start = dictionary
    try:
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        return _chunk_pages(str(path), identity, start, chunk.total_compressed_size)
    except PagesMalformed as exc:
        raise ShardMalformed(f"row group {group}: {exc}") from None


@functools.lru_cache(maxsize=256)
def _chunk_pages(path: str, identity: tuple[int, int, int], start: int, length: int) -> ChunkPages:
    """Cached by the file's identity (inode, size, mtime): every block of a row group reads the same headers."""
    with open(path, "rb") as file:
        return chunk_pages(file, start, length, identity[1])


class _Fill:
    """The block being filled: its text, the next row, and what was skipped."""

    def __init__(self, offset: int, end: int, block_bytes: int, max_record: int, max_failures: int) -> None:
        self.position, self.end, self.block_bytes = offset, end, block_bytes
        self.max_record, self.max_failures = max_record, max_failures
        self.data, self.bad, self.failures = bytearray(), 0, list[RecordFailure]()

    @property
    def full(self) -> bool:
        return (self.position >= self.end or len(self.data) >= self.block_bytes
                or len(self.failures) >= self.max_failures)

    def refuse(self, group_start: int, rows: int, largest: int, budget: int) -> None:
        first, last = max(self.position, group_start), min(self.end, group_start + rows)
        self.failures.append(RecordFailure(
            first, f"rows {first}-{last - 1} skipped undecoded: a page of their text column decodes to "
                   f"{largest} bytes, more than the {budget} allowed", count=last - first))
        self.position = last

    def read_group(self, parquet: Any, group: int, group_start: int, batch_rows: int, text_field: str) -> None:
        row = group_start
        for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[group], columns=[text_field],
                                          use_threads=False):
            column = batch.column(0)
            if row + len(column) > self.position:
                self._take(column, row)
            row += len(column)
            if self.full:
                return

    def _take(self, column: Any, first_row: int) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if pa.types.is_dictionary(column.type):
            lengths = pc.take(pc.binary_length(column.dictionary), column.indices).to_pylist()
        else:
            lengths = pc.binary_length(column).to_pylist()
        chosen: list[int] = []
        filled = len(self.data)
        for index in range(max(0, self.position - first_row), len(lengths)):
            row = first_row + index
            if row >= self.end or filled >= self.block_bytes or len(self.failures) >= self.max_failures:
                break
            length = lengths[index]
            if length is None:
                self.bad += 1
            elif length > self.max_record:
                self.failures.append(RecordFailure(row, f"row {row} holds {length} bytes of text, more than the "
                                                        f"{self.max_record} a record may have"))
            else:
                chosen.append(index)
                filled += length + 1
            self.position = row + 1
        if not chosen:
            return
        if chosen[-1] - chosen[0] + 1 == len(chosen):
            values = column.slice(chosen[0], len(chosen))
        else:
            values = column.take(pa.array(chosen, pa.int64()))
        if pa.types.is_dictionary(values.type):  # a column written with Arrow's dictionary type reads back as one
            values = values.dictionary_decode()  # only the chosen rows: about a block's worth
        self.data += "\n".join(values.to_pylist()).encode("utf-8", "replace")
        self.data += b"\n"
