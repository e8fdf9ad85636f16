"""Run references: ``NAME@<hash of the owner's public key>``, and the names a run derives from one.

A run is identified by its name *and* its owner: the reference carries 128 bits of a hash of the
owner's Ed25519 public key, so a manifest is accepted for a reference only when its key hashes to
it (finding another key with the same 128-bit hash is a second-preimage search, out of reach).
Everything the run keeps in the DHT is named after :attr:`RunRef.run_id` (:mod:`p2ptrain.dhtkeys`),
which contains that hash too, so two owners who pick the same NAME never share keys.

Stdlib only: the CLI validates ``--run`` without loading cryptography, pydantic or hivemind.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

from p2ptrain.errors import ConfigError

#: Characters of lowercase base32 (26 = 128 bits, the last character padded with zero bits).
KEY_HASH_CHARS = 26
_KEY_HASH_BYTES = 16
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
_REF_RE = re.compile(rf"({NAME_PATTERN})@([a-z2-7]{{{KEY_HASH_CHARS}}})")
#: Domain separation: this hash is never confused with another use of the same key bytes.
_HASH_DOMAIN = b"p2ptrain-owner-key\x00"


class RunRefError(ConfigError):
    """A run reference that cannot be parsed; the message is the one line to show."""


def key_hash(public_key: bytes) -> str:
    """The reference's hash part for a raw 32-byte Ed25519 public key."""
    digest = hashlib.sha256(_HASH_DOMAIN + public_key).digest()[:_KEY_HASH_BYTES]
    return base64.b32encode(digest).decode("ascii").rstrip("=").lower()


def check_name(name: str) -> str:
    """A run NAME: 1-32 letters, digits, '_' and '-', starting with a letter or digit."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise RunRefError(f"run name {name!r}: must be 1-32 characters of letters, digits, '_' and '-', "
                          "starting with a letter or digit")
    return name


@dataclass(frozen=True)
class RunRef:
    """A run's name bound to its owner's key."""

    name: str
    key_hash: str

    @classmethod
    def for_key(cls, name: str, public_key: bytes) -> RunRef:
        return cls(check_name(name), key_hash(public_key))

    @classmethod
    def parse(cls, text: str) -> RunRef:
        """Parse ``NAME@hash``; anything else is one :class:`RunRefError` line."""
        match = _REF_RE.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            shown = text if isinstance(text, str) and text.isprintable() and len(text) <= 120 else repr(text)[:120]
            raise RunRefError(f"not a run reference: {shown!r}; expected NAME@<{KEY_HASH_CHARS} characters a-z2-7>, "
                              "as printed by p2ptrain run init")
        name, digest = match.groups()
        # base32's last character carries 3 padding bits: only the canonical spelling is accepted,
        # so one run has exactly one reference.
        if key_hash_canonical(digest) != digest:
            raise RunRefError(f"not a run reference: {text!r}; its hash part is not canonical base32")
        return cls(name, digest)

    def matches(self, public_key: bytes) -> bool:
        """Whether ``public_key`` is the key this reference names (constant-time compare)."""
        return hmac.compare_digest(key_hash(public_key), self.key_hash)

    @property
    def run_id(self) -> str:
        """``swarm.run_id`` of this run: a valid hivemind key prefix (no '.' or '@')."""
        return f"{self.name}-{self.key_hash}"

    def __str__(self) -> str:
        return f"{self.name}@{self.key_hash}"


def key_hash_canonical(digest: str) -> str:
    """Re-encode a base32 hash part; differs from the input when its padding bits are not zero."""
    raw = base64.b32decode(digest.upper() + "=" * (-len(digest) % 8))
    return base64.b32encode(raw[:_KEY_HASH_BYTES]).decode("ascii").rstrip("=").lower()
