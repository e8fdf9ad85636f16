"""The run owner's Ed25519 key: create it, keep it private on disk, load it, sign and verify with it.

The private key never leaves the owner's machine: it signs manifests and invites there, and only
its public half travels (inside every manifest and invite). The key file is PEM (PKCS#8), created
with mode 0600 and refused when other users could read it, the way ssh treats its keys.
"""

from __future__ import annotations

import base64
import os
import re
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from p2ptrain.errors import ConfigError
from p2ptrain.runref import RunRef

PUBLIC_KEY_PREFIX = "ed25519:"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
#: A PEM Ed25519 key is ~120 bytes; anything much larger is not one.
_MAX_KEY_FILE_BYTES = 4096


class OwnerKeyError(ConfigError):
    """The owner key file is missing, unsafe or not a key; the message is the one line to show."""


class OwnerKey:
    """An Ed25519 private key held by the run owner."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @classmethod
    def generate(cls) -> OwnerKey:
        return cls(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def ref(self, name: str) -> RunRef:
        return RunRef.for_key(name, self.public_key)

    def save(self, path: Path) -> None:
        """Write the key to a new file with mode 0600; never overwrites an existing key."""
        pem = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise OwnerKeyError(f"owner key {path}: already exists; refusing to overwrite a run's key") from None
        except OSError as exc:
            raise OwnerKeyError(f"owner key {path}: cannot create ({exc.strerror})") from None
        try:
            os.fchmod(fd, 0o600)  # the umask may have taken bits away, never added: make it exact
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)

    @classmethod
    def load(cls, path: Path) -> OwnerKey:
        """Read a key written by :meth:`save`; refuse one that other users can read or write."""
        try:
            info = path.stat()
        except FileNotFoundError:
            raise OwnerKeyError(f"owner key {path}: no such file (p2ptrain run init creates it; "
                                "pass --key if it lives elsewhere)") from None
        except OSError as exc:
            raise OwnerKeyError(f"owner key {path}: cannot read ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            raise OwnerKeyError(f"owner key {path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise OwnerKeyError(f"owner key {path}: mode {mode:04o} lets other users read it; "
                                f"run: chmod 600 {path}")
        if info.st_size > _MAX_KEY_FILE_BYTES:
            raise OwnerKeyError(f"owner key {path}: {info.st_size} bytes is not an Ed25519 key file")
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError, OSError):
            raise OwnerKeyError(f"owner key {path}: not an unencrypted PEM private key") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise OwnerKeyError(f"owner key {path}: not an Ed25519 key")
        return cls(key)


def verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s signature over ``data``; False for malformed input."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def encode_public_key(public_key: bytes) -> str:
    return PUBLIC_KEY_PREFIX + base64.b64encode(public_key).decode("ascii")


def decode_public_key(text: object) -> bytes:
    """Parse ``ed25519:<base64>``; raises ValueError naming the problem."""
    if not isinstance(text, str) or not text.startswith(PUBLIC_KEY_PREFIX):
        raise ValueError(f"must start with {PUBLIC_KEY_PREFIX!r}")
    raw = decode_b64(text[len(PUBLIC_KEY_PREFIX):], "public key")
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(raw)}")
    return raw


def decode_b64(text: str, what: str, *, urlsafe: bool = False) -> bytes:
    """Strict base64 (padding included for the standard alphabet); ValueError names ``what``."""
    try:
        if urlsafe:
            if not re.fullmatch(r"[A-Za-z0-9_-]*", text):
                raise ValueError
            return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise ValueError(f"{what} is not valid base64") from None
