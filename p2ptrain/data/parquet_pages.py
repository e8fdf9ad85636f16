"""What each page of a Parquet column chunk decodes to, read from the page headers before anything is decoded.

A Parquet reader decompresses a page whole into a buffer of the size its header announces, so the
headers bound what decoding a column chunk can cost: a 3.5 KB file can hold a page that decodes to
96 MiB, and only its header says so.  The footer's sizes are the writer's claim and are not checked
against the pages by the reader; the page headers are what the reader itself allocates by.

The headers are Thrift compact-protocol structs (``PageHeader`` in parquet.thrift); this module reads
the few fields it needs and skips the rest, with every length checked against the bytes there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

#: PageHeader.type values (parquet.thrift ``PageType``).
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
#: A page header larger than this is refused (Arrow's own limit is 16 MiB; honest ones are under 10 KB).
MAX_HEADER_BYTES = 1 << 20
_FIRST_READ = 1024
_MAX_DEPTH = 16
#: Thrift compact types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class PagesMalformed(Exception):
    """The column chunk's page headers do not parse or do not fit in the chunk; the message says where."""


@dataclass(frozen=True)
class Page:
    """One page: its kind, how many bytes it decompresses to, its bytes in the file, its values (rows)."""

    kind: int
    uncompressed: int
    compressed: int
    values: int


@dataclass(frozen=True)
class ChunkPages:
    """A column chunk's pages, summed up: what decoding any part of it can cost."""

    pages: int
    #: The largest page, dictionary pages included: the most one decoding step allocates.
    largest: int
    #: The largest bytes per value of any data page (rounded up): a bound on ``n`` rows' decoded bytes
    #: of about ``n * densest`` plus the two pages at either end.
    densest: int
    #: The largest dictionary page (0: none). A dictionary-encoded row decodes to one of its values, so
    #: ``n`` such rows to at most ``n * dictionary`` bytes, however small their data pages are.
    dictionary: int


def chunk_pages(file: BinaryIO, start: int, length: int, file_size: int) -> ChunkPages:
    """Walk the page headers of the column chunk at ``start`` (``length`` bytes, headers included)."""
    end = start + length
    if start < 0 or length < 0 or end > file_size:
        raise PagesMalformed(f"column chunk at byte {start} ({length} bytes) lies outside the file ({file_size} bytes)")
    position, count, largest, densest, dictionary = start, 0, 0, 0, 0
    while position < end:
        page, header = _header_at(file, position, end)
        if page.uncompressed < 0 or page.compressed < 0 or page.values < 0:
            raise PagesMalformed(f"the page at byte {position} has a negative size or count")
        count += 1
        largest = max(largest, page.uncompressed)
        if page.kind == DICTIONARY_PAGE:
            dictionary = max(dictionary, page.uncompressed)
        elif page.kind in (DATA_PAGE, DATA_PAGE_V2):
            densest = max(densest, -(-page.uncompressed // max(page.values, 1)))
        position += header + page.compressed
    if position != end:
        raise PagesMalformed(f"the last page of the column chunk at byte {start} runs past its end")
    return ChunkPages(count, largest, densest, dictionary)


def _header_at(file: BinaryIO, position: int, end: int) -> tuple[Page, int]:
    """The page header at ``position`` and its length in bytes."""
    size = min(_FIRST_READ, end - position)
    while True:
        file.seek(position)
        raw = file.read(size)
        try:
            reader = _Reader(raw)
            return _page_header(reader), reader.position
        except _Short:
            if size >= min(MAX_HEADER_BYTES, end - position):
                raise PagesMalformed(f"the page header at byte {position} is cut off or larger than "
                                     f"{MAX_HEADER_BYTES} bytes") from None
            size = min(size * 8, MAX_HEADER_BYTES, end - position)


class _Short(Exception):
    """The bytes read so far end inside the header."""


class _Reader:
    """A cursor over Thrift compact-protocol bytes."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.position = raw, 0

    def byte(self) -> int:
        if self.position >= len(self.raw):
            raise _Short
        value = self.raw[self.position]
        self.position += 1
        return value

    def skip(self, count: int) -> None:
        if count < 0:
            raise PagesMalformed("a negative length in a page header")
        if self.position + count > len(self.raw):
            raise _Short
        self.position += count

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise PagesMalformed("a varint longer than 64 bits in a page header")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)


class _Struct:
    """The fields of one struct, in order: ``next`` gives (id, type), ids coded as deltas, None at its end."""

    def __init__(self, reader: _Reader) -> None:
        self.reader, self.last = reader, 0

    def next(self) -> tuple[int, int] | None:
        header = self.reader.byte()
        if header == 0:
            return None
        kind, delta = header & 0x0F, header >> 4
        self.last = self.last + delta if delta else self.reader.zigzag()
        return self.last, kind


def _skip(reader: _Reader, kind: int, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise PagesMalformed("a page header nested too deep")
    if kind in (_TRUE, _FALSE):
        return
    if kind == _BYTE:
        reader.skip(1)
    elif kind in (_I16, _I32, _I64):
        reader.varint()
    elif kind == _DOUBLE:
        reader.skip(8)
    elif kind == _BINARY:
        reader.skip(reader.varint())
    elif kind in (_LIST, _SET):
        header = reader.byte()
        count = header >> 4 if header >> 4 != 15 else reader.varint()
        element = header & 0x0F
        for _ in range(count):
            if element in (_TRUE, _FALSE):
                reader.skip(1)  # booleans in a collection take a byte each
            else:
                _skip(reader, element, depth + 1)
    elif kind == _MAP:
        count = reader.varint()
        if count:
            types = reader.byte()
            for _ in range(count):
                _skip(reader, types >> 4, depth + 1)
                _skip(reader, types & 0x0F, depth + 1)
    elif kind == _STRUCT:
        fields = _Struct(reader)
        while (field := fields.next()) is not None:
            _skip(reader, field[1], depth + 1)
    else:
        raise PagesMalformed(f"unknown Thrift type {kind} in a page header")


def _page_header(reader: _Reader) -> Page:
    kind = uncompressed = compressed = -1
    values = 0
    fields = _Struct(reader)
    while (field := fields.next()) is not None:
        number, type_ = field
        if number in (1, 2, 3) and type_ == _I32:
            value = reader.zigzag()
            if number == 1:
                kind = value
            elif number == 2:
                uncompressed = value
            else:
                compressed = value
        elif number in (5, 7, 8) and type_ == _STRUCT:
            values = _values_of(reader, v2=number == 8)
        else:
            _skip(reader, type_, 1)
    if kind < 0 or uncompressed < 0 or compressed < 0:
        raise PagesMalformed("a page header without its type or sizes")
    return Page(kind, uncompressed, compressed, values)


def _values_of(reader: _Reader, *, v2: bool) -> int:
    """``num_values`` of a (dictionary) data page header; a v2 data page's ``num_rows`` when it has one."""
    values, rows = 0, -1
    fields = _Struct(reader)
    while (field := fields.next()) is not None:
        number, type_ = field
        if type_ == _I32 and number == 1:
            values = reader.zigzag()
        elif type_ == _I32 and number == 3 and v2:
            rows = reader.zigzag()
        else:
            _skip(reader, type_, 2)
    return rows if rows >= 0 else values
