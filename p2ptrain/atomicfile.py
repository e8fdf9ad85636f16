"""Files that hold either their old content or the whole new one, even across a crash.

Write to a temporary file in the same directory, fsync it, rename it over the target, then fsync
the directory so the rename itself is durable.  Standard library only.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by name (a directory: the entries renamed into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``); raises OSError, leaving ``path`` as it was."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_path(directory)
