"""An owned run's entries in the DHT: its signed manifest and its members' invites.

``<run_id>_manifest`` (the keys: :mod:`p2ptrain.dhtkeys`) holds manifests under
``"<version>:<sha256 prefix of the signed bytes>"``. A signed manifest has exactly one file form
(:mod:`p2ptrain.run.manifest`) and so exactly one entry: nobody but the owner can add one, and a
stranger's entry can never displace an honest one. Each
honest DHT node keeps one entry per version and the :data:`MAX_VERSIONS_HELD` newest versions
(:class:`RunEntryValidator`), so replaying every version the owner ever signed cannot make the key
too large to read, and readers take the highest version that verifies, whatever order the entries
come in. Every node that holds a verified manifest re-publishes it, so the run outlives its owner's
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

import asyncio
import collections
import functools
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from p2ptrain.dhtkeys import fingerprint_key, manifest_key, members_key
from p2ptrain.errors import ConfigError
from p2ptrain.run.invite import MAX_TOKEN_CHARS, parse_invite, verify_invite
from p2ptrain.run.manifest import MAX_MANIFEST_BYTES, MAX_VERSION, Manifest, load_manifest_bytes
from p2ptrain.runref import RunRef
from p2ptrain.swarm.records import RejectCounter

logger = logging.getLogger(__name__)

MANIFEST_TTL = 1800.0
MEMBER_TTL = 600.0
#: Entries of the members key a reader looks at; more is a flood, counted as invalid.
MAX_ENTRIES = 1024
#: Manifest versions each DHT node keeps for a run, the newest: readers need only the highest, and
#: the few below it cover nodes still publishing the previous one while a new version spreads.
MAX_VERSIONS_HELD = 4
_CACHE = 512
_SUBKEY = re.compile(r"([1-9][0-9]{0,9}):[0-9a-f]{16}")  # up to 10 digits: MAX_VERSION's


def manifest_subkey(manifest: Manifest) -> str:
    """A manifest's one subkey: its version and a hash of the bytes its owner signed."""
    return f"{manifest.version}:{hashlib.sha256(manifest.signing_bytes()).hexdigest()[:16]}"


def subkey_version(subkey: Any) -> int | None:
    """The version a manifest entry's subkey claims, or None when it is no manifest subkey."""
    if not isinstance(subkey, str):
        return None
    match = _SUBKEY.fullmatch(subkey)
    if match is None:
        return None
    version = int(match.group(1))
    return version if version <= MAX_VERSION else None


def publish_manifest(dht: Any, manifest: Manifest, *, ttl: float = MANIFEST_TTL) -> Any:
    """Store (or refresh) a verified manifest under the run's key; returns the DHT's future."""
    raw = manifest.to_toml().encode("utf-8")
    return dht.store(manifest_key(manifest.ref.run_id), raw, expiration_time=get_dht_time() + ttl,
                     subkey=manifest_subkey(manifest), return_future=True)


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
                                               manifest_subkey(manifest), get_dht_time() + ttl),
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
    valid: int = 0  # entries that verified: 1 when a manifest was found (the search stops there)
    invalid: int = 0  # entries that claimed a higher version, or no version at all, and did not verify
    problem: str = ""  # the first bad entry's problem, for one log line


def _entries(found: Any) -> list[tuple[Any, Any]]:
    value = getattr(found, "value", None)
    if not isinstance(value, dict):
        return []
    return [(subkey, getattr(item, "value", None)) for subkey, item in value.items()]


def newest_manifest(found: Any, ref: RunRef) -> Found:
    """The highest version that verifies for ``ref`` in a ``dht.get`` result (pure).

    Entries are tried from the highest version their subkeys claim down, and the first that verifies
    is the answer (a manifest sits only under its own version's subkey): however many older entries
    there are, and in whatever order they come, they hide nothing and cost nothing.
    """
    entries = _entries(found)
    claimed = sorted(((version, str(subkey), value) for subkey, value in entries
                      if (version := subkey_version(subkey)) is not None), key=lambda e: e[:2], reverse=True)
    invalid = len(entries) - len(claimed)
    problem = "an entry whose subkey is no manifest version" if invalid else ""
    for _, subkey, value in claimed:
        try:
            manifest = _entry_manifest(subkey, value, ref)
        except ConfigError as error:
            invalid += 1
            problem = problem or str(error)
            continue
        return Found(manifest, 1, invalid, problem)
    return Found(None, 0, invalid, problem)


def _entry_manifest(subkey: str, value: Any, ref: RunRef) -> Manifest:
    origin = f"manifest entry {subkey[:40]!r}"
    if not isinstance(value, bytes):
        raise ConfigError(f"{origin}: is not a manifest")
    manifest = load_manifest_bytes(value, origin, ref)
    if subkey != manifest_subkey(manifest):
        raise ConfigError(f"{origin}: holds manifest version {manifest.version}, whose subkey it is not")
    return manifest


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
    """Refuses, in the DHT itself, manifest and member entries that the run's owner did not sign, and
    keeps this DHT node's manifest entries to one per version and the :data:`MAX_VERSIONS_HELD` newest.

    The cap needs the node's storage, which lives in the DHT's own process: :func:`keep_newest_versions`
    hands it over (:meth:`attach`). An entry below the newest versions held, or a second entry of a
    version held, is refused; an entry that makes room is taken, and the versions it pushes out are
    dropped just after it is stored (hivemind stores right after validating, so a whole dictionary
    stored at once is cut back too). Without storage (a lookup-only DHT) only signatures are checked.
    """

    def __init__(self, ref: RunRef, counter: RejectCounter | None = None,
                 fingerprint_counter: RejectCounter | None = None) -> None:
        self._ref = ref
        self._manifest_dht_id = DHTID.generate(source=manifest_key(ref.run_id))
        self._manifest_id = self._manifest_dht_id.to_bytes()
        self._members_id = DHTID.generate(source=members_key(ref.run_id)).to_bytes()
        self._fingerprint_id = DHTID.generate(source=fingerprint_key(ref.run_id)).to_bytes()
        self.counter = counter if counter is not None else RejectCounter()
        #: Unsigned fingerprint entries refused (a stranger's claim of the run's model).
        self.fingerprint_counter = fingerprint_counter if fingerprint_counter is not None else RejectCounter()
        self._verdicts: collections.OrderedDict[bytes, bool] = collections.OrderedDict()
        self._stores: tuple[Any, ...] = ()
        self._later: Callable[[Callable[[], None]], Any] | None = None
        self._prune_pending = False

    def attach(self, *stores: Any, later: Callable[[Callable[[], None]], Any] | None = None) -> None:
        """Keep the manifest key within its cap in ``stores`` (a DHT node's storage and cache); ``later``
        runs a callable once the current store is done (default: the running event loop's ``call_soon``)."""
        self._stores, self._later = stores, later

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
            return False
        if record.key == self._manifest_id and not self._makes_room(MSGPackSerializer.loads(record.subkey)):
            self.counter.reject("over_cap", record.subkey, record.value)
            return False
        return True

    def _held(self) -> dict[int, str]:
        """The manifest versions this node holds, each with its subkey."""
        held: dict[int, str] = {}
        for entries in self._manifest_entries():
            for subkey, _ in list(entries.items()):
                version = subkey_version(subkey)
                if version is not None and (version not in held or subkey < held[version]):
                    held[version] = subkey
        return held

    def _manifest_entries(self) -> list[DictionaryDHTValue]:
        found = [store.get(self._manifest_dht_id) for store in self._stores]
        return [item.value for item in found if item is not None and isinstance(item.value, DictionaryDHTValue)]

    def _makes_room(self, subkey: str) -> bool:
        """Whether this node takes a verified manifest entry: one it holds (a refresh), or a version it
        does not hold that is among the newest; then what it pushes out is dropped once it is stored."""
        version = subkey_version(subkey)
        if not self._stores or version is None:
            return version is not None
        held = self._held()
        if held.get(version) == subkey:
            return True
        if version in held or sum(v > version for v in held) >= MAX_VERSIONS_HELD:
            return False
        self._prune_soon()
        return True

    def _prune_soon(self) -> None:
        if self._prune_pending:
            return
        later = self._later
        if later is None:
            try:
                later = asyncio.get_running_loop().call_soon
            except RuntimeError:  # not inside the DHT's event loop: nothing is being stored
                return
        self._prune_pending = True
        later(self._prune)

    def _prune(self) -> None:
        """Drop what is not among the newest versions held, and any second entry of a version."""
        self._prune_pending = False
        held = self._held()
        keep = {held[v] for v in sorted(held, reverse=True)[:MAX_VERSIONS_HELD]}
        for entries in self._manifest_entries():
            for subkey in [subkey for subkey, _ in entries.items() if subkey not in keep]:
                del entries[subkey]

    def _check(self, record: DHTRecord) -> bool:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            value = MSGPackSerializer.loads(record.value)
            if record.key == self._manifest_id:
                if not isinstance(value, bytes) or not isinstance(subkey, str):
                    return False
                manifest = load_manifest_bytes(value, "manifest entry", self._ref)
                return subkey == manifest_subkey(manifest)
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


async def _attach_storage(_dht: Any, node: Any) -> int:
    protocol = node.protocol
    # hivemind (pinned at 1.1.12) keeps a CompositeValidator's parts in ``_validators``.
    validators = getattr(protocol.record_validator, "_validators", [protocol.record_validator])
    ours = [validator for validator in validators if isinstance(validator, RunEntryValidator)]
    for validator in ours:
        validator.attach(protocol.storage, protocol.cache)
    return len(ours)


def keep_newest_versions(dht: Any, *, timeout: float = 10.0) -> bool:
    """Let the run validators of a started DHT keep its manifest key within its cap
    (:class:`RunEntryValidator`); False, with one warning, when that could not be arranged."""
    try:
        attached = int(dht.run_coroutine(_attach_storage, return_future=True).result(timeout=timeout))
    except Exception as exc:  # a DHT that is going away: it stores nothing more either
        logger.warning("could not cap the manifest versions this DHT node holds: %r", exc)
        return False
    return attached > 0
