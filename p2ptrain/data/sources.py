"""What ``task.data_path`` names, as a list of shards: files, byte ranges, row ranges and URLs.

Finding the shards reads only names, sizes and Parquet footers (never the text), so it is quick
even for a corpus far larger than memory.  A shard's ID depends only on the data's own layout
(a path relative to the corpus root, a name in the index), never on where a node keeps it, so
every node derives the same IDs, the same validation split and the same assignment.

* no ``data_path``: the ``.py`` files of this Python's standard library, up to ``STDLIB_MAX_BYTES``;
* a file: cut into about 20 ranges (at most ``RANGE_MAX_BYTES`` each), IDs ``name#00000003``;
* a directory or glob: every non-hidden file; big ones cut into ranges, IDs ``rel/path[#n]``;
* an index (``SHA256SUMS`` or ``*.sha256``, local or remote): one shard per listed file or URL;
  a remote index is checked against ``#sha256=<hex>`` if given, and any index against the digest
  a run's manifest recorded (``task.data_index_sha256``);
* an ``http(s)://`` URL of a data file: one shard, checked against ``#sha256=<hex>`` if given; the
  same for an object store's URL (``s3://``, ``gs://``, ``hf://``...: :mod:`p2ptrain.data.object_store`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import posixpath
import sysconfig
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from p2ptrain.config.checks import OBJECT_STORE_SCHEMES, is_data_url, url_scheme
from p2ptrain.config.schema import ConfigError
from p2ptrain.data.compressed import compression_of, require_codec, without_suffix
from p2ptrain.data.object_store import require_store
from p2ptrain.errors import printable

Kind = Literal["text", "jsonl", "parquet"]

STDLIB_MAX_BYTES = 8 * 1024 * 1024
"""Cap on the default corpus: files in sorted relative-path order, each taken while it still fits."""
RANGE_MAX_BYTES = 16 * 1024 * 1024
"""A text or JSONL file larger than this is read as several shards of at most this size."""
SINGLE_FILE_SHARDS = 20
"""A lone data file is cut into about this many shards, so several peers and a validation split fit."""

_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
_INDEX_SUFFIXES = (".sha256",)
_INDEX_NAMES = ("SHA256SUMS",)


@dataclass(frozen=True)
class ShardRef:
    """One unit of data: a whole file or a range of one, local or at a URL.

    ``start``/``end`` count bytes for text and JSONL and rows for Parquet; ``end = -1`` means
    "to the end of the file".  ``size`` is the range's length in bytes where known (-1 if not).
    ``origin``: the URL of the index that listed a URL shard (its download starts from that host).
    """

    id: str
    kind: Kind
    path: str = ""
    url: str = ""
    sha256: str = ""
    start: int = 0
    end: int = -1
    size: int = -1
    origin: str = ""
    #: ``"gzip"`` or ``"zstd"``: read through a decompressed copy (a compressed file is one whole shard).
    compression: str = ""


@dataclass(frozen=True)
class ShardSet:
    shards: tuple[ShardRef, ...]
    source: str
    #: The sha256 of the shard index's bytes ("" when the data is not an index).
    index_sha256: str = ""


IndexReader = Callable[[str, str], bytes]
"""Returns the bytes of a shard index at a URL, checked against a sha256 when one is given (downloads it,
with retries and a cache)."""


def kind_of(name: str, data_format: str) -> Kind:
    if data_format != "auto":
        return data_format  # type: ignore[return-value]
    lowered = without_suffix(name.lower())
    if lowered.endswith(".jsonl"):
        return "jsonl"
    if lowered.endswith((".parquet", ".pq")):
        return "parquet"
    return "text"


def join_url(base: str, name: str) -> str:
    """``name`` (a URL, or a name relative to the index at ``base``) as a URL; relative names stay within
    an object store's bucket (``urljoin`` knows only web schemes)."""
    if url_scheme(name) or url_scheme(base) in ("http", "https"):
        return urllib.parse.urljoin(base, name)
    parts = urllib.parse.urlsplit(base)
    path = posixpath.normpath(posixpath.join(posixpath.dirname(parts.path) or "/", name))
    if not path.startswith("/") or path.startswith("//"):
        path = "/" + path.lstrip("/")
    return urllib.parse.urlunsplit(parts._replace(path=path, query="", fragment=""))


def is_index(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base in _INDEX_NAMES or base.lower().endswith(_INDEX_SUFFIXES)


def names_an_index(data_path: str | None) -> bool:
    """Whether ``data_path`` is a shard index (a local file or a URL), the data a digest can pin."""
    if data_path is None:
        return False
    if is_data_url(data_path):
        return is_index(urllib.parse.urlsplit(data_path).path)
    return not glob.has_magic(data_path) and is_index(Path(os.path.expanduser(data_path)).name)


def discover(data_path: str | None, data_format: str, seq_len: int, read_index: IndexReader,
             index_sha256: str | None = None, compression: str = "auto") -> ShardSet:
    """The shards of ``data_path``; raises :class:`ConfigError` naming ``task.data_path``.

    ``index_sha256`` (a run's ``task.data_index_sha256``): the data must be a shard index with exactly
    this digest, or it is not the data the run was created with.
    """
    found = _discover(data_path, data_format, seq_len, read_index, compression)
    for used in sorted({shard.compression for shard in found.shards} - {""}):
        require_codec(used)
    if index_sha256 is not None and found.index_sha256 != index_sha256:
        if not found.index_sha256:
            raise ConfigError(f"task.data_index_sha256: the run's data is a shard index with sha256 {index_sha256}, "
                              f"but task.data_path ({printable(found.source)}) is not a shard index")
        raise ConfigError(f"task.data_index_sha256: the shard index {printable(found.source)} has sha256 "
                          f"{found.index_sha256}, but the run was created with sha256 {index_sha256}: this "
                          "is not the run's data")
    return found


def _discover(data_path: str | None, data_format: str, seq_len: int, read_index: IndexReader,
              compression: str) -> ShardSet:
    if data_path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        return ShardSet(tuple(stdlib_shards(root, STDLIB_MAX_BYTES)), f"stdlib {root}")
    if is_data_url(data_path):
        if url_scheme(data_path) in OBJECT_STORE_SCHEMES:
            require_store(data_path)
        if is_index(urllib.parse.urlsplit(data_path).path):
            bare, pin = split_pin(data_path)
            listing = read_index(bare, pin)
            return ShardSet(tuple(index_shards(_index_text(listing, bare), bare, data_format, compression)), bare,
                            hashlib.sha256(listing).hexdigest())
        return ShardSet((url_shard(data_path, data_format, compression),), data_path)
    text = os.path.expanduser(data_path)
    if glob.has_magic(text):
        return ShardSet(tuple(glob_shards(text, data_format, seq_len, compression)), text)
    path = Path(text)
    if not path.exists():
        raise ConfigError(f"task.data_path: {printable(path)} does not exist")
    if path.is_dir():
        files = _visible_files(path, sorted(p for p in path.rglob("*") if p.is_file()))
        if not files:
            raise ConfigError(f"task.data_path: {printable(path)} has no data files")
        return ShardSet(tuple(_file_shards(files, path, data_format, seq_len, single=False,
                                                  compression=compression)), str(path))
    if is_index(path.name):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"task.data_path: cannot read the index {printable(path)} ({printable(exc)})") from None
        listed = index_shards(_index_text(raw, str(path)), str(path), data_format, compression)
        return ShardSet(tuple(listed), str(path), hashlib.sha256(raw).hexdigest())
    shards = _file_shards([path], path.parent, data_format, seq_len, single=True, compression=compression)
    if not shards:
        raise ConfigError(f"task.data_path: {printable(path)} is empty")
    return ShardSet(tuple(shards), str(path))


def _index_text(raw: bytes, location: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"task.data_path: the index {printable(location)} is not UTF-8 text ({exc.reason} at "
                          f"byte {exc.start})") from None


def split_pin(url: str) -> tuple[str, str]:
    """``url`` without its ``#sha256=<hex>`` fragment (as in pip requirement URLs), and the digest ("" if none)."""
    parts = urllib.parse.urlsplit(url)
    expected = ""
    if parts.fragment:
        name, _, value = parts.fragment.partition("=")
        if name.lower() != "sha256" or not _is_sha256(value):
            raise ConfigError(
                f"task.data_path: the URL fragment must be #sha256=<64 hex digits>, got #{parts.fragment}"
            )
        expected = value.lower()
    return urllib.parse.urlunsplit(parts._replace(fragment="")), expected


def stdlib_shards(root: Path, max_bytes: int) -> list[ShardRef]:
    """The stdlib's ``.py`` files as whole-file text shards, sorted, within ``max_bytes`` in all.

    Skipped folders are pruned during the walk (site-packages alone can hold far more files).
    """
    found: list[tuple[str, Path]] = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if name not in _STDLIB_SKIP_DIRS]
        relative = Path(folder).relative_to(root)
        found.extend(((relative / n).as_posix(), Path(folder, n)) for n in filenames if n.endswith(".py"))
    shards, total = [], 0
    for key, path in sorted(found):
        try:
            size = path.stat().st_size
        except OSError:
            continue  # an unreadable stdlib file only makes the default corpus a little smaller
        if size == 0 or total + size > max_bytes:
            continue  # a big file that does not fit must not end the walk: smaller ones after it may
        shards.append(ShardRef(key, "text", path=str(path), start=0, end=size, size=size))
        total += size
    return shards


def glob_shards(pattern: str, data_format: str, seq_len: int, compression: str = "auto") -> list[ShardRef]:
    base = Path(_glob_base(pattern))
    matches = sorted(Path(p).absolute() for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    files = _visible_files(base, matches)
    if not files:
        raise ConfigError(f"task.data_path: no files match the glob {pattern!r}")
    return _file_shards(files, base, data_format, seq_len, single=False, compression=compression)


def _glob_base(pattern: str) -> str:
    """The folder a glob's matches are named relative to: its longest prefix without wildcards."""
    fixed: list[str] = []
    for part in Path(pattern).parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return str(Path(*fixed).absolute()) if fixed else str(Path.cwd())


def _visible_files(root: Path, files: list[Path]) -> list[Path]:
    visible = []
    for path in files:
        try:
            relative = path.relative_to(root)
        except ValueError:
            relative = Path(path.name)
        if not any(part.startswith(".") for part in relative.parts) and not is_index(path.name):
            visible.append(path)
    return visible


def _file_shards(files: list[Path], root: Path, data_format: str, seq_len: int, *, single: bool,
                 compression: str = "auto") -> list[ShardRef]:
    shards: list[ShardRef] = []
    for path in files:
        key = path.relative_to(root).as_posix() if not single else path.name
        kind = kind_of(path.name, data_format)
        packed = compression_of(path.name, compression)
        try:
            if packed:
                # A compressed stream cannot be cut by byte or row without reading it all: one whole shard.
                if path.stat().st_size:
                    shards.append(ShardRef(key, kind, path=str(path), compression=packed))
                continue
            if kind == "parquet":
                shards.extend(_parquet_ranges(path, key, single))
                continue
            size = path.stat().st_size
        except OSError as exc:
            reason = printable(exc.strerror or exc)
            raise ConfigError(f"task.data_path: cannot read {printable(path)} ({reason})") from None
        if size == 0:
            continue  # nothing to read (an empty __init__.py)
        chunk = RANGE_MAX_BYTES
        if single:
            chunk = max(seq_len + 1, min(RANGE_MAX_BYTES, -(-size // SINGLE_FILE_SHARDS)))
        if size <= chunk and not single:
            shards.append(ShardRef(key, kind, path=str(path), start=0, end=size, size=size))
            continue
        for i, start in enumerate(range(0, size, chunk)):
            end = min(size, start + chunk)
            shards.append(ShardRef(f"{key}#{i:08d}", kind, path=str(path), start=start, end=end, size=end - start))
    return shards


def _parquet_ranges(path: Path, key: str, single: bool) -> list[ShardRef]:
    """Row ranges of a Parquet file: its row groups, or ~20 even ranges of a lone small file."""
    try:
        import pyarrow.parquet as pq  # only runs that read Parquet pay for pyarrow
    except ImportError:
        raise ConfigError(f"task.data_path: reading the Parquet file {printable(path)} needs pyarrow: "
                          "pip install 'p2ptrain[parquet]'") from None
    try:
        metadata = pq.ParquetFile(path).metadata
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError...: all mean "not a Parquet file"
        raise ConfigError(f"task.data_path: {printable(path)} is not a readable Parquet file "
                          f"({_first_line(exc)})") from None
    groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    total = sum(groups)
    bounds: list[int] = [0]
    if single and len(groups) < SINGLE_FILE_SHARDS:
        step = max(1, -(-total // SINGLE_FILE_SHARDS))
        bounds = list(range(0, total, step))
    else:
        for rows in groups[:-1]:
            bounds.append(bounds[-1] + rows)
    bounds.append(total)
    size = path.stat().st_size
    ranges = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return [
        ShardRef(f"{key}#{i:08d}" if len(ranges) > 1 or single else key, "parquet", path=str(path),
                 start=a, end=b, size=size * (b - a) // max(total, 1))
        for i, (a, b) in enumerate(ranges)
    ]


def url_shard(url: str, data_format: str, compression: str = "auto") -> ShardRef:
    """One shard at ``url``; a ``#sha256=<hex>`` fragment (as in pip requirement URLs) is its checksum."""
    bare, expected = split_pin(url)
    parts = urllib.parse.urlsplit(bare)
    name = parts.path.rstrip("/").rsplit("/", 1)[-1] or parts.netloc
    return ShardRef(name, kind_of(name, data_format), url=bare, sha256=expected,
                    compression=compression_of(name, compression))


def index_shards(listing: str, location: str, data_format: str, compression: str = "auto") -> list[ShardRef]:
    """Shards listed in a ``sha256sum``-style index at ``location`` (a path or URL).

    Each line is ``<sha256>  <name>`` (what ``sha256sum *.jsonl > SHA256SUMS`` writes) or just
    ``<name>``; names are file names or URLs, relative names are resolved against the index's own
    location; blank lines and ``#`` comments are ignored.
    """
    remote = is_data_url(location)
    shards: dict[str, ShardRef] = {}
    for number, raw in enumerate(listing.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        digest, _, rest = line.partition(" ")
        if _is_sha256(digest) and rest.strip():
            name = rest.strip().removeprefix("*")  # sha256sum's binary-mode marker
        else:
            digest, name = "", line
        if remote or is_data_url(name):
            target = join_url(location, name)
            if not is_data_url(target):
                raise ConfigError(f"task.data_path: {printable(location)} line {number}: only http(s) and object "
                                  f"store URLs can be read, got {name!r}")
            if remote and not _within_reach(location, target):
                raise ConfigError(f"task.data_path: {printable(location)} line {number}: {printable(target[:120])} "
                                  "is out of this index's reach (an http(s) index lists http(s) URLs, a store's "
                                  "index objects of its own bucket)")
            target_path = urllib.parse.urlsplit(target).path
            shard = ShardRef(name, kind_of(target_path, data_format), url=target, sha256=digest.lower(),
                             origin=location if remote else "", compression=compression_of(target_path, compression))
        else:
            path = Path(location).parent / name
            if not path.is_file():
                raise ConfigError(f"task.data_path: {printable(location)} line {number}: "
                                  f"{printable(path)} is not a file")
            packed = compression_of(name, compression)
            shard = ShardRef(name, kind_of(name, data_format), path=str(path),
                             size=-1 if packed else path.stat().st_size, compression=packed)
        shards[shard.id] = shard
    if not shards:
        raise ConfigError(f"task.data_path: the index {printable(location)} lists no shards")
    return sorted(shards.values(), key=lambda shard: shard.id)


def _within_reach(index: str, target: str) -> bool:
    """Whether an index at ``index`` may list ``target``: an object store is read with this machine's own
    credentials, so only the owner's data path may name one, not a line of a web server's index, and a
    store's index names objects of its own bucket only."""
    index_scheme, target_scheme = url_scheme(index), url_scheme(target)
    if index_scheme in OBJECT_STORE_SCHEMES or target_scheme in OBJECT_STORE_SCHEMES:
        return (index_scheme, urllib.parse.urlsplit(index).netloc) == (target_scheme,
                                                                       urllib.parse.urlsplit(target).netloc)
    return True


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
