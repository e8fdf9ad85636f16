"""Signed per-peer records in the DHT: publish this node's own, read and validate everyone's.

Each node stores its :class:`~p2ptrain.status.PeerRecord` under the run's key ``<run_id>_peers``
with its RSA record key as the subkey, so hivemind's :class:`RSASignatureValidator` lets only the
holder of that key write it.  That key is hivemind's process-wide one and says nothing about the
libp2p peer ID, so each record also carries the node's libp2p identity key and that identity's
signature over ``(run, record key)``: a record is accepted only for the peer ID its identity key
hashes to (:mod:`p2ptrain.swarm.recordcheck`).  Nobody can publish a record in another peer's name.

A pydantic schema with bounds on every number and a size limit are enforced by the DHT on every
store and lookup (hivemind drops bad records there); what reaches us is validated once more (schema,
identity binding, publication time) before it enters the :class:`SwarmView`, which holds at most
``max_records`` peers.  Records dropped anywhere are counted, once each, by reason.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import math
import multiprocessing as mp
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import pydantic.v1 as pyd  # hivemind 1.1.12's SchemaValidator is written against pydantic's v1 API
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.dhtkeys import peers_key
from p2ptrain.status import PeerRecord, SwarmView
from p2ptrain.swarm.identity import IdentityError, IdentityKey
from p2ptrain.swarm.recordcheck import (  # noqa: F401 - re-exported: the record's rules live there
    CLOCK_SKEW_SECONDS,
    CREDIT_COUNTS,
    MAX_DATA_SOURCE_CHARS,
    MAX_PAST_PASSES,
    MAX_RECORD_BYTES,
    MAX_RECORDS_PER_VIEW,
    MAX_SAMPLES_CONTRIBUTED,
    MAX_VOUCHED_ID_CHARS,
    REJECT_REASONS,
    PeerRecordModel,
    RecordChecker,
    binding_message,
)
from p2ptrain.swarm.recordcheck import bound_fingerprints as bound_fingerprints  # re-exported: swarm.dht reads it
from p2ptrain.trust.swarm_view import summarize
from p2ptrain.trust.vouching import MAX_RECORD_VOUCHES

logger = logging.getLogger(__name__)

_DEDUP_CAPACITY = 4096
#: Validators' verdicts kept per validator (:class:`_CountsRejects`): about 100 bytes each.
_VERDICTS_KEPT = 8192
#: Live records under the run's key a DHT node holds: four views' worth, well under hivemind's 4 MiB
#: message limit even at the largest record size.
MAX_SUBKEYS_HELD = 4 * MAX_RECORDS_PER_VIEW
#: Room for the signature hivemind appends (a base64 RSA-2048 signature plus its brackets).
_MAX_SIGNED_BYTES = MAX_RECORD_BYTES + 512

class PeersSchema(pyd.BaseModel):
    """The run's key ``<run_id>_peers``: one record per owner public key."""

    peers: dict[BytesWithPublicKey, PeerRecordModel]


class RejectCounter:
    """Counts distinct rejected records by reason, also from inside the DHT's forked process.

    The counts live in shared memory created before hivemind forks its DHT process, so
    rejections seen there (during stores and lookups) are visible to the node.
    """

    def __init__(self) -> None:
        self._counts = mp.get_context("fork").Array("q", len(REJECT_REASONS))
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def reject(self, reason: str, *parts: bytes) -> None:
        digest = hashlib.blake2b(b"\0".join(parts), digest_size=16).digest()
        if digest in self._seen:  # the same bad record seen again (every lookup returns it)
            return
        self._seen[digest] = None
        if len(self._seen) > _DEDUP_CAPACITY:
            self._seen.popitem(last=False)
        with self._counts.get_lock():
            self._counts[REJECT_REASONS.index(reason)] += 1

    @property
    def total(self) -> int:
        return int(sum(self._counts[:]))

    def by_reason(self) -> dict[str, int]:
        return {reason: int(self._counts[i]) for i, reason in enumerate(REJECT_REASONS)}


class _CountsRejects:
    """Mixin: count the records of the run's key that the wrapped hivemind validator refuses, and
    remember its verdicts.

    A search for a key reads the same entries from every replica it visits (up to the DHT's k), and
    hivemind checks every copy: a signature and a schema per entry, the DHT process's main cost in a
    large swarm.  Both checks depend on the record alone, so a verdict is kept for the record's
    exact bytes (:data:`_VERDICTS_KEPT` of them, the oldest forgotten first).
    """

    _key_id: bytes
    _counter: RejectCounter
    _reason: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: collections.OrderedDict[bytes, bool] = collections.OrderedDict()

    def merge_with(self, other: Any) -> bool:
        """hivemind merges validators added later (the optimizer's schemas) into this one: what was
        judged without them is judged again."""
        merged = bool(super().merge_with(other))  # type: ignore[misc]
        if merged:
            self._verdicts.clear()
        return merged

    def validate(self, record: DHTRecord) -> bool:
        memo = _record_digest(record)
        ok = self._verdicts.get(memo)
        if ok is None:
            ok = bool(super().validate(record))  # type: ignore[misc]
            self._verdicts[memo] = ok
            if len(self._verdicts) > _VERDICTS_KEPT:
                self._verdicts.popitem(last=False)
        if not ok and record.key == self._key_id:
            self._counter.reject(self._reason, record.subkey, record.value)
        return ok


def _record_digest(record: DHTRecord) -> bytes:
    """One digest of everything a record's checks read: key, subkey, value and expiration."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (record.key, record.subkey, record.value, repr(record.expiration_time).encode()):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


class _CountingSignatureValidator(_CountsRejects, RSASignatureValidator):
    _reason = "signature"

    def __init__(self, key_id: bytes, counter: RejectCounter, private_key: RSAPrivateKey | None) -> None:
        super().__init__(private_key)
        self._key_id, self._counter = key_id, counter


class _CountingSchemaValidator(_CountsRejects, SchemaValidator):
    _reason = "schema"

    def __init__(self, key_id: bytes, counter: RejectCounter, prefix: str) -> None:
        super().__init__(PeersSchema, allow_extra_keys=True, prefix=prefix)
        self._key_id, self._counter = key_id, counter


class SizeValidator(RecordValidatorBase):
    """Rejects oversized values under the run's key before any signature check or parsing."""

    def __init__(self, key_id: bytes, counter: RejectCounter) -> None:
        self._key_id, self._counter = key_id, counter

    def validate(self, record: DHTRecord) -> bool:
        if record.key == self._key_id and len(record.value) > _MAX_SIGNED_BYTES:
            self._counter.reject("size", record.subkey, record.value[:_MAX_SIGNED_BYTES])
            return False
        return True

    @property
    def priority(self) -> int:
        return 20  # validation runs in decreasing priority: size first, then signature (10), then schema


class SubkeyCapValidator(RecordValidatorBase):
    """Holds at most ``cap`` live records under the run's key in this DHT node (records already held
    are always refreshed).  hivemind sends a key's whole dictionary in one message, and messages are
    limited (4 MiB): a flood of thousands of valid records would make the key unreadable to every
    node that does not hold a replica.  Runs last, so only records that passed every other check
    take a place."""

    def __init__(self, key_id: bytes, counter: RejectCounter, cap: int = MAX_SUBKEYS_HELD) -> None:
        self._key_id, self._counter, self._cap = key_id, counter, cap
        self._live: dict[bytes, float] = {}

    def validate(self, record: DHTRecord) -> bool:
        if record.key != self._key_id:
            return True
        now = get_dht_time()
        if record.subkey in self._live or len(self._live) < self._cap:
            self._live[record.subkey] = max(self._live.get(record.subkey, 0.0), record.expiration_time)
            return True
        self._live = {subkey: until for subkey, until in self._live.items() if until > now}
        if len(self._live) < self._cap:
            self._live[record.subkey] = record.expiration_time
            return True
        self._counter.reject("over_cap", record.subkey, record.value[:_MAX_SIGNED_BYTES])
        return False

    @property
    def priority(self) -> int:
        return -10  # after the signature and schema checks: junk takes no place


def record_validators(run_id: str, private_key: RSAPrivateKey | None = None) -> list[RecordValidatorBase]:
    """Validators to pass first in ``hivemind.DHT(record_validators=...)`` (before any other
    RSASignatureValidator, which then merges into ours).  ``private_key`` defaults to hivemind's
    process-wide key, the one hivemind's optimizer signs with too."""
    key_id = DHTID.generate(source=peers_key(run_id)).to_bytes()
    counter = RejectCounter()
    return [
        SizeValidator(key_id, counter),
        _CountingSignatureValidator(key_id, counter, private_key),
        _CountingSchemaValidator(key_id, counter, prefix=run_id),
        SubkeyCapValidator(key_id, counter),
    ]


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def to_wire(record: PeerRecord) -> dict[str, Any]:
    """The record as strict msgpack-friendly types (ints as int, floats as float, no NaN)."""
    data = record.to_dict()
    data["epoch"] = int(record.epoch)
    for name in ("samples_per_second", "uptime_seconds", "published_at"):
        value = float(data[name])
        data[name] = max(0.0, value) if math.isfinite(value) else 0.0
    for name in ("loss", "val_loss"):
        finite = _finite_or_none(data[name])
        data[name] = float(finite) if finite is not None else None
    for name, bound in CREDIT_COUNTS.items():
        data[name] = min(max(0, int(data[name])), bound)
    data["shards_consumed"] = min(data["shards_consumed"], data["shards_total"])
    data["past_pass_shards"] = [min(max(0, int(c)), data["shards_total"])
                                for c in data["past_pass_shards"][:MAX_PAST_PASSES]]
    data["data_source"] = str(data["data_source"])[:MAX_DATA_SOURCE_CHARS]
    data["vouched"] = [[str(peer), min(max(0, int(count)), MAX_SAMPLES_CONTRIBUTED)]
                       for peer, count in record.vouched if 0 < len(str(peer)) <= MAX_VOUCHED_ID_CHARS
                       ][:MAX_RECORD_VOUCHES]
    return data


def identity_of(dht: Any) -> IdentityKey | None:
    """The node's libp2p identity, read from the key file its DHT was started with (None if none)."""
    path = getattr(dht, "kwargs", {}).get("identity_path") if isinstance(getattr(dht, "kwargs", None), dict) \
        else None
    if not path:
        return None
    try:
        return IdentityKey.from_file(path)
    except IdentityError as exc:
        logger.warning("peer records go out unbound (%s): other nodes will not list this node", exc)
        return None


class RecordBook:
    """Publishes this node's record and builds the swarm view from everyone's.

    ``identity`` signs the binding of our record key to our peer ID; by default it is read from the
    DHT's ``identity_path``.  ``fingerprint`` (optional) is published as ``model_fingerprint``.
    """

    def __init__(
        self,
        dht: Any,
        run_id: str,
        validators: Sequence[RecordValidatorBase],
        *,
        ttl: float = 20.0,
        get_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        identity: IdentityKey | None = None,
        fingerprint: str = "",
        max_records: int = MAX_RECORDS_PER_VIEW,
        trusted: Callable[[], Collection[str]] | None = None,
    ) -> None:
        signers = [v for v in validators if isinstance(v, _CountingSignatureValidator)]
        if not signers:
            raise ValueError("validators must come from record_validators(run_id)")
        self._dht = dht
        self._run_id = run_id
        self._key = peers_key(run_id)
        self._subkey = signers[0].local_public_key
        self._dht_rejects = signers[0]._counter
        self._local_rejects = RejectCounter()
        self._ttl = ttl
        self._get_timeout = get_timeout
        self._clock = clock
        self._max_records = max_records
        self._trusted = trusted
        #: Peers in our DHT's routing table (their libp2p identity authenticated in DHT traffic): a crowd of
        #: made-up identities never gets there.  Refreshed by :meth:`poll`.
        self._dht_peers: frozenset[str] = frozenset()
        self._dht_peers_pending: Any = None
        self._pending: tuple[Any, float] | None = None
        self._last_view = SwarmView()
        #: Record key (the DHT subkey) -> peer ID, for the records of the last view: each bound to its peer.
        self.bound_keys: dict[bytes, str] = {}
        self._last_keys: dict[str, bytes] = {}
        #: When (by our clock) a lookup last found a fresher copy of each peer's record than any before
        #: (a later expiration), and that expiration: a record carried over from the last view goes once
        #: that is ``ttl`` ago, whatever time the record itself claims.
        self._found_at: dict[str, float] = {}
        self._freshest: dict[str, float] = {}
        self._checker = RecordChecker(run_id, ttl)
        identity = identity if identity is not None else identity_of(dht)
        self._binding: dict[str, Any] = {}
        if identity is not None:
            self._binding = {"identity_key": identity.public_key,
                             "key_proof": identity.sign(binding_message(run_id, self._subkey))}
        if fingerprint:
            self._binding["model_fingerprint"] = fingerprint

    @property
    def rejected_total(self) -> int:
        return self._dht_rejects.total + self._local_rejects.total

    def rejected_by_reason(self) -> dict[str, int]:
        """Records dropped since start, by reason (for ``p2ptrain_records_rejected_total{reason=...}``)."""
        dht, local = self._dht_rejects.by_reason(), self._local_rejects.by_reason()
        return {reason: dht[reason] + local[reason] for reason in REJECT_REASONS}

    def publish(self, record: PeerRecord, fingerprint: str = "") -> None:
        """Store our record (stamped with the current time) without waiting for the DHT; ``fingerprint``
        (if given) is published as the model this node trains."""
        now = self._clock()
        data = {**to_wire(PeerRecord.from_dict({**record.to_dict(), "published_at": now})), **self._binding}
        if fingerprint:
            data["model_fingerprint"] = fingerprint
        if len(MSGPackSerializer.dumps(data)) > MAX_RECORD_BYTES:
            logger.warning("own peer record is over %d bytes; not published", MAX_RECORD_BYTES)
            return
        self._dht.store(self._key, data, expiration_time=now + self._ttl, subkey=self._subkey,
                        return_future=True)

    def read(self, now: float | None = None) -> SwarmView:
        """Every valid live record of the run, waiting up to ``get_timeout``; on a DHT timeout or
        error, an empty view."""
        future = self._dht.get(self._key, latest=True, return_future=True)
        try:
            found = future.result(timeout=self._get_timeout)
        except Exception as exc:  # a slow or broken DHT is normal weather: report nobody this time
            future.cancel()
            logger.info("reading peer records failed (%s); swarm view left empty", type(exc).__name__)
            return SwarmView(rejected_records_total=self.rejected_total)
        return self._view(found, self._clock() if now is None else now)

    def poll(self, now: float | None = None) -> SwarmView:
        """Like :meth:`read` but never waits: returns the view of the last finished lookup and
        starts the next one (a lookup older than ``get_timeout`` is abandoned)."""
        now = self._clock() if now is None else now
        pending = self._pending
        if pending is not None and pending[0].done():
            self._pending = None
            try:
                self._last_view = self._view(pending[0].result(), now)
            except Exception as exc:
                logger.info("reading peer records failed (%s); keeping the last swarm view", type(exc).__name__)
        elif pending is not None and time.monotonic() - pending[1] > self._get_timeout:
            pending[0].cancel()
            self._pending = None
        if self._pending is None:
            self._pending = (self._dht.get(self._key, latest=True, return_future=True), time.monotonic())
        self._refresh_dht_peers()
        return self._last_view

    @property
    def dht_peers(self) -> frozenset[str]:
        """Peer IDs in our DHT's routing table as of the last poll (libp2p authenticated them)."""
        return self._dht_peers

    def _refresh_dht_peers(self) -> None:
        pending = self._dht_peers_pending
        if pending is not None and pending.done():
            self._dht_peers_pending = None
            with contextlib.suppress(Exception):  # the DHT process busy or gone: keep the last list
                self._dht_peers = frozenset(pending.result())
        if self._dht_peers_pending is None and hasattr(self._dht, "run_coroutine"):
            try:
                self._dht_peers_pending = self._dht.run_coroutine(_routing_peers, return_future=True)
            except Exception:
                self._dht_peers_pending = None

    def _view(self, found: Any, now: float) -> SwarmView:
        entries = found.value if found is not None and isinstance(found.value, dict) else {}
        newest: dict[str, tuple[PeerRecord, bytes]] = {}
        keys: dict[str, bytes] = {}
        expirations: dict[str, float] = {}
        for subkey, item in entries.items():
            value, expiration = getattr(item, "value", None), getattr(item, "expiration_time", 0.0)
            record = self._check(subkey, value, expiration, now)
            if record is None:
                continue
            # A restarted node has a new record key but the same peer id: keep its newest record.
            previous = newest.get(record.peer_id)
            if previous is None or record.published_at > previous[0].published_at:
                newest[record.peer_id] = (record, self._digest_of(subkey, value))
                keys[record.peer_id] = subkey
                expirations[record.peer_id] = expiration
        for peer, expiration in expirations.items():
            expiration = min(expiration, now + self._ttl)  # a copy dated far ahead cannot freeze the next ones out
            if expiration > self._freshest.get(peer, -math.inf):
                self._freshest[peer], self._found_at[peer] = expiration, now
        # A lookup returns one node's copy of the key, and under a flood nodes hold different records
        # (each holds a bounded number, some an older copy): records of the last view stay until
        # ``ttl`` after a lookup last found a fresher copy.  A copy found again and again unchanged
        # does not keep a record alive: a peer that left is out of the view within ``ttl`` of its last
        # refresh, also when the one copy left is in our own DHT's cache (a client's DHT stores nothing
        # for others: the record a leaving public peer publishes last reaches no client).
        for record in self._last_view.peers:
            subkey = self._last_keys.get(record.peer_id)
            if record.peer_id not in newest and subkey is not None \
                    and now - self._found_at.get(record.peer_id, -math.inf) <= self._ttl:
                newest[record.peer_id] = (record, subkey)
                keys[record.peer_id] = subkey
        kept = self._capped(newest, now)
        self._last_keys = {record.peer_id: keys[record.peer_id] for record in kept}
        self._found_at = {record.peer_id: self._found_at[record.peer_id] for record in kept}
        self._freshest = {record.peer_id: self._freshest[record.peer_id] for record in kept}
        self.bound_keys = {keys[record.peer_id]: record.peer_id for record in kept}
        return summarize(tuple(sorted(kept, key=lambda r: r.peer_id)), self.rejected_total)

    def _capped(self, newest: dict[str, tuple[PeerRecord, bytes]], now: float) -> list[PeerRecord]:
        """At most ``max_records``: trusted peers first (``trusted``: e.g. the peers this node joined
        through and those it averaged with), then peers our DHT has talked to, then peers already in
        the last view, then the freshest records (a time in the future counts as now: a flood cannot
        win by dating itself ahead).  A crowd of records for made-up identities fills what is left."""
        if len(newest) <= self._max_records:
            return [record for record, _ in newest.values()]
        known = {p.peer_id for p in self._last_view.peers}
        try:
            trusted = set(self._trusted()) if self._trusted is not None else set()
        except Exception:  # a help in ranking, never a reason to lose the view
            trusted = set()
        met = self._dht_peers
        ranked = sorted(newest.values(), key=lambda item: (item[0].peer_id not in trusted,
                                                            item[0].peer_id not in met,
                                                            item[0].peer_id not in known,
                                                            -min(item[0].published_at, now)))
        for _, digest in ranked[self._max_records:]:
            self._local_rejects.reject("over_cap", digest)
        return [record for record, _ in ranked[:self._max_records]]

    @staticmethod
    def _digest_of(subkey: Any, value: Any) -> bytes:
        try:
            raw = MSGPackSerializer.dumps(value)
        except Exception:
            raw = repr(value).encode()[:_MAX_SIGNED_BYTES]
        return (subkey if isinstance(subkey, bytes) else repr(subkey).encode()) + b"\0" + raw

    def _check(self, subkey: Any, value: Any, expiration: float, now: float) -> PeerRecord | None:
        if expiration < now:
            return None  # expired, not malicious
        reason, problem = self._checker.problem(subkey, value, now)
        if problem:
            logger.debug("dropping peer record: %s", problem)
            self._local_rejects.reject(reason, self._digest_of(subkey, value))
            return None
        return PeerRecord.from_dict(value)


async def _routing_peers(_dht: Any, node: Any) -> list[str]:
    """Runs in the DHT's process: the peer IDs in its routing table."""
    return [str(peer) for peer in list(node.protocol.routing_table.peer_id_to_uid)]
