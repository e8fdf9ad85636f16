"""The node's libp2p identity: where it lives, how it is created and read, and the check that a key
really belongs to a peer ID.

The identity file (``<state_dir>/identity.key``, which hivemind's p2p daemon reads with ``-id``) is
created by :func:`ensure_identity` and read only by :meth:`IdentityKey.from_file`: peer records sign
with it, an invite run's DHT gate signs with it (:meth:`IdentityKey.hivemind_key`), and ``p2ptrain
run peer-id`` prints its peer ID.

A libp2p peer ID is the multihash of the peer's serialised public key (SHA-256 for RSA keys, the key
itself for keys of at most 42 bytes), so anyone holding the public key can check the ID, and only
the holder of the private key (the p2p daemon's ``identity.key``, which hivemind writes as an RSA key)
can sign for it.  Peer records use this to bind their signing key to the peer ID they claim.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.errors import ConfigError, printable
from p2ptrain.peerid import base58, is_base58

_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
#: Serialised public keys up to this size are inlined into the peer ID ("identity" multihash).
_MAX_INLINE_KEY_BYTES = 42
#: Accepted serialised public key sizes: enough for RSA-4096, small enough to bound a record.
MAX_PUBLIC_KEY_BYTES = 800


def identity_path(state_dir: Path) -> Path:
    """Where the node's libp2p private key (and so its peer ID) lives."""
    return state_dir / "identity.key"


def ensure_identity(path: Path) -> None:
    """Create the node's libp2p identity now if it has none yet (hivemind's own format and mode)."""
    if not path.exists():
        from hivemind.p2p import P2P

        P2P.generate_identity(str(path))


def peer_id_of_identity(path: Path) -> str:
    """The peer ID of the identity file at ``path`` (:class:`IdentityError` if it cannot be read)."""
    return IdentityKey.from_file(path).peer_id


class IdentityError(ConfigError):
    """The identity file is missing or is not an RSA libp2p key; the message is the one line to show."""


def peer_id_of(public_key: bytes) -> bytes:
    """The raw peer ID (a multihash) of a protobuf-serialised libp2p public key: the one place it is
    computed (its text is :func:`p2ptrain.peerid.base58` of it)."""
    if len(public_key) <= _MAX_INLINE_KEY_BYTES:
        return b"\x00" + bytes([len(public_key)]) + public_key
    return b"\x12\x20" + hashlib.sha256(public_key).digest()


class IdentityKey:
    """An RSA libp2p identity: signs with the key the node's peer ID is derived from."""

    def __init__(self, private_key: rsa.RSAPrivateKey) -> None:
        self._key = private_key
        der = private_key.public_key().public_bytes(serialization.Encoding.DER,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
        #: The serialised libp2p public key (what peer IDs are computed from).
        self.public_key = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
        self.peer_id = base58(peer_id_of(self.public_key))

    @classmethod
    def generate(cls) -> IdentityKey:
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @classmethod
    def from_file(cls, path: Path | str) -> IdentityKey:
        """Read an identity file as hivemind/p2pd write it; :class:`IdentityError` if it is missing or not
        an RSA libp2p key."""
        shown = printable(path)
        try:
            message = crypto_pb2.PrivateKey.FromString(Path(path).read_bytes())
            key = serialization.load_der_private_key(message.data, password=None)
        except FileNotFoundError:
            raise IdentityError(f"identity {shown}: no such file") from None
        except OSError as exc:
            raise IdentityError(f"identity {shown}: cannot be read ({exc.strerror or exc})") from None
        except Exception as exc:  # protobuf's DecodeError, DER garbage
            raise IdentityError(f"identity {shown}: not a libp2p RSA identity ({type(exc).__name__})") from None
        if message.key_type != crypto_pb2.RSA or not isinstance(key, rsa.RSAPrivateKey):
            raise IdentityError(f"identity {shown}: not a libp2p RSA identity (not an RSA key)")
        return cls(key)

    def hivemind_key(self) -> RSAPrivateKey:
        """The same key as hivemind's authorizers take it (an invite run's DHT gate signs with it)."""
        key = RSAPrivateKey.__new__(RSAPrivateKey)  # its __init__ would generate a fresh key
        key._private_key = self._key
        return key

    def write(self, path: Path | str) -> None:
        """Write the key the way p2pd reads ``-id`` (tests and tools; nodes let hivemind create it)."""
        der = self._key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption())
        Path(path).write_bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=der).SerializeToString())

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data, _PSS, hashes.SHA256())


def verify_for_peer(peer_id: str, public_key: bytes, data: bytes, signature: bytes) -> str:
    """Why ``signature`` over ``data`` is not a valid signature by ``peer_id``'s identity ("" if it is)."""
    if not isinstance(public_key, bytes) or not 0 < len(public_key) <= MAX_PUBLIC_KEY_BYTES:
        return "identity key missing or oversized"
    if not is_base58(peer_id):
        return "peer ID is not base58"
    if base58(peer_id_of(public_key)) != peer_id:
        return "identity key does not hash to the claimed peer ID"
    try:
        message = crypto_pb2.PublicKey.FromString(public_key)
        key = serialization.load_der_public_key(message.data)
    except Exception:  # protobuf or DER garbage
        return "identity key is not a libp2p public key"
    if message.key_type != crypto_pb2.RSA or not isinstance(key, rsa.RSAPublicKey):
        return "identity key is not an RSA key"
    try:
        key.verify(signature, data, _PSS, hashes.SHA256())
    except (InvalidSignature, ValueError, TypeError):
        return "identity signature does not verify"
    return ""
