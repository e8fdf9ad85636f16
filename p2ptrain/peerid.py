"""libp2p peer IDs as users type them: a cheap shape check, stdlib only.

The CLI and the manifest check peer IDs without loading hivemind; the DHT authorizer derives a
peer's ID from its public key with hivemind's own encoding (see :mod:`p2ptrain.dhtauth`).
"""

from __future__ import annotations

import re

from p2ptrain.errors import ConfigError

#: base58btc of a multihash: "Qm..." (sha2-256 of an RSA key, what hivemind 1.1.12 generates) or
#: "12D3KooW..." / "1..." (identity multihash of an Ed25519 key).
_PEER_ID_RE = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,64}")


def is_peer_id(text: object) -> bool:
    return isinstance(text, str) and _PEER_ID_RE.fullmatch(text) is not None


def check_peer_id(text: str, what: str = "peer ID") -> str:
    """Return ``text`` when it looks like a peer ID, else one :class:`ConfigError` line."""
    if not is_peer_id(text):
        shown = text if isinstance(text, str) and text.isprintable() and len(text) <= 80 else repr(text)[:80]
        raise ConfigError(f"{what} {shown!r}: not a libp2p peer ID (base58, like Qm... or 12D3KooW...; "
                          "a node prints its own with: p2ptrain run peer-id --config node.toml)")
    return text
