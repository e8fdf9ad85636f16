"""Signed per-peer records in the DHT: publish this node's own, read and validate everyone's.

Each node stores its :class:`~p2ptrain.status.PeerRecord` under the run's key ``<run_id>_peers``
with its RSA public key as the subkey, so hivemind's :class:`RSASignatureValidator` lets only the
owner write it.  A pydantic schema and a size limit are enforced by the DHT on every store and
lookup (hivemind drops bad records there); what reaches us is validated once more (schema,
finite numbers, size, publication time) before it enters the :class:`SwarmView`.  Records dropped
anywhere are counted, once each, in ``rejected_total``.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from typing import Any

import pydantic.v1 as pyd  # hivemind 1.1.12's SchemaValidator is written against pydantic's v1 API
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.status import NodeState, PeerRecord, SwarmView

logger = logging.getLogger(__name__)

#: Largest serialized record (before the signature) a node publishes or accepts.
MAX_RECORD_BYTES = 1024
#: Room for the signature hivemind appends (a base64 RSA-2048 signature plus its brackets).
_MAX_SIGNED_BYTES = MAX_RECORD_BYTES + 512
#: Tolerated clock difference between peers when checking ``published_at``.
CLOCK_SKEW_SECONDS = 60.0
_DEDUP_CAPACITY = 4096


def peers_key(run_id: str) -> str:
    return f"{run_id}_peers"


class PeerRecordModel(pyd.BaseModel):
    """Wire schema of one record. Strict types: hivemind rejects any value pydantic would convert."""

    peer_id: pyd.constr(strict=True, max_length=128)  # type: ignore[valid-type]
    version: pyd.constr(strict=True, max_length=64)  # type: ignore[valid-type]
    state: pyd.constr(strict=True, max_length=32)  # type: ignore[valid-type]
    epoch: pyd.conint(strict=True, ge=0)  # type: ignore[valid-type]
    samples_per_second: pyd.confloat(strict=True, ge=0, allow_inf_nan=False)  # type: ignore[valid-type]
    loss: pyd.confloat(strict=True, allow_inf_nan=False) | None  # type: ignore[valid-type]
    val_loss: pyd.confloat(strict=True, allow_inf_nan=False) | None  # type: ignore[valid-type]
    reachability: pyd.constr(strict=True, max_length=16)  # type: ignore[valid-type]
    uptime_seconds: pyd.confloat(strict=True, ge=0, allow_inf_nan=False)  # type: ignore[valid-type]
    pause_reason: pyd.constr(strict=True, max_length=32)  # type: ignore[valid-type]
    published_at: pyd.confloat(strict=True, gt=0, allow_inf_nan=False)  # type: ignore[valid-type]

    class Config:
        # Newer p2ptrain versions may add fields; "allow" keeps them so hivemind's no-conversion
        # check still sees an identical dict (the size limit bounds what extras can carry).
        extra = pyd.Extra.allow


class PeersSchema(pyd.BaseModel):
    """The run's key ``<run_id>_peers``: one record per owner public key."""

    peers: dict[BytesWithPublicKey, PeerRecordModel]  # type: ignore[valid-type]


class RejectCounter:
    """Counts distinct rejected records, also from inside the DHT's forked process.

    The count lives in shared memory created before hivemind forks its DHT process, so
    rejections seen there (during stores and lookups) are visible to the node.
    """

    def __init__(self) -> None:
        self._value = mp.get_context("fork").Value("q", 0)
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def reject(self, *parts: bytes) -> None:
        digest = hashlib.blake2b(b"\0".join(parts), digest_size=16).digest()
        if digest in self._seen:  # the same bad record seen again (every lookup returns it)
            return
        self._seen[digest] = None
        if len(self._seen) > _DEDUP_CAPACITY:
            self._seen.popitem(last=False)
        with self._value.get_lock():
            self._value.value += 1

    @property
    def total(self) -> int:
        return int(self._value.value)


class _CountsRejects:
    """Mixin: count the records of the run's key that the wrapped hivemind validator refuses."""

    _key_id: bytes
    _counter: RejectCounter

    def validate(self, record: DHTRecord) -> bool:
        ok = super().validate(record)  # type: ignore[misc]
        if not ok and record.key == self._key_id:
            self._counter.reject(record.subkey, record.value)
        return ok


class _CountingSignatureValidator(_CountsRejects, RSASignatureValidator):
    def __init__(self, key_id: bytes, counter: RejectCounter, private_key: RSAPrivateKey | None) -> None:
        super().__init__(private_key)
        self._key_id, self._counter = key_id, counter


class _CountingSchemaValidator(_CountsRejects, SchemaValidator):
    def __init__(self, key_id: bytes, counter: RejectCounter, prefix: str) -> None:
        super().__init__(PeersSchema, allow_extra_keys=True, prefix=prefix)
        self._key_id, self._counter = key_id, counter


class SizeValidator(RecordValidatorBase):
    """Rejects oversized values under the run's key before any signature check or parsing."""

    def __init__(self, key_id: bytes, counter: RejectCounter) -> None:
        self._key_id, self._counter = key_id, counter

    def validate(self, record: DHTRecord) -> bool:
        if record.key == self._key_id and len(record.value) > _MAX_SIGNED_BYTES:
            self._counter.reject(record.subkey, record.value[:_MAX_SIGNED_BYTES])
            return False
        return True

    @property
    def priority(self) -> int:
        return 20  # validation runs in decreasing priority: size first, then signature (10), then schema


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
        value = _finite_or_none(data[name])
        data[name] = float(value) if value is not None else None
    return data


class RecordBook:
    """Publishes this node's record and builds the swarm view from everyone's."""

    def __init__(
        self,
        dht: Any,
        run_id: str,
        validators: Sequence[RecordValidatorBase],
        *,
        ttl: float = 20.0,
        get_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        signers = [v for v in validators if isinstance(v, _CountingSignatureValidator)]
        if not signers:
            raise ValueError("validators must come from record_validators(run_id)")
        self._dht = dht
        self._key = peers_key(run_id)
        self._subkey = signers[0].local_public_key
        self._dht_rejects = signers[0]._counter
        self._local_rejects = RejectCounter()
        self._ttl = ttl
        self._get_timeout = get_timeout
        self._clock = clock
        self._pending: tuple[Any, float] | None = None
        self._last_view = SwarmView()

    @property
    def rejected_total(self) -> int:
        return self._dht_rejects.total + self._local_rejects.total

    def publish(self, record: PeerRecord) -> None:
        """Store our record (stamped with the current time) without waiting for the DHT."""
        now = self._clock()
        data = to_wire(PeerRecord.from_dict({**record.to_dict(), "published_at": now}))
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
        return self._last_view

    def _view(self, found: Any, now: float) -> SwarmView:
        entries = found.value if found is not None and isinstance(found.value, dict) else {}
        newest: dict[str, PeerRecord] = {}
        for subkey, item in entries.items():
            value, expiration = getattr(item, "value", None), getattr(item, "expiration_time", 0.0)
            record = self._check(subkey, value, expiration, now)
            if record is None:
                continue
            # A restarted node has a new signing key but the same peer id: keep its newest record.
            previous = newest.get(record.peer_id)
            if previous is None or record.published_at > previous.published_at:
                newest[record.peer_id] = record
        return summarize(tuple(sorted(newest.values(), key=lambda r: r.peer_id)), self.rejected_total)

    def _check(self, subkey: Any, value: Any, expiration: float, now: float) -> PeerRecord | None:
        if expiration < now:
            return None  # expired, not malicious
        try:
            raw = MSGPackSerializer.dumps(value)
        except Exception:
            raw = repr(value).encode()[:_MAX_SIGNED_BYTES]
        subkey_bytes = subkey if isinstance(subkey, bytes) else repr(subkey).encode()
        problem = self._problem(subkey, value, raw, now)
        if problem:
            logger.debug("dropping peer record: %s", problem)
            self._local_rejects.reject(subkey_bytes, raw)
            return None
        return PeerRecord.from_dict(value)

    def _problem(self, subkey: Any, value: Any, raw: bytes, now: float) -> str:
        if not isinstance(subkey, bytes) or not RSASignatureValidator._PUBLIC_KEY_RE.fullmatch(subkey):
            return "subkey is not an owner public key"
        if len(raw) > MAX_RECORD_BYTES:
            return f"record is {len(raw)} bytes (limit {MAX_RECORD_BYTES})"
        if not isinstance(value, dict):
            return f"record is a {type(value).__name__}, not a map"
        try:
            model = PeerRecordModel.parse_obj(value)
        except pyd.ValidationError as exc:
            return f"schema: {exc.errors()[0].get('msg', 'invalid')}"
        if model.published_at > now + CLOCK_SKEW_SECONDS:
            return "published_at is in the future"
        if model.published_at < now - self._ttl - CLOCK_SKEW_SECONDS:
            return "published_at is too old"
        return ""


def summarize(peers: tuple[PeerRecord, ...], rejected_total: int = 0) -> SwarmView:
    """Totals of a set of records: throughput, highest epoch, slowest and fastest trainer."""
    trainers = [p for p in peers if p.state == NodeState.TRAINING and p.samples_per_second > 0]
    slowest = min(trainers, key=lambda p: (p.samples_per_second, p.peer_id)).peer_id if trainers else ""
    fastest = max(trainers, key=lambda p: (p.samples_per_second, p.peer_id)).peer_id if trainers else ""
    return SwarmView(
        peers=peers,
        swarm_samples_per_second=float(sum(p.samples_per_second for p in peers)),
        global_epoch=max((p.epoch for p in peers), default=0),
        slowest_peer=slowest,
        fastest_peer=fastest,
        rejected_records_total=rejected_total,
    )
