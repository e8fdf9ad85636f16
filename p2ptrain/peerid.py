"""libp2p peer IDs as users type them: a cheap shape check and the base58 text form, stdlib only.

The CLI, the manifest and the peer gate handle peer IDs without loading hivemind.
"""

from __future__ import annotations

import re

from p2ptrain.errors import ConfigError

#: base58btc of a multihash: "Qm..." (sha2-256 of an RSA key, what hivemind 1.1.12 generates) or
#: "12D3KooW..." / "1..." (identity multihash of an Ed25519 key).
_BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_PEER_ID_RE = re.compile(f"[{_BASE58_ALPHABET}]{{32,64}}")


def base58(raw: bytes) -> str:
    """The base58btc text of a peer ID's bytes (its multihash), as libp2p and hivemind print it."""
    number = int.from_bytes(raw, "big")
    digits = []
    while number:
        number, rest = divmod(number, 58)
        digits.append(_BASE58_ALPHABET[rest])
    leading_zeros = len(raw) - len(raw.lstrip(b"\0"))
    return "1" * leading_zeros + "".join(reversed(digits))


def is_base58(text: object) -> bool:
    """Whether ``text`` is base58btc text (any length), as every peer ID's is."""
    return isinstance(text, str) and bool(text) and all(c in _BASE58_ALPHABET for c in text)


def is_peer_id(text: object) -> bool:
    return isinstance(text, str) and _PEER_ID_RE.fullmatch(text) is not None


def check_peer_id(text: str, what: str = "peer ID") -> str:
    """Return ``text`` when it looks like a peer ID, else one :class:`ConfigError` line."""
    if not is_peer_id(text):
        shown = text if isinstance(text, str) and text.isprintable() and len(text) <= 80 else repr(text)[:80]
        raise ConfigError(f"{what} {shown!r}: not a libp2p peer ID (base58, like Qm... or 12D3KooW...; "
                          "a node prints its own with: p2ptrain run peer-id --config node.toml)")
    return text
