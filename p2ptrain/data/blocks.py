"""What reading one block of a shard gives: its text, where the next block starts, and what was skipped.

Problems with the data are of three sizes.  A record that does not decode (not JSON, nested too deep,
too large, not an object, no text field) is a :class:`RecordFailure` inside an otherwise good block:
skipped and counted, the block goes on.  A block that cannot be read at all is an exception with a
one-line message, for the stream to count and skip the shard: :class:`ShardUnreadable` (I/O errors,
a download refused or given up) or :class:`ShardMalformed` (anything else: the file is not what its
format promises, or decoding it failed in a way no record can be blamed for).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ShardUnreadable(Exception):
    """The shard cannot be read now (I/O error, download failed or refused, checksum mismatch)."""


class ShardMalformed(Exception):
    """The shard's content is not what its format promises; the message names the place."""


class MissingTextField(ShardMalformed):
    """Records without the ``task.text_field`` field (or column): most likely a config mistake."""


@dataclass(frozen=True)
class RecordFailure:
    """A record skipped because it did not decode: where (a byte for JSONL, a row for Parquet) and why.

    ``count``: the records it stands for (a Parquet row group refused whole is one failure of many
    rows).  ``missing_field``: the record has no ``task.text_field`` (a config mistake, most likely).
    """

    offset: int
    reason: str
    count: int = 1
    missing_field: bool = False


@dataclass
class BlockRead:
    """``data``: the block's text. ``next_offset``: where the record after it starts (records
    formats) or where reading stopped (text). ``at_end``: nothing of the shard follows.
    ``bad_records``: records without usable text (null, not a string), skipped.
    ``failures``: records that did not decode, skipped (reading stops early at ``max_failures``)."""

    data: bytearray
    next_offset: int
    at_end: bool
    bad_records: int = 0
    failures: list[RecordFailure] = field(default_factory=list)

    @property
    def failed_records(self) -> int:
        return sum(failure.count for failure in self.failures)
