"""Shards and indexes in object stores (``s3://``, ``gs://``, ``hf://``...), read through fsspec.

The download itself is :class:`p2ptrain.data.remote.ShardFetcher`'s, exactly as for http(s): the
checksum, the size cap (the object's size stands for ``Content-Length``: a larger one is refused before
a byte is read), the cache, the retries.  This module only opens the object as a response the fetcher
reads a chunk at a time, and turns whatever the store's client raises into what the fetcher knows: a
missing object or a refused credential is :class:`ObjectUnavailable` (not asked again), anything else
an ``OSError`` (weather: retried).  The store's client (``s3fs``, ``gcsfs``, ``huggingface_hub``, ``adlfs``)
reaches the store's own endpoints with the credentials and timeouts of its usual environment; the address rules of
:mod:`p2ptrain.data.addresses` are for http(s) URLs, whose host anyone may choose.

fsspec and the clients come with ``pip install 'p2ptrain[cloud]'``; :func:`require_store` says, in one
config line, what is missing before a node starts.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

from p2ptrain.config.checks import url_scheme
from p2ptrain.config.schema import ConfigError
from p2ptrain.errors import printable

#: The package each store's fsspec client comes in.
CLIENT_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub", "az": "adlfs",
                   "abfs": "adlfs"}
_CHUNK = 1 << 20


class ObjectUnavailable(Exception):
    """The object is not there, or the store refuses this node: another try would only repeat it."""


def require_store(url: str) -> None:
    """A :class:`ConfigError` line naming what to install when the client of ``url``'s store is missing."""
    scheme = url_scheme(url)
    package = CLIENT_PACKAGES.get(scheme, scheme)
    try:
        import fsspec

        fsspec.get_filesystem_class(scheme)
    except ImportError:
        raise ConfigError(f"task.data_path: {scheme}:// URLs need fsspec and {package}: "
                          f"pip install 'p2ptrain[cloud]'") from None
    except ValueError as error:  # fsspec knows no such protocol
        raise ConfigError(f"task.data_path: {printable(url[:120])}: {error}") from None


def open_object(url: str) -> ObjectResponse:
    """The object at ``url``, opened for reading a chunk at a time, with its size as its announced length."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
        size = fs.size(path)
        handle = fs.open(path, "rb", block_size=_CHUNK)
    except (FileNotFoundError, PermissionError) as error:
        raise ObjectUnavailable(f"{type(error).__name__}: {_first_line(error)}") from None
    except Exception as error:  # a store client's own errors (network, throttling): weather
        raise OSError(f"{type(error).__name__}: {_first_line(error)}") from None
    return ObjectResponse(handle, size if isinstance(size, int) else None)


class ObjectResponse:
    """An open object as the fetcher reads a response: ``headers["Content-Length"]``, ``read(n)``, a context."""

    def __init__(self, handle: Any, size: int | None) -> None:
        self._handle = handle
        self.headers = {"Content-Length": str(size)} if size is not None else {}

    def read(self, count: int) -> bytes:
        try:
            return bytes(self._handle.read(count))
        except Exception as error:  # cut off mid-object: retried like an http body cut short
            raise OSError(f"{type(error).__name__}: {_first_line(error)}") from None

    def __enter__(self) -> ObjectResponse:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        with contextlib.suppress(Exception):  # closing a read-only handle: nothing to keep
            self._handle.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else "no detail"
