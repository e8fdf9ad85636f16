"""The run's DHT entries without a DHT: picking the newest valid manifest, reading members, and the
validator that keeps unsigned entries out of honest nodes' storage."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.dhtkeys import fingerprint_key, manifest_key, members_key
from p2ptrain.run.invite import issue_invite
from p2ptrain.run.manifest import MAX_MANIFEST_BYTES, new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.swarm.run_entries import (
    MAX_ENTRIES,
    RunEntryValidator,
    admitted_members,
    manifest_subkey,
    newest_manifest,
)

A, B, C = ("QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF", "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3",
           "Qmb4VdreyqThHr97gkPTcBQ6Sv7KRL7XRhM3acdKjeGwNk")
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def owner():
    key = OwnerKey.generate()
    v1 = new_manifest(key, "dht-run", TaskSection(), TrainingSection())
    v2 = dataclasses.replace(v1, version=2, banned=(B,)).signed(key)
    return key, v1, v2


def _found(entries: dict) -> SimpleNamespace:
    return SimpleNamespace(value={k: SimpleNamespace(value=v, expiration_time=NOW + 60) for k, v in entries.items()})


def _raw(manifest) -> bytes:
    return manifest.to_toml().encode()


def test_newest_valid_manifest_wins_and_bad_entries_are_counted(owner):
    key, v1, v2 = owner
    forger = OwnerKey.generate()
    forged = dataclasses.replace(new_manifest(forger, "dht-run", TaskSection(), TrainingSection()), version=9)
    entries = {
        manifest_subkey(_raw(v1), 1): _raw(v1),
        manifest_subkey(_raw(v2), 2): _raw(v2),
        "9:forged": _raw(forged.signed(forger)),
        "9:tampered": _raw(v2).replace(b"version = 2", b"version = 9"),
        "junk": "not bytes",
        7: b"\x00" * (MAX_MANIFEST_BYTES + 1),
    }
    found = newest_manifest(_found(entries), v1.ref)
    assert found.manifest == v2 and found.valid == 2 and found.invalid == 4 and found.problem
    assert newest_manifest(None, v1.ref) == newest_manifest(SimpleNamespace(value=b"x"), v1.ref)
    assert newest_manifest(None, v1.ref).manifest is None


def test_a_flood_of_entries_is_bounded(owner):
    _, v1, _ = owner
    entries = {f"junk{i}": b"x" for i in range(MAX_ENTRIES + 10)}
    found = newest_manifest(_found(entries), v1.ref)
    assert found.manifest is None and found.invalid == MAX_ENTRIES + 10


def test_members_are_peers_with_a_valid_unexpired_unrevoked_invite(owner):
    key, v1, _ = owner
    ref = v1.ref
    other = OwnerKey.generate()
    entries = {
        A: issue_invite(key, ref, A, 30, now=NOW),
        B: issue_invite(key, ref, B, 1, now=NOW - 2 * 86400),  # expired: normal, not counted
        "QmWrongSubkeyxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx": issue_invite(key, ref, A, 30, now=NOW),
        C: issue_invite(other, other.ref("dht-run"), C, 30, now=NOW),
        b"bytes": "x",
    }
    admitted, invalid = admitted_members(_found(entries), ref, now=NOW)
    assert admitted == {A} and invalid == 3
    admitted, _ = admitted_members(_found(entries), ref, now=NOW, excluded={A})
    assert admitted == set()


def _record(key: str, subkey, value) -> DHTRecord:
    return DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                     MSGPackSerializer.dumps(value), NOW + 60)


def test_validator_keeps_only_owner_signed_entries_of_the_run(owner):
    key, v1, v2 = owner
    ref = v1.ref
    validator = RunEntryValidator(ref)
    mkey, members = manifest_key(ref.run_id), members_key(ref.run_id)
    assert validator.validate(_record(mkey, manifest_subkey(_raw(v2), 2), _raw(v2)))
    assert validator.validate(_record(mkey, manifest_subkey(_raw(v2), 2), _raw(v2)))  # cached verdict
    assert not validator.validate(_record(mkey, "2:0000000000000000", _raw(v2)))  # subkey not of its content
    tampered = _raw(v2).replace(b"lr = 0.001", b"lr = 0.1")
    assert not validator.validate(_record(mkey, manifest_subkey(tampered, 2), tampered))
    assert not validator.validate(_record(mkey, "x", "text"))
    assert not validator.validate(_record(mkey, "x", b"y" * (MAX_MANIFEST_BYTES + 100)))
    expired_but_signed = issue_invite(key, ref, A, 1, now=NOW - 10 * 86400)
    assert validator.validate(_record(members, A, expired_but_signed))  # time is checked by readers only
    assert not validator.validate(_record(members, B, expired_but_signed))
    assert not validator.validate(_record(members, A, "p2ptrain-invite-v1.garbage"))
    assert validator.validate(_record("another_key", "anything", b"anything"))
    assert validator.counter.total == 6
    # owned: never unsigned
    assert not validator.validate(_record(fingerprint_key(ref.run_id), "ffffffffffffffff", 1.7e9))
    assert validator.fingerprint_counter.total == 1 and validator.counter.total == 6
