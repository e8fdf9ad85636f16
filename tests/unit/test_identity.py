"""Record keys bound to libp2p identities: only the holder of a peer ID's key can sign for it."""

from __future__ import annotations

import base58
import pytest
from hivemind.p2p import PeerID

from p2ptrain.errors import ConfigError
from p2ptrain.swarm.identity import IdentityError, IdentityKey, peer_id_of, verify_for_peer


@pytest.fixture(scope="module")
def ids():
    return IdentityKey.generate(), IdentityKey.generate()


def test_identity_round_trips_through_the_p2pd_key_file(tmp_path, ids):
    alice, _ = ids
    path = tmp_path / "identity.key"
    alice.write(path)
    again = IdentityKey.from_file(path)
    assert again.peer_id == alice.peer_id
    assert again.peer_id == PeerID.from_identity(path.read_bytes()).to_base58()  # hivemind's own derivation


def test_signatures_verify_only_for_the_right_peer(ids):
    alice, bob = ids
    signature = alice.sign(b"binding")
    assert verify_for_peer(alice.peer_id, alice.public_key, b"binding", signature) == ""
    assert verify_for_peer(alice.peer_id, alice.public_key, b"other", signature) == "identity signature does not verify"
    # Bob's key cannot speak for Alice, nor Alice's key for Bob's ID.
    assert "does not hash to the claimed peer ID" in verify_for_peer(alice.peer_id, bob.public_key, b"binding",
                                                                     bob.sign(b"binding"))
    assert "does not hash" in verify_for_peer(bob.peer_id, alice.public_key, b"binding", signature)
    assert verify_for_peer("0OIl", alice.public_key, b"binding", signature) == "peer ID is not base58"
    assert "missing or oversized" in verify_for_peer(alice.peer_id, b"", b"binding", signature)
    assert "missing or oversized" in verify_for_peer(alice.peer_id, b"x" * 5000, b"binding", signature)


def test_inline_keys_hash_to_identity_multihash():
    assert peer_id_of(b"k" * 10) == b"\x00\x0a" + b"k" * 10
    assert peer_id_of(b"k" * 43)[:2] == b"\x12\x20"
    inline_id = base58.b58encode(peer_id_of(b"k" * 10)).decode()
    assert verify_for_peer(inline_id, b"k" * 10, b"d", b"s") == "identity key is not a libp2p public key"


def test_unreadable_identity_files_are_one_line_config_errors(tmp_path):
    with pytest.raises(IdentityError, match=r"^identity .*missing\.key: no such file$"):
        IdentityKey.from_file(tmp_path / "missing.key")
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"\x08\x00\x12\x03abc")
    with pytest.raises(ConfigError, match=r"^identity .*garbage\.key: not a libp2p RSA identity \(\w+\)$"):
        IdentityKey.from_file(garbage)
    (tmp_path / "bad.key").write_bytes(b"\x00garbage")
    with pytest.raises(IdentityError, match="not a libp2p RSA identity"):
        IdentityKey.from_file(tmp_path / "bad.key")


def test_the_one_loader_gives_hivemind_s_authorizers_the_same_key(tmp_path, ids):
    from p2ptrain.swarm.dhtauth import peer_id_of_public_key

    alice, _ = ids
    alice.write(tmp_path / "identity.key")
    key = IdentityKey.from_file(tmp_path / "identity.key").hivemind_key()
    assert peer_id_of_public_key(key.get_public_key().to_bytes()) == alice.peer_id
    assert key.get_public_key().verify(b"data", key.sign(b"data"))
