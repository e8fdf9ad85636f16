"""The API's bearer token: created once per state directory (mode 0600), compared in constant time."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

TOKEN_FILE = "api.token"
_MIN_TOKEN_LEN = 16


def load_or_create_token(state_dir: Path) -> str:
    """Return the token in ``<state_dir>/api.token``, creating it (0600) on first use.

    A missing, empty or too short file gets a fresh token; an existing file readable by others
    is tightened to 0600 because anyone who reads it can pause or stop the node.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / TOKEN_FILE
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    if len(token) >= _MIN_TOKEN_LEN:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return token
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.tmp")
    # O_EXCL + 0600 at creation: the token is never readable by others, not even for an instant.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return token


def token_matches(expected: str, authorization_header: str | None) -> bool:
    """True iff the header is ``Bearer <expected>``; constant-time in the token's content."""
    if not expected or not authorization_header:
        return False
    scheme, _, presented = authorization_header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8"), expected.encode("utf-8"))
