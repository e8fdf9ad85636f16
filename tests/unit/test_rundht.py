"""The run's DHT entries without a DHT: picking the newest valid manifest, reading members, and the
validator that keeps unsigned entries out of honest nodes' storage and caps the versions they hold."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.dhtkeys import fingerprint_key, manifest_key, members_key
from p2ptrain.run.invite import issue_invite
from p2ptrain.run.manifest import MAX_MANIFEST_BYTES, new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.swarm.run_entries import (
    MAX_ENTRIES,
    MAX_VERSIONS_HELD,
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
        manifest_subkey(v1): _raw(v1),
        manifest_subkey(v2): _raw(v2),
        "9:" + "0" * 16: _raw(forged.signed(forger)),
        "9:" + "1" * 16: _raw(v2).replace(b"version = 2", b"version = 9"),
        "8:" + "2" * 16: _raw(v1),  # a valid manifest under another version's subkey
        "junk": "not bytes",
        7: b"\x00" * (MAX_MANIFEST_BYTES + 1),
    }
    found = newest_manifest(_found(entries), v1.ref)
    assert found.manifest == v2 and found.valid == 1 and found.invalid == 5 and found.problem
    assert newest_manifest(None, v1.ref) == newest_manifest(SimpleNamespace(value=b"x"), v1.ref)
    assert newest_manifest(None, v1.ref).manifest is None


@pytest.mark.parametrize("newest_first", [False, True])
def test_the_highest_version_wins_behind_any_number_of_older_entries(owner, newest_first):
    """More than a reader once looked at (1,024) copies of version 1 came before version 2 and hid it."""
    _, v1, v2 = owner
    flood = {f"1:{i:016x}": _raw(v1) for i in range(MAX_ENTRIES + 1)}
    newest = {manifest_subkey(v2): _raw(v2)}
    found = newest_manifest(_found({**newest, **flood} if newest_first else {**flood, **newest}), v1.ref)
    assert found.manifest == v2 and found.invalid == 0


def test_a_flood_of_junk_finds_nothing_and_is_counted(owner):
    _, v1, _ = owner
    entries = {f"junk{i}": b"x" for i in range(MAX_ENTRIES + 10)} | {f"{i + 1}:{i:016x}": b"x" for i in range(10)}
    found = newest_manifest(_found(entries), v1.ref)
    assert found.manifest is None and found.invalid == MAX_ENTRIES + 20


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


def _record(key: str, subkey, value, expiration: float = NOW + 60) -> DHTRecord:
    return DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                     MSGPackSerializer.dumps(value), expiration)


def test_validator_keeps_only_owner_signed_entries_of_the_run(owner):
    key, v1, v2 = owner
    ref = v1.ref
    validator = RunEntryValidator(ref)
    mkey, members = manifest_key(ref.run_id), members_key(ref.run_id)
    assert validator.validate(_record(mkey, manifest_subkey(v2), _raw(v2)))
    assert validator.validate(_record(mkey, manifest_subkey(v2), _raw(v2)))  # cached verdict
    assert not validator.validate(_record(mkey, "2:0000000000000000", _raw(v2)))  # subkey not of its content
    tampered = _raw(v2).replace(b"lr = 0.001", b"lr = 0.1")
    assert not validator.validate(_record(mkey, manifest_subkey(v2), tampered))
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


def _options_manifest(key: OwnerKey, version: int, **training):
    task = TaskSection(options={name: index for index, name in enumerate("gfedcba")})
    return dataclasses.replace(new_manifest(key, "opts-run", task, TrainingSection(**training)),
                               version=version).signed(key)


def test_validator_refuses_a_copy_with_reordered_option_keys(owner):
    key = owner[0]
    v1 = _options_manifest(key, 1)
    raw = _raw(v1)
    line = next(line for line in raw.split(b"\n") if line.startswith(b"options = "))
    reordered = raw.replace(line, b"options = { g = 0, f = 1, e = 2, d = 3, c = 4, b = 5, a = 6 }")
    assert reordered != raw
    validator = RunEntryValidator(v1.ref)
    mkey = manifest_key(v1.ref.run_id)
    assert validator.validate(_record(mkey, manifest_subkey(v1), raw))
    assert not validator.validate(_record(mkey, manifest_subkey(v1), reordered))
    assert validator.counter.by_reason()["signature"] == 1


class _Node:
    """A DHT node's storage as hivemind keeps it: validate each record, store it, then run what was
    scheduled (hivemind's event loop runs the validator's pruning right after the store)."""

    def __init__(self, validator: RunEntryValidator) -> None:
        self.validator, self.storage, self.scheduled = validator, DHTLocalStorage(), []
        validator.attach(self.storage, later=self.scheduled.append)

    def store(self, *manifests, subkeys=None) -> list[bool]:
        key = manifest_key(manifests[0].ref.run_id)
        subkeys = subkeys or [manifest_subkey(m) for m in manifests]
        expiration = get_dht_time() + 600
        records = [_record(key, subkey, _raw(m), expiration) for subkey, m in zip(subkeys, manifests, strict=True)]
        verdicts = [self.validator.validate(record) for record in records]  # a dictionary: all, then store
        for record, subkey, ok in zip(records, subkeys, verdicts, strict=True):
            if ok:
                self.storage.store(DHTID.from_bytes(record.key), record.value, expiration, subkey=subkey)
        while self.scheduled:
            self.scheduled.pop(0)()
        return verdicts

    def versions(self, ref) -> list[int]:
        item = self.storage.get(DHTID.generate(source=manifest_key(ref.run_id)))
        return sorted(int(subkey.split(":")[0]) for subkey, _ in item.value.items())


def test_each_node_holds_one_entry_per_version_and_only_the_newest_versions(owner):
    key = owner[0]
    versions = [_options_manifest(key, v, seed=v) for v in range(1, 10)]
    node = _Node(RunEntryValidator(versions[0].ref))
    ref = versions[0].ref
    # An attacker replays every version the owner ever signed, oldest first: each one makes room.
    assert all(node.store(m) == [True] for m in versions[:6])
    assert node.versions(ref) == [3, 4, 5, 6] and MAX_VERSIONS_HELD == 4
    # Older ones no longer fit; what is held refreshes.
    assert node.store(versions[0]) == [False] and node.store(versions[1]) == [False]
    assert node.store(versions[5]) == [True] and node.store(versions[2]) == [True]
    # A second entry of a version held (its owner signed two version 6) is refused.
    fork = _options_manifest(key, 6, seed=60)
    assert node.store(fork) == [False]
    # A whole dictionary stored at once is cut back once it is stored.
    assert node.store(*versions[6:]) == [True, True, True]
    assert node.versions(ref) == [6, 7, 8, 9]
    assert node.validator.counter.by_reason()["over_cap"] == 3
    # A lookup-only node (nothing attached) judges signatures alone.
    first = _record(manifest_key(ref.run_id), manifest_subkey(versions[0]), _raw(versions[0]))
    assert RunEntryValidator(ref).validate(first)
