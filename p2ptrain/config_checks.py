"""Checks on config values that types alone cannot express: host syntax and the local filesystem.

The host check is pure and runs as a field validator.  The path checks look at the filesystem,
so they run when a config is loaded (``p2ptrain config check``, ``p2ptrain run``, a reload), not
whenever a section object is built: a config is judged on the machine that will use it, before
the node joins anything, instead of failing minutes later after it joined the swarm.
"""

from __future__ import annotations

import ipaddress
import re
import stat
from pathlib import Path

_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
#: What can only have been meant as an IPv4 address (a host name never consists of digits only).
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
_URL_SCHEMES = ("http://", "https://")
_GLOB_CHARACTERS = frozenset("*?[")


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
    return not text.lower().startswith(_URL_SCHEMES) and not _GLOB_CHARACTERS & set(text)


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
        return f"cannot expand {str(path)!r}: no such user or no home directory"


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
        return f"{resolved} does not exist"
    if kind == "other":
        return f"{resolved} is neither a file nor a directory"
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
            where = "" if candidate == resolved else f" (its parent {candidate} is not a directory)"
            return f"{resolved} is not a directory{where}"
    return None
