"""Checks on config values that types alone cannot express: names, references, addresses, hosts,
data paths and the local filesystem.

The value checks are pure and run as the config sections' field validators (each returns the
value or raises ValueError saying why; pydantic names the field and the value).  The path checks look at the filesystem,
so they run when a config is loaded (``p2ptrain config check``, ``p2ptrain run``, a reload), not
whenever a section object is built: a config is judged on the machine that will use it, before
the node joins anything, instead of failing minutes later after it joined the swarm.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from multiaddr import Multiaddr
from pydantic import BaseModel, Field

from p2ptrain.errors import ConfigError, printable

_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
#: What can only have been meant as an IPv4 address (a host name never consists of digits only).
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
#: Object stores ``task.data_path`` may name, read through fsspec (``p2ptrain[cloud]``): Amazon S3 and
#: compatible stores, Google Cloud Storage, Hugging Face dataset repositories, Azure Blob Storage.
OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs", "hf", "az", "abfs")
#: Every scheme of a URL ``task.data_path`` (or a shard index line) may name.
DATA_URL_SCHEMES = ("http", "https", *OBJECT_STORE_SCHEMES)
_GLOB_CHARACTERS = frozenset("*?[")


class Directory:
    """Marks a path setting that names a directory (it need not exist yet): every such setting is
    checked against this machine's filesystem when a config is loaded (:func:`filesystem_problem`)."""


#: A directory setting; None: its default (under the state directory, or the platform's).
DirectoryPath = Annotated[Path | None, Field(strict=False), Directory()]


def run_id(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", value):
        raise ValueError("must be 1-64 characters of letters, digits, '_' and '-' "
                         "(hivemind keys cannot contain '.')")
    return value


def run_reference(value: str | None) -> str | None:
    from p2ptrain.runref import RunRef  # stdlib only

    if value is not None:
        try:
            RunRef.parse(value)
        except ConfigError:
            raise ValueError("not a run reference; expected NAME@<26 characters a-z2-7>, "
                             "as printed by p2ptrain run init") from None
    return value


def invite_token(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"p2ptrain-invite-v1\.[A-Za-z0-9_.-]{1,4000}", value.strip()):
        raise ValueError("not an invite token (expected p2ptrain-invite-v1.<...>, "
                         "as printed by p2ptrain run invite)")
    return value.strip() if value is not None else None


def parse_multiaddr(text: str, *, need_peer_id: bool = False) -> Multiaddr:
    """Parse ``text`` with py-multiaddr; ``need_peer_id`` demands a trailing ``/p2p/<id>``."""
    try:
        addr = Multiaddr(text)
    except Exception as exc:  # py-multiaddr raises several unrelated exception types
        raise ValueError(f"not a valid multiaddr {text!r} ({exc})") from None
    if need_peer_id and "/p2p/" not in str(addr):
        raise ValueError(f"multiaddr {text!r} has no /p2p/<peer id> part; copy it from the first node's log")
    return addr


def multiaddrs(values: list[str]) -> list[str]:
    for value in values:
        parse_multiaddr(value)
    return values


def announce_multiaddrs(values: list[str]) -> list[str]:
    """Addresses other peers dial: a real host and an explicit port (libp2p cannot announce port 0)."""
    for value in values:
        parse_multiaddr(value)
        parts = value.split("/")
        if "0.0.0.0" in parts or "::" in parts:
            raise ValueError(f"{value!r}: announce the address peers dial (a public IP or name), not a wildcard")
        if any(proto in ("tcp", "udp") and port == "0" for proto, port in zip(parts, parts[1:], strict=False)):
            raise ValueError(f"{value!r}: announce an explicit port (the forwarded one), not port 0")
    return values


def peer_multiaddrs(values: list[str]) -> list[str]:
    """Addresses of peers to dial: each must name the peer (``/p2p/<id>``)."""
    for value in values:
        parse_multiaddr(value, need_peer_id=True)
    return values


def path_as_text(value: object) -> object:
    """A Path (tests, Python callers) is as good as a string; URLs cannot be Paths ("//" collapses)."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def data_path_shape(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip() or "\x00" in value:
        raise ValueError("must be a path, a glob or a URL (http(s)://, or an object store's)")
    scheme = url_scheme(value)
    if scheme and scheme not in DATA_URL_SCHEMES:
        known = ", ".join(f"{name}://" for name in DATA_URL_SCHEMES)
        raise ValueError(f"cannot read a {scheme}:// URL (these can be read: {known})")
    return value


def url_scheme(text: str) -> str:
    """The lowercase scheme of ``text`` if it is a URL (``scheme://...``), else ""."""
    found = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", text)
    return found[1].lower() if found else ""


def is_data_url(text: str) -> bool:
    """Whether ``text`` is a URL of data read remotely (the same for every node): http(s), or an object store's."""
    return url_scheme(text) in DATA_URL_SCHEMES


def sha256_hex(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError("must be a sha256 digest: 64 lowercase hex digits, as sha256sum prints them")
    return value


def entrypoint(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        raise ValueError(f"must look like 'package.module:function', got {value!r}")
    return value


def check_host(value: str) -> str:
    """``value`` if it is an IP address or a valid host name (RFC 1123), else ValueError saying why
    (the caller names the field and the value)."""
    if value.startswith("[") and value.endswith("]"):
        raise ValueError("write an IPv6 address without brackets")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if _DOTTED_NUMBERS.fullmatch(value):
        raise ValueError("not a valid IPv4 address")
    if len(value) > 253 or not _HOSTNAME.fullmatch(value):
        raise ValueError("not an IP address or host name (e.g. 127.0.0.1, 0.0.0.0, ::1, localhost)")
    return value


def is_local_path(text: str) -> bool:
    """False for what names data elsewhere or many files at once (a URL, a glob): only a plain
    local path can be checked for existence before the task reads it."""
    return not is_data_url(text) and not _GLOB_CHARACTERS & set(text)


def _kind(path: Path) -> str | None:
    """"dir", "file", "other", None (nothing there), or "unknown" (cannot look: permissions)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return "unknown"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def _expand(path: Path) -> Path | str:
    """``~`` expanded, or why it cannot be (an unknown user)."""
    try:
        return path.expanduser()
    except RuntimeError:
        return f"cannot expand {printable(path)}: no such user or no home directory"


def missing_data_path(text: str | Path) -> str | None:
    """Why ``text`` cannot be read as training data, or None when it exists (or is not local: a URL,
    a glob).  Taken as text, because a Path would fold a URL's ``//``."""
    if not is_local_path(str(text)):
        return None
    if "\0" in str(text):
        return "a path cannot contain a NUL character"
    resolved = _expand(Path(text))
    if isinstance(resolved, str):
        return resolved
    kind = _kind(resolved)
    if kind is None:
        return f"{printable(resolved)} does not exist"
    if kind == "other":
        return f"{printable(resolved)} is neither a file nor a directory"
    return None


def unusable_directory(path: Path) -> str | None:
    """Why ``path`` cannot be (or become) a directory, or None.  The directory need not exist yet,
    but neither it nor any of its parents may be an existing non-directory."""
    if "\0" in str(path):
        return "a path cannot contain a NUL character"
    resolved = _expand(path)
    if isinstance(resolved, str):
        return resolved
    for candidate in (resolved, *resolved.parents):
        kind = _kind(candidate)
        if kind in ("dir", "unknown"):
            return None
        if kind is not None:
            where = "" if candidate == resolved else f" (its parent {printable(candidate)} is not a directory)"
            return f"{printable(resolved)} is not a directory{where}"
    return None


def filesystem_problem(config: BaseModel) -> tuple[tuple[str, str], str] | None:
    """The first path setting of ``config`` (a model of sections) that cannot work on this machine,
    as ((section, key), problem): the training data (``task.data_path``) must exist, and every
    directory setting must be, or be able to become, a directory."""
    return next(filesystem_problems(config), None)


def filesystem_problems(config: BaseModel) -> Iterator[tuple[tuple[str, str], str]]:
    """Every path setting of ``config`` that cannot work on this machine, in the order
    :func:`filesystem_problem` looks at them."""
    task = getattr(config, "task", None)
    data_path = getattr(task, "data_path", None)
    problem = missing_data_path(data_path) if data_path is not None else None
    if problem:
        yield ("task", "data_path"), problem
    for section_name in type(config).model_fields:
        section = getattr(config, section_name)
        for key, field in type(section).model_fields.items():
            path = getattr(section, key)
            if path is not None and any(isinstance(mark, Directory) for mark in field.metadata):
                problem = unusable_directory(path)
                if problem:
                    yield (section_name, key), problem
