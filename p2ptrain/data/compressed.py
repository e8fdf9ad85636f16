"""Compressed shards (gzip, zstd): decompressed once, as a stream, into a plain copy in the data cache.

The readers seek (to a block's byte, to a JSONL line, to a Parquet footer), and a compressed
stream cannot seek without decompressing everything before the offset, which would make every
block cost the whole shard up to it.  So a compressed shard is decompressed once, one chunk at a
time (memory: one chunk, whatever the shard), into a temp file beside the cache, renamed into place
when complete, and read from then on as any plain file.  A decompression bomb is bounded like a
download: output past ``max_bytes`` (``task.max_shard_mb``) stops the decompression and refuses
the shard (:class:`ShardUnreadable`: skipped for the pass, counted, one warning line), and a stream
that does not decompress (corrupt, cut short) is :class:`ShardMalformed`.  The copy of a local file
is named by its path, size and modification time, so a changed file is decompressed again.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any

from p2ptrain.config.schema import ConfigError
from p2ptrain.data.blocks import ShardMalformed, ShardUnreadable

#: Name endings that say how a file is compressed (``task.data_compression = "auto"``).
SUFFIXES: dict[str, str] = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PLAIN_PREFIX = "plain-"
_CHUNK = 1 << 20
_ZSTD_MISSING = "zstd shards need the zstandard package: pip install 'p2ptrain[zstd]' (or zstandard)"


def compression_of(name: str, setting: str) -> str:
    """``"gzip"``, ``"zstd"`` or ``""`` (plain) for a file called ``name`` under ``task.data_compression``."""
    if setting == "none":
        return ""
    if setting != "auto":
        return setting
    lowered = name.lower()
    return next((kind for suffix, kind in SUFFIXES.items() if lowered.endswith(suffix)), "")


def without_suffix(name: str) -> str:
    """``name`` less a compression ending (``a.jsonl.gz`` -> ``a.jsonl``), to tell its format by."""
    lowered = name.lower()
    suffix = next((s for s in SUFFIXES if lowered.endswith(s)), "")
    return name[: len(name) - len(suffix)] if suffix else name


def require_codec(compression: str) -> None:
    """Raise :class:`ConfigError` naming ``task.data_path`` when ``compression`` cannot be read here."""
    if compression == "zstd":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise ConfigError(f"task.data_path: {_ZSTD_MISSING}") from None


def plain_name(path: Path | None, url: str, sha256: str, compression: str) -> str:
    """The cache name of a shard's plain copy: by URL and checksum, or by a local file's path, size and mtime.

    Raises :class:`ShardUnreadable` when the local file cannot be looked at.
    """
    if url:
        key = f"{url}\x00{sha256}\x00{compression}"
        base = url.rstrip("/").rsplit("/", 1)[-1]
    else:
        assert path is not None
        try:
            stat = path.stat()
        except OSError as exc:
            raise ShardUnreadable(exc.strerror or str(exc)) from None
        key = f"{path.absolute()}\x00{stat.st_size}\x00{stat.st_mtime_ns}\x00{compression}"
        base = path.name
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in without_suffix(base))[-80:] or "shard"
    return f"{PLAIN_PREFIX}{hashlib.blake2b(key.encode(), digest_size=12).hexdigest()}-{safe}"


def decompress_to(source: Path, compression: str, target: Path, max_bytes: int) -> None:
    """Decompress ``source`` into ``target`` (atomically), at most ``max_bytes`` of output (0: no limit)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=".part-", dir=target.parent)
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out, source.open("rb") as raw, _reader(raw, compression) as stream:
            written = 0
            while chunk := _read(stream, compression):
                written += len(chunk)
                if max_bytes and written > max_bytes:
                    raise ShardUnreadable(f"decompresses to more than the {max_bytes} bytes allowed "
                                          "(task.max_shard_mb): refused as a decompression bomb")
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except OSError as exc:
        raise ShardUnreadable(f"cannot decompress it ({exc.strerror or exc})") from None
    finally:
        temp.unlink(missing_ok=True)


def _reader(raw: IO[bytes], compression: str) -> Any:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    try:
        import zstandard
    except ImportError:
        raise ShardUnreadable(_ZSTD_MISSING) from None
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


def _read(stream: Any, compression: str) -> bytes:
    """One chunk of output; a stream that does not decompress is :class:`ShardMalformed`."""
    try:
        return bytes(stream.read(_CHUNK))
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ShardMalformed(f"does not decompress as {compression} ({exc or type(exc).__name__})") from None
    except OSError:
        raise
    except Exception as exc:  # zstandard.ZstdError and whatever else a hostile stream makes a decoder raise
        raise ShardMalformed(f"does not decompress as {compression} ({type(exc).__name__}: "
                             f"{str(exc).strip()[:200] or 'no message'})") from None


def touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # only the cache's eviction order suffers
        os.utime(path)
