"""Shards at http(s) and object-store URLs: download once into a local cache, check the sha256, retry with backoff.

A shard is downloaded to a temp file beside the cache, hashed while it streams in, and renamed
into place only when complete and matching its checksum, so a file in the cache is always a
whole, verified shard.  Files with a checksum are named by it (an index that moves a shard to
another mirror does not download it again).  A download that keeps failing is retried a few
times with growing waits (:func:`p2ptrain.waiting.retry`) and then given up for this pass
(:class:`ShardUnreadable`); the stream skips the shard and counts it.  A body shorter than its
``Content-Length`` (a connection cut mid-download) is weather like any other failure: without a
checksum it would otherwise pass for a whole shard.  A checksum mismatch is tried once more (a
transfer can be damaged on the way), then given up; a 4xx answer other than 408/429 is not weather and is not retried.

The rules every download keeps, whatever the retries: at most ``max_shard_bytes`` per shard (a
larger ``Content-Length`` is refused before the body is read, and a body that grows past it is cut
off), redirects over http(s) only, and the address rules of :mod:`p2ptrain.data.addresses`, checked
before each connection: a shard listed by an index is reached from the index's host.  A download a
rule refuses is not retried, and not tried again in this process.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import socket
import tempfile
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2ptrain.config.checks import OBJECT_STORE_SCHEMES, url_scheme
from p2ptrain.config.schema import ConfigError
from p2ptrain.data.addresses import PUBLIC, AddressPolicy, Refused
from p2ptrain.data.blocks import ShardUnreadable
from p2ptrain.data.compressed import decompress_to, plain_name
from p2ptrain.data.guarded_http import Chain, open_url
from p2ptrain.data.object_store import ObjectUnavailable, open_object
from p2ptrain.data.sources import ShardRef
from p2ptrain.waiting import BACKOFF, Backoff, GaveUp, retry

log = logging.getLogger(__name__)

MAX_INDEX_BYTES = 16 * 1024 * 1024
#: The default bound on one shard's download (``task.max_shard_mb``'s default).
MAX_SHARD_BYTES = 1024 * 1024 * 1024
_CHUNK = 1 << 20
_PERMANENT_STATUS = frozenset(range(400, 500)) - {408, 429}


class _Permanent(Exception):
    """A failure that another try would only repeat."""


class _Mismatch(_Permanent):
    """The bytes do not match the checksum: tried once more, in case the transfer was damaged."""


class _Truncated(OSError):
    """The body ended before the length the server announced."""


class NotDownloaded(Exception):
    """An offline fetcher was asked for a shard or index that is not in its cache.

    Not a :class:`ShardUnreadable`: a reader that needs all of its shards (the held-out split an
    export is scored on) must not quietly go on without one.
    """


class ShardFetcher:
    """Downloads shards and indexes into ``cache_dir`` (created on first use)."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        attempts: int = 4,
        timeout: float = 60.0,
        max_cache_bytes: int = 0,
        backoff: Backoff = BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
        opener: Callable[..., Any] | None = None,
        offline: bool = False,
        max_shard_bytes: int = MAX_SHARD_BYTES,
        policy: AddressPolicy | None = None,
    ) -> None:
        self.cache_dir, self.attempts, self.timeout = Path(cache_dir), attempts, timeout
        self.max_cache_bytes, self.backoff = max_cache_bytes, backoff
        self._sleep, self._open = sleep, opener or open_remote
        #: Only what the cache holds: nothing is downloaded (:class:`NotDownloaded` instead).
        self.offline = offline
        self.max_shard_bytes = max_shard_bytes
        self.policy = policy or AddressPolicy()
        #: URLs a rule refused in this process, and why: not asked again.
        self._refused: dict[str, str] = {}
        #: What the download of each index reached (the class its shards' downloads start from).
        self._reach: dict[str, str | None] = {}

    def local_path(self, shard: ShardRef) -> Path:
        """A local file with ``shard``'s content: the file itself, or its verified download; for a compressed
        shard, its decompressed copy in the cache (the compressed download is not kept)."""
        if not shard.compression:
            return self._fetched(shard)
        plain = self.cache_dir / plain_name(Path(shard.path) if not shard.url else None, shard.url, shard.sha256,
                                            shard.compression)
        if plain.is_file():
            _touch(plain)
            return plain
        if self.offline and shard.url:
            raise NotDownloaded(f"{shard.url} is not downloaded in {self.cache_dir}")
        source = self._fetched(shard)
        try:
            decompress_to(source, shard.compression, plain, self.max_shard_bytes)
        finally:
            if shard.url:  # its checksum was checked; the plain copy is what is read from now on
                source.unlink(missing_ok=True)
        self._trim(keep=plain)
        return plain

    def _fetched(self, shard: ShardRef) -> Path:
        if not shard.url:
            return Path(shard.path)
        target = self.cache_dir / _cache_name(shard.url, shard.sha256)
        if target.is_file():
            _touch(target)  # least recently used goes first when the cache is trimmed
            return target
        if self.offline:
            raise NotDownloaded(f"{shard.url} is not downloaded in {self.cache_dir}")
        if shard.url in self._refused:
            raise ShardUnreadable(f"{self._refused[shard.url]} (refused earlier; asked again only after a restart)")
        self._download(shard.url, target, shard.sha256, limit=self.max_shard_bytes, origin=shard.origin,
                       limit_name="task.max_shard_mb")
        self._trim(keep=target)
        return target

    def read_index(self, url: str, sha256: str = "") -> bytes:
        """The bytes of the shard index at ``url`` (checked against ``sha256`` if given); the cached copy if
        the server cannot be reached now."""
        target = self.cache_dir / _cache_name(url, sha256, prefix="index")
        if self.offline and not target.is_file():
            raise NotDownloaded(f"the shard index {url} is not downloaded in {self.cache_dir}")
        try:
            if not self.offline:
                self._download(url, target, sha256, limit=MAX_INDEX_BYTES, replace=True)
        except ShardUnreadable as exc:
            if not target.is_file():
                raise ConfigError(f"task.data_path: cannot download the shard index {url}: {exc}") from None
            log.warning("shard index %s unavailable (%s): using the copy cached at %s", url, exc, target)
        try:
            listing = target.read_bytes()
        except OSError as exc:
            raise ConfigError(f"task.data_path: the shard index {url} cannot be read ({exc.strerror})") from None
        got = hashlib.sha256(listing).hexdigest()
        if sha256 and got != sha256:  # a cached copy is checked like a download
            raise ConfigError(f"task.data_path: the shard index {url} has sha256 {got}, not {sha256} as pinned")
        return listing

    def _download(self, url: str, target: Path, sha256: str, *, limit: int, replace: bool = False,
                  **rules: Any) -> None:
        last, mismatches, mismatched = "", 0, False

        def attempt() -> bool | None:
            nonlocal last, mismatches, mismatched
            try:
                self._download_once(url, target, sha256, limit, **rules)
                return True
            except _Mismatch as exc:
                mismatches += 1
                if mismatches > 1:
                    raise ShardUnreadable(str(exc)) from None
                last, mismatched = str(exc), True
            except _Permanent as exc:
                raise ShardUnreadable(str(exc)) from None
            except (OSError, urllib.error.URLError, TimeoutError, http.client.HTTPException) as exc:
                last, mismatched = _describe(exc), False
            return None

        def say_retry(tries: int, wait: float) -> None:
            log.debug("download of %s failed (%s); try %d of %d in %.1fs", url, last, tries + 1, self.attempts, wait)

        try:
            retry(attempt, tries=self.attempts, backoff=self.backoff, on_retry=say_retry, sleep=self._sleep)
        except GaveUp:
            if mismatched:  # the last try's checksum mismatch says more than a count
                raise ShardUnreadable(last) from None
            raise ShardUnreadable(f"download failed {self.attempts} time(s), last: {last}") from None

    def _download_once(self, url: str, target: Path, sha256: str, limit: int, origin: str = "",
                       limit_name: str = "") -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        fd, temp_name = tempfile.mkstemp(prefix=".part-", dir=self.cache_dir)
        temp = Path(temp_name)
        chain = Chain(self.policy, self._origin_reach(origin))
        too_large = f"more than the {limit} bytes allowed" + (f" ({limit_name})" if limit_name else "")
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    response = self._open(url, timeout=self.timeout, chain=chain)
                except Refused as exc:
                    raise self._refuse(url, f"refused: {exc}") from None
                except ObjectUnavailable as exc:
                    raise _Permanent(str(exc)) from None
                except urllib.error.HTTPError as exc:
                    if exc.code in _PERMANENT_STATUS:
                        raise _Permanent(f"HTTP {exc.code} {exc.reason}") from None
                    raise
                with response:
                    received, announced = 0, _content_length(response)
                    if limit and announced is not None and announced > limit:
                        raise self._refuse(url, f"{announced} bytes announced, {too_large}")
                    while chunk := response.read(_CHUNK):
                        received += len(chunk)
                        if limit and received > limit:
                            raise self._refuse(url, f"larger than announced: {too_large}")
                        digest.update(chunk)
                        out.write(chunk)
                    # http.client ends a body cut short silently (read() returns b""): check its length.
                    if announced is not None and received != announced:
                        raise _Truncated(f"the body ended after {received} of {announced} bytes")
                out.flush()
                os.fsync(out.fileno())
            got = digest.hexdigest()
            if sha256 and got != sha256:
                raise _Mismatch(f"checksum mismatch: expected sha256 {sha256[:16]}..., got {got[:16]}...")
            os.replace(temp, target)
            self._reach[url] = chain.reach
        finally:
            temp.unlink(missing_ok=True)

    def _refuse(self, url: str, reason: str) -> _Permanent:
        """Remember that a rule refused ``url`` (bounded: one entry per URL of the run's data)."""
        self._refused[url] = reason
        return _Permanent(reason)

    def _origin_reach(self, origin: str) -> str | None:
        """Where a download listed by ``origin`` (an index URL; empty: none) starts: what that index's
        download reached, or its host's class; an origin whose address is unknown counts as public."""
        if not origin or url_scheme(origin) in OBJECT_STORE_SCHEMES:  # a store's index lists objects, no hosts
            return None
        if origin in self._reach:
            return self._reach[origin]
        parts = urllib.parse.urlsplit(origin)
        try:
            port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
            infos = socket.getaddrinfo(parts.hostname or "", port, type=socket.SOCK_STREAM)
            return self.policy.classify(str(infos[0][4][0]), port)
        except (OSError, ValueError, IndexError):
            return PUBLIC

    def _trim(self, keep: Path) -> None:
        """Delete least recently used shards until the cache fits ``max_cache_bytes`` (0: no limit)."""
        if not self.max_cache_bytes:
            return
        entries = []
        for entry in self.cache_dir.iterdir():
            if entry.is_file() and not entry.name.startswith((".part-", "index-")) and entry != keep:
                stat = entry.stat()
                entries.append((stat.st_mtime, stat.st_size, entry))
        total = sum(size for _, size, _ in entries) + keep.stat().st_size
        for _, size, entry in sorted(entries):
            if total <= self.max_cache_bytes:
                break
            entry.unlink(missing_ok=True)
            total -= size


def open_remote(url: str, *, timeout: float, chain: Chain) -> Any:
    """GET ``url``: an object store's through its fsspec client, an http(s) URL under the address rules."""
    if url_scheme(url) in OBJECT_STORE_SCHEMES:
        return open_object(url)
    return open_url(url, timeout=timeout, chain=chain)


def _content_length(response: Any) -> int | None:
    """The body length the server announced, or None (no header, or one that is not a count)."""
    headers = getattr(response, "headers", None)
    value = headers.get("Content-Length") if headers is not None else None
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def _cache_name(url: str, sha256: str, prefix: str = "") -> str:
    base = urllib.parse.urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[-80:] or "shard"
    key = sha256[:32] if sha256 else hashlib.blake2b(url.encode(), digest_size=12).hexdigest()
    return f"{prefix + '-' if prefix else ''}{key}-{safe}"


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # only the eviction order suffers
        os.utime(path)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    if isinstance(exc, http.client.IncompleteRead):
        return f"the body ended after {len(exc.partial)} bytes"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
