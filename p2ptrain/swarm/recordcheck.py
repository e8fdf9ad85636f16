"""What one peer record must be to enter a swarm view: schema, bounds, and a key bound to its peer ID.

A record's signing key (hivemind's RSA record key, the DHT subkey) is bound to the libp2p peer ID the
record claims by the node's identity key (:mod:`p2ptrain.swarm.identity`): the record carries that identity
key and its signature over ``(run, record key)``.  :class:`RecordChecker` verifies all of it and says
why a record is refused; :mod:`p2ptrain.swarm.records` publishes records and builds the views.
"""

from __future__ import annotations

import collections
import hashlib
import re
from typing import Any

import pydantic.v1 as pyd  # hivemind 1.1.12's SchemaValidator is written against pydantic's v1 API
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import MSGPackSerializer

from p2ptrain.swarm.identity import MAX_PUBLIC_KEY_BYTES, verify_for_peer
from p2ptrain.trust.verdicts import MAX_EPOCH
from p2ptrain.trust.vouching import MAX_RECORD_VOUCHES

#: Largest serialized record (before the signature) a node publishes or accepts: the fields, the
#: identity key (~300 bytes for RSA-2048) and its signature (256 bytes).
MAX_RECORD_BYTES = 2048
#: Tolerated clock difference between peers when checking ``published_at``.
CLOCK_SKEW_SECONDS = 60.0
#: Most peers one swarm view lists; beyond that a flood, not a swarm (peers seen before stay listed).
MAX_RECORDS_PER_VIEW = 256
#: Bounds on what a record may claim (a node beyond these is lying or broken).
MAX_SAMPLES_PER_SECOND = 1e7
MAX_UPTIME_SECONDS = 1e9
MAX_ABS_LOSS = 1e6
#: Binding checks remembered: more than a flood of records a view reads, so each is verified once.
_BINDING_CACHE = 16384
#: Why records are dropped, in the order of the shared counters.
REJECT_REASONS: tuple[str, ...] = ("size", "signature", "schema", "not_a_key", "unbound", "wrong_identity",
                                   "stale", "future", "over_cap")
#: Credit and coverage fields.  They travel as extras (not in :class:`PeerRecordModel`: hivemind's
#: schema check would refuse older records that lack them) and are checked when a view is built.
MAX_SAMPLES_CONTRIBUTED = 10**15
MAX_DATA_PASS = 10**6
MAX_SHARDS = 10**7
CREDIT_COUNTS: dict[str, int] = {"samples_contributed": MAX_SAMPLES_CONTRIBUTED, "data_pass": MAX_DATA_PASS,
                                 "shards_consumed": MAX_SHARDS, "shards_total": MAX_SHARDS}
MAX_DATA_SOURCE_CHARS = 32
#: Where a peer trains and in which precision (extras too): what a record may say, exactly.
DEVICE_PATTERN = re.compile(r"(cpu|cuda:\d{1,2})?")
PRECISIONS = frozenset({"", "fp32", "bf16", "fp16"})
#: Passes before the current one whose shard counts a record carries (``past_pass_shards``).
MAX_PAST_PASSES = 7
#: Longest peer ID a record's ``vouched`` pairs may name (libp2p's are 46-52 characters).
MAX_VOUCHED_ID_CHARS = 64


class PeerRecordModel(pyd.BaseModel):
    """Wire schema of one record. Strict types: hivemind rejects any value pydantic would convert."""

    peer_id: pyd.constr(strict=True, max_length=128)  # type: ignore[valid-type]
    version: pyd.constr(strict=True, max_length=64)  # type: ignore[valid-type]
    state: pyd.constr(strict=True, max_length=32)  # type: ignore[valid-type]
    epoch: pyd.conint(strict=True, ge=0, le=MAX_EPOCH)  # type: ignore[valid-type]
    samples_per_second: pyd.confloat(strict=True, ge=0, le=MAX_SAMPLES_PER_SECOND,  # type: ignore[valid-type]
                                     allow_inf_nan=False)
    loss: pyd.confloat(strict=True, ge=-MAX_ABS_LOSS, le=MAX_ABS_LOSS,  # type: ignore[valid-type]
                       allow_inf_nan=False) | None
    val_loss: pyd.confloat(strict=True, ge=-MAX_ABS_LOSS, le=MAX_ABS_LOSS,  # type: ignore[valid-type]
                           allow_inf_nan=False) | None
    reachability: pyd.constr(strict=True, max_length=16)  # type: ignore[valid-type]
    uptime_seconds: pyd.confloat(strict=True, ge=0, le=MAX_UPTIME_SECONDS,  # type: ignore[valid-type]
                                 allow_inf_nan=False)
    pause_reason: pyd.constr(strict=True, max_length=32)  # type: ignore[valid-type]
    published_at: pyd.confloat(strict=True, gt=0, allow_inf_nan=False)  # type: ignore[valid-type]

    class Config:
        # Newer p2ptrain versions may add fields; "allow" keeps them so hivemind's no-conversion
        # check still sees an identical dict (the size limit bounds what extras can carry).  The
        # identity binding (``identity_key``, ``key_proof``) and ``model_fingerprint`` travel as such
        # extras, checked when the view is built, so older nodes still store newer records.
        extra = pyd.Extra.allow


def credit_problem(value: dict[str, Any]) -> str:
    """Why a record's credit, coverage and device fields are refused ("" when absent or in bounds)."""
    for name, bound in CREDIT_COUNTS.items():
        count = value.get(name, 0)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= bound:
            return f"{name} is not a count up to {bound}"
    source = value.get("data_source", "")
    if not isinstance(source, str) or len(source) > MAX_DATA_SOURCE_CHARS:
        return "data_source is not a short string"
    past = value.get("past_pass_shards", [])
    if not isinstance(past, list | tuple) or len(past) > MAX_PAST_PASSES or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in past):
        return f"past_pass_shards is not a list of up to {MAX_PAST_PASSES} counts"
    total = value.get("shards_total", 0)
    if max([value.get("shards_consumed", 0), *past]) > total:
        return "claims more shards read than there are"
    vouched = value.get("vouched", [])
    if not isinstance(vouched, list | tuple) or len(vouched) > MAX_RECORD_VOUCHES or not all(
            isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)
            and 0 < len(pair[0]) <= MAX_VOUCHED_ID_CHARS and isinstance(pair[1], int) and not isinstance(pair[1], bool)
            and 0 <= pair[1] <= MAX_SAMPLES_CONTRIBUTED for pair in vouched):
        return f"vouched is not a list of up to {MAX_RECORD_VOUCHES} (peer ID, count) pairs"
    return device_problem(value)


def device_problem(value: dict[str, Any]) -> str:
    """Why a record's ``device`` and ``precision`` are refused ("" when absent or one of the known forms)."""
    device, precision = value.get("device", ""), value.get("precision", "")
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        return "device is not cpu or cuda:N"
    if not isinstance(precision, str) or precision not in PRECISIONS:
        return "precision is not fp32, bf16 or fp16"
    return ""


def binding_message(run_id: str, record_key: bytes) -> bytes:
    """What a node's libp2p identity signs: "this record key speaks for me in this run"."""
    return b"p2ptrain peer record key\0" + run_id.encode() + b"\0" + record_key


class RecordChecker:
    """Everything a record must pass to enter a view, the identity binding included (results cached)."""

    def __init__(self, run_id: str, ttl: float) -> None:
        self._run_id, self._ttl = run_id, ttl
        self._bindings: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        #: Parsed records by a digest of (subkey, value): a view rereads the same records every few seconds.
        self._parsed: collections.OrderedDict[bytes, tuple[str, str, Any]] = collections.OrderedDict()

    def problem(self, subkey: Any, value: Any, now: float) -> tuple[str, str]:
        """(reason, one line) of why a record is refused; ("", "") when it is accepted."""
        if not isinstance(subkey, bytes) or not RSASignatureValidator._PUBLIC_KEY_RE.fullmatch(subkey):
            return "not_a_key", "subkey is not an owner public key"
        try:
            raw = MSGPackSerializer.dumps(value)
        except Exception:
            return "schema", "record cannot be serialized"
        digest = hashlib.blake2b(subkey + b"\0" + raw, digest_size=16).digest()
        cached = self._parsed.get(digest)
        if cached is None:
            cached = self._parse(subkey, raw, value)
            self._parsed[digest] = cached
            if len(self._parsed) > _BINDING_CACHE:
                self._parsed.popitem(last=False)
        reason, problem, model = cached
        if problem:
            return reason, problem
        if model.published_at > now + CLOCK_SKEW_SECONDS:
            return "future", "published_at is in the future"
        if model.published_at < now - self._ttl - CLOCK_SKEW_SECONDS:
            return "stale", "published_at is too old"
        return "", ""

    def _parse(self, subkey: bytes, raw: bytes, value: Any) -> tuple[str, str, Any]:
        """The checks that do not depend on the time: (reason, problem, parsed model)."""
        if len(raw) > MAX_RECORD_BYTES:
            return "size", f"record is {len(raw)} bytes (limit {MAX_RECORD_BYTES})", None
        if not isinstance(value, dict):
            return "schema", f"record is a {type(value).__name__}, not a map", None
        try:
            model = PeerRecordModel.parse_obj(value)
        except pyd.ValidationError as exc:
            return "schema", f"schema: {exc.errors()[0].get('msg', 'invalid')}", None
        identity_key, proof = value.get("identity_key"), value.get("key_proof")
        if not isinstance(identity_key, bytes) or not isinstance(proof, bytes):
            return "unbound", "record carries no identity binding", None
        if len(identity_key) > MAX_PUBLIC_KEY_BYTES or len(proof) > 1024:
            return "size", "identity binding is oversized", None
        problem = credit_problem(value)
        if problem:
            return "schema", problem, None
        fingerprint = value.get("model_fingerprint")
        if fingerprint is not None and (not isinstance(fingerprint, str) or len(fingerprint) > 64):
            return "schema", "model_fingerprint is not a short string", None
        problem = self._binding_problem(model.peer_id, subkey, identity_key, proof)
        return ("wrong_identity", f"peer {model.peer_id}: {problem}", None) if problem else ("", "", model)

    def _binding_problem(self, peer_id: str, subkey: bytes, identity_key: bytes, proof: bytes) -> str:
        cache_key = hashlib.blake2b(b"\0".join((peer_id.encode(), subkey, identity_key, proof)),
                                    digest_size=16).digest()
        problem = self._bindings.get(cache_key)
        if problem is None:
            problem = verify_for_peer(peer_id, identity_key, binding_message(self._run_id, subkey), proof)
            self._bindings[cache_key] = problem
            if len(self._bindings) > _BINDING_CACHE:
                self._bindings.popitem(last=False)
        return problem


_checkers: dict[tuple[str, float], RecordChecker] = {}


def bound_fingerprints(found: Any, run_id: str, now: float, ttl: float = 60.0) -> dict[str, str]:
    """Peer ID -> model fingerprint, from the valid, identity-bound records of a ``<run>_peers`` lookup
    that name one (bindings verified once per process: a flood of records costs its checks once).
    Every record is looked at: honest ones must not hide behind a crowd."""
    checker = _checkers.get((run_id, ttl))
    if checker is None:
        checker = _checkers[(run_id, ttl)] = RecordChecker(run_id, ttl)
    fingerprints: dict[str, str] = {}
    entries = found.value if found is not None and isinstance(getattr(found, "value", None), dict) else {}
    for subkey, item in entries.items():
        value = getattr(item, "value", None)
        if not isinstance(value, dict) or not isinstance(value.get("model_fingerprint"), str):
            continue  # says nothing about the model: not worth a signature check
        if getattr(item, "expiration_time", 0.0) >= now and not checker.problem(subkey, value, now)[1]:
            fingerprints[value["peer_id"]] = value["model_fingerprint"]
    return fingerprints
