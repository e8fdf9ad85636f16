"""An owned run's entries in the DHT: its signed manifest and its members' invites.

``<run_id>_manifest`` (the keys: :mod:`p2ptrain.dhtkeys`) holds manifests, one subkey per version
and content (``"<version>:<sha256 prefix>"``, so a stranger's entry can never displace an honest
one). Every node that holds a verified manifest re-publishes it, so the run outlives its owner's
machine. ``<run_id>_members`` holds each admitted peer's invite token under its peer ID (invite
runs), which is how every node learns who is admitted.

An owned run keeps its model fingerprint in the manifest, so ``<run_id>_model_fingerprint``, where
plain runs claim theirs unsigned, holds nothing honest: every entry there is refused and counted.

Entries are checked twice: :func:`run_validators` make honest DHT nodes refuse to store or return
anything that is not owner-signed for this run (only checks that do not depend on the time, so a
stored entry never turns invalid while it is held), and readers verify again, with the time,
and pick the newest. A bad entry is counted and skipped; nothing here raises on swarm input.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from p2ptrain.dhtkeys import fingerprint_key, manifest_key, members_key
from p2ptrain.errors import ConfigError
from p2ptrain.run.invite import MAX_TOKEN_CHARS, parse_invite, verify_invite
from p2ptrain.run.manifest import MAX_MANIFEST_BYTES, Manifest, load_manifest_bytes
from p2ptrain.runref import RunRef
from p2ptrain.swarm.records import RejectCounter

logger = logging.getLogger(__name__)

MANIFEST_TTL = 1800.0
MEMBER_TTL = 600.0
#: Entries of one key a reader looks at; more is a flood, counted as invalid.
MAX_ENTRIES = 1024
_CACHE = 512


def manifest_subkey(raw: bytes, version: int) -> str:
    return f"{version}:{hashlib.sha256(raw).hexdigest()[:16]}"


def publish_manifest(dht: Any, manifest: Manifest, *, ttl: float = MANIFEST_TTL) -> Any:
    """Store (or refresh) a verified manifest under the run's key; returns the DHT's future."""
    raw = manifest.to_toml().encode("utf-8")
    return dht.store(manifest_key(manifest.ref.run_id), raw, expiration_time=get_dht_time() + ttl,
                     subkey=manifest_subkey(raw, manifest.version), return_future=True)


#: Excluded peers a node hands the excluding manifest to, per manifest version it takes up.
MAX_TOLD = 64


async def _store_on(peer_ids: list[str], key: str, raw: bytes, subkey: str, expiration: float, _dht: Any,
                    node: Any) -> int:
    from hivemind.p2p import PeerID

    value = node.protocol.serializer.dumps(raw)
    told = 0
    for peer in peer_ids:
        try:
            # The reply is the excluded peer's, which our authorizer refuses; what matters is that
            # its DHT checked the owner's signature and stored the manifest.
            await node.protocol.call_store(PeerID.from_base58(peer), [DHTID.generate(source=key)], [value],
                                           expiration, subkeys=[subkey])
            told += 1
        except Exception as exc:  # gone, unreachable: it will learn from another node, or never needs to
            logger.debug("could not hand manifest version to excluded peer %s: %r", peer, exc)
    return told


def tell_excluded(dht: Any, manifest: Manifest, peer_ids: Iterable[str], *, ttl: float = MANIFEST_TTL) -> Any:
    """Store ``manifest`` directly on each excluded peer (at most :data:`MAX_TOLD`); returns the future.

    An invite run's DHT refuses everything a banned or revoked peer asks, so without this it could
    never fetch the version that excludes it: it would train on alone, cut off. With the manifest
    in its own DHT storage its next poll finds it, and it stops with exit 78 and one line.
    """
    raw = manifest.to_toml().encode("utf-8")
    key = manifest_key(manifest.ref.run_id)
    return dht.run_coroutine(functools.partial(_store_on, sorted(peer_ids)[:MAX_TOLD], key, raw,
                                               manifest_subkey(raw, manifest.version), get_dht_time() + ttl),
                             return_future=True)


def publish_membership(dht: Any, ref: RunRef, token: str, *, ttl: float = MEMBER_TTL) -> Any:
    """Store this node's invite under its peer ID, never past the invite's expiry."""
    invite, _, _ = parse_invite(token)
    expiration = min(get_dht_time() + ttl, float(invite.expires_at))
    return dht.store(members_key(ref.run_id), token, expiration_time=expiration, subkey=invite.peer_id,
                     return_future=True)


@dataclass(frozen=True)
class Found:
    """What a lookup found: the newest valid manifest (if any) and how many entries were bad."""

    manifest: Manifest | None = None
    valid: int = 0
    invalid: int = 0
    problem: str = ""  # the first bad entry's problem, for one log line


def _entries(found: Any) -> list[tuple[Any, Any]]:
    value = getattr(found, "value", None)
    if not isinstance(value, dict):
        return []
    return [(subkey, getattr(item, "value", None)) for subkey, item in value.items()]


def newest_manifest(found: Any, ref: RunRef) -> Found:
    """Pick the newest manifest that verifies for ``ref`` from a ``dht.get`` result (pure)."""
    entries = _entries(found)
    invalid = max(0, len(entries) - MAX_ENTRIES)
    best: Manifest | None = None
    valid, problem = 0, ""
    for subkey, value in entries[:MAX_ENTRIES]:
        try:
            if not isinstance(value, bytes):
                raise ConfigError(f"entry {str(subkey)[:40]!r} is not a manifest")
            manifest = load_manifest_bytes(value, f"manifest entry {str(subkey)[:40]!r}", ref)
        except ConfigError as error:
            invalid += 1
            problem = problem or str(error)
            continue
        valid += 1
        if best is None or manifest.version > best.version:
            best = manifest
    return Found(best, valid, invalid, problem)


def fetch_manifest(dht: Any, ref: RunRef, *, timeout: float = 10.0) -> Found:
    """The newest valid manifest of ``ref`` in the DHT; a slow or failed lookup finds nothing."""
    future = dht.get(manifest_key(ref.run_id), latest=True, return_future=True)
    try:
        found = future.result(timeout=timeout)
    except Exception as exc:  # swarm weather, not an error of ours
        future.cancel()
        return Found(problem=f"manifest lookup failed ({type(exc).__name__})")
    result = newest_manifest(found, ref)
    if result.invalid:
        logger.info("ignored %d invalid manifest entr%s for run %s (first: %s)", result.invalid,
                    "y" if result.invalid == 1 else "ies", ref, result.problem)
    return result


def admitted_members(found: Any, ref: RunRef, *, now: float | None = None,
                     excluded: Iterable[str] = ()) -> tuple[set[str], int]:
    """Peer IDs with a valid, unexpired, unrevoked invite in a ``dht.get`` result of the members key,
    and how many entries were invalid (expired ones are not counted: they are normal)."""
    current = time.time() if now is None else now
    excluded = frozenset(excluded)
    admitted: set[str] = set()
    entries = _entries(found)
    invalid = max(0, len(entries) - MAX_ENTRIES)
    for subkey, token in entries[:MAX_ENTRIES]:
        if not isinstance(subkey, str) or not isinstance(token, str):
            invalid += 1
            continue
        try:
            verify_invite(token, ref=ref, peer_id=subkey, now=current, excluded=excluded)
        except ConfigError as error:
            invalid += "expired" not in str(error) and "revoked" not in str(error)
            continue
        admitted.add(subkey)
    return admitted, invalid


class RunEntryValidator(RecordValidatorBase):
    """Refuses, in the DHT itself, manifest and member entries that the run's owner did not sign."""

    def __init__(self, ref: RunRef, counter: RejectCounter | None = None,
                 fingerprint_counter: RejectCounter | None = None) -> None:
        self._ref = ref
        self._manifest_id = DHTID.generate(source=manifest_key(ref.run_id)).to_bytes()
        self._members_id = DHTID.generate(source=members_key(ref.run_id)).to_bytes()
        self._fingerprint_id = DHTID.generate(source=fingerprint_key(ref.run_id)).to_bytes()
        self.counter = counter if counter is not None else RejectCounter()
        #: Unsigned fingerprint entries refused (a stranger's claim of the run's model).
        self.fingerprint_counter = fingerprint_counter if fingerprint_counter is not None else RejectCounter()
        self._verdicts: collections.OrderedDict[bytes, bool] = collections.OrderedDict()

    def validate(self, record: DHTRecord) -> bool:
        if record.key == self._fingerprint_id:
            self.fingerprint_counter.reject("unbound", record.subkey, record.value[:64])
            return False
        if record.key not in (self._manifest_id, self._members_id):
            return True
        limit = MAX_MANIFEST_BYTES if record.key == self._manifest_id else MAX_TOKEN_CHARS
        if len(record.value) > limit + 16 or len(record.subkey) > 256:
            self.counter.reject("size", record.subkey, record.value[:64])
            return False
        cache_key = hashlib.blake2b(record.key + b"\0" + record.subkey + b"\0" + record.value,
                                    digest_size=16).digest()
        verdict = self._verdicts.get(cache_key)
        if verdict is None:
            verdict = self._check(record)
            self._verdicts[cache_key] = verdict
            if len(self._verdicts) > _CACHE:
                self._verdicts.popitem(last=False)
        if not verdict:
            self.counter.reject("signature", record.subkey, record.value)
        return verdict

    def _check(self, record: DHTRecord) -> bool:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            value = MSGPackSerializer.loads(record.value)
            if record.key == self._manifest_id:
                if not isinstance(value, bytes) or not isinstance(subkey, str):
                    return False
                manifest = load_manifest_bytes(value, "manifest entry", self._ref)
                return subkey == manifest_subkey(value, manifest.version)
            if not isinstance(value, str) or not isinstance(subkey, str):
                return False
            # Not the expiry: an entry valid when stored must not turn invalid while held, or every
            # lookup would drop the whole members dictionary it sits in.
            verify_invite(value, ref=self._ref, peer_id=subkey, now=0.0)
            return True
        except (ConfigError, ValueError, TypeError, OverflowError):
            return False
        except Exception:  # msgpack's own errors: a malformed entry, not our failure
            return False

    @property
    def priority(self) -> int:
        return 15  # after records' size check (20), before signature (10) and schema checks

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


def run_validators(ref: RunRef) -> list[RecordValidatorBase]:
    """Validators to add to ``hivemind.DHT(record_validators=...)`` for an owned run."""
    return [RunEntryValidator(ref)]
