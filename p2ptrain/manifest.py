"""The run manifest: what every peer of a run must share, signed by the run's owner.

A manifest holds the whole ``[task]`` section, the run-wide part of ``[training]``, the admission
policy (``open`` or ``invite``) with banned and revoked peer IDs, a strictly increasing version,
the model fingerprint once known, and the owner's public key. The owner signs a canonical JSON
serialization of all of it; the file is the canonical TOML rendering of the same values with the
signature appended, and is accepted only when it *is* that rendering byte for byte, so any edit
(a value, a comment, a space) is refused. Anyone may hold and pass on a manifest; only the owner
can make one that verifies for the run's reference.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from p2ptrain.config import TaskSection, TrainingSection
from p2ptrain.errors import ConfigError
from p2ptrain.owner import OwnerKey, decode_b64, decode_public_key, encode_public_key, verify
from p2ptrain.peerid import is_peer_id
from p2ptrain.runref import NAME_PATTERN, RunRef
from p2ptrain.tomlwrite import toml_table, toml_value

FORMAT = 1
#: Largest manifest accepted from a file or from the DHT.
MAX_MANIFEST_BYTES = 64 * 1024
#: Peer IDs one manifest may ban or revoke.
MAX_LISTED_PEERS = 4096
_SIGNING_DOMAIN = b"p2ptrain-manifest-v1\x00"
_TIME_RE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"

#: [training] fields every peer of a run must share; the rest of the section is local (threads,
#: validate_every, max_epochs, load_state_timeout, load_state_attempts).
RUN_WIDE_TRAINING: tuple[str, ...] = (
    "mode", "batch_size", "target_batch_size", "lr", "weight_decay", "warmup_epochs", "total_epochs",
    "max_grad_norm", "seed", "matchmaking_time", "averaging_timeout", "grad_compression",
    "state_compression", "overlap", "average_state_every", "inner_steps", "outer_lr", "outer_momentum",
    "outer_nesterov",
)
LOCAL_TRAINING: tuple[str, ...] = tuple(n for n in TrainingSection.model_fields if n not in RUN_WIDE_TRAINING)
#: [task] fields that may be left out of a manifest (their default is None).
OPTIONAL_TASK: tuple[str, ...] = tuple(n for n, f in TaskSection.model_fields.items() if f.default is None)
_SECTIONS = ("format", "run", "admission", "task", "training", "signature")
_HEADER = ("# p2ptrain run manifest, signed by the run's owner. Do not edit: any change breaks the signature.\n"
           "# Change it with: p2ptrain run update <this file> --set training.lr=3e-4 ... (which re-signs it)\n")


class ManifestError(ConfigError):
    """A manifest that cannot be used; the message is the one line to show."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RunBlock(_Strict):
    name: str = Field(pattern=f"^{NAME_PATTERN}$")
    reference: str
    version: int = Field(ge=1, lt=2**63)
    created_at: str = Field(pattern=f"^{_TIME_RE}$")
    updated_at: str = Field(pattern=f"^{_TIME_RE}$")
    owner_key: str
    fingerprint: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")

    @field_validator("owner_key")
    @classmethod
    def _key(cls, value: str) -> str:
        decode_public_key(value)
        return value


class AdmissionBlock(_Strict):
    policy: Literal["open", "invite"]
    banned: list[str] = Field(max_length=MAX_LISTED_PEERS)
    revoked: list[str] = Field(max_length=MAX_LISTED_PEERS)

    @field_validator("banned", "revoked")
    @classmethod
    def _peer_ids(cls, values: list[str]) -> list[str]:
        for value in values:
            if not is_peer_id(value):
                raise ValueError(f"{value[:80]!r} is not a libp2p peer ID")
        return sorted(set(values))


class SignatureBlock(_Strict):
    ed25519: str


def utc_now(clock: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if clock is None else clock))


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


@dataclass(frozen=True)
class Manifest:
    """A run manifest; ``signature`` is empty until :meth:`signed`."""

    name: str
    owner_key: bytes
    version: int
    created_at: str
    updated_at: str
    task: dict[str, Any]
    training: dict[str, Any]
    policy: Literal["open", "invite"] = "open"
    banned: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    fingerprint: str | None = None
    signature: bytes = field(default=b"", repr=False)

    @property
    def ref(self) -> RunRef:
        return RunRef.for_key(self.name, self.owner_key)

    def excluded(self) -> frozenset[str]:
        """Peers that may not take part: banned ones and those whose invites were revoked."""
        return frozenset(self.banned) | frozenset(self.revoked)

    def sections(self) -> dict[str, Any]:
        """The manifest's meaning as plain values (None left out), in file order."""
        run = {"name": self.name, "reference": str(self.ref), "version": self.version,
               "created_at": self.created_at, "updated_at": self.updated_at,
               "owner_key": encode_public_key(self.owner_key), "fingerprint": self.fingerprint}
        return {
            "format": FORMAT,
            "run": {k: v for k, v in run.items() if v is not None},
            "admission": {"policy": self.policy, "banned": sorted(set(self.banned)),
                          "revoked": sorted(set(self.revoked))},
            "task": {k: v for k, v in self.task.items() if v is not None},
            "training": dict(self.training),
        }

    def signing_bytes(self) -> bytes:
        return _SIGNING_DOMAIN + canonical_json(self.sections()).encode("ascii")

    def signed(self, key: OwnerKey) -> Manifest:
        if key.public_key != self.owner_key:
            raise ManifestError(f"owner key is not the key of run {self.ref}")
        try:
            self.to_toml()  # every value must have a TOML form before it is signed
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"run {self.ref}: a value cannot be written to the manifest ({exc})") from None
        return dataclasses.replace(self, signature=key.sign(self.signing_bytes()))

    def verify(self, ref: RunRef | None = None, origin: str = "manifest") -> Manifest:
        """Raise :class:`ManifestError` unless the owner signed exactly this (for ``ref``, if given)."""
        if ref is not None and self.ref != ref:
            raise ManifestError(f"{origin}: is the manifest of run {self.ref}, not {ref} "
                                "(another owner's key or another run name)")
        if not verify(self.owner_key, self.signing_bytes(), self.signature):
            raise ManifestError(f"{origin}: signature does not verify (changed after the owner signed it, "
                                "or signed by another key)")
        return self

    def to_toml(self) -> str:
        """The canonical file: header, sections in order, the signature last."""
        sections = self.sections()
        lines = [_HEADER + f"format = {toml_value(FORMAT)}", ""]
        for name in ("run", "admission", "task", "training"):
            lines += toml_table(name, sections[name]) + [""]
        lines += toml_table("signature", {"ed25519": _b64(self.signature)})
        return "\n".join(lines) + "\n"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _describe(error: ValidationError, origin: str, section: str) -> str:
    first = error.errors()[0]
    where = ".".join([section, *(str(p) for p in first["loc"])])
    kind = first["type"]
    problem = {"extra_forbidden": "unknown key", "missing": "required"}.get(
        kind, first["msg"].removeprefix("Value error, "))
    if kind not in ("extra_forbidden", "missing") and not isinstance(first.get("input"), dict | list):
        problem += f" (got {first.get('input')!r:.80})"
    return f"{origin}: {where}: {' '.join(problem.split())}"


def _check_keys(data: Mapping[str, Any], required: tuple[str, ...], allowed: tuple[str, ...],
                origin: str, section: str) -> None:
    for key in data:
        if key not in allowed:
            where = f"{key}: unknown section" if not section else f"{section}.{key}: unknown key"
            raise ManifestError(f"{origin}: {where}")
    for key in required:
        if key not in data:
            raise ManifestError(f"{origin}: {section}.{key}: required")


def _section(data: Mapping[str, Any], name: str, origin: str) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        raise ManifestError(f"{origin}: [{name}]: required section is missing")
    if not isinstance(value, dict):
        raise ManifestError(f"{origin}: {name}: must be a table")
    return value


def parse_manifest(text: str, origin: str = "manifest") -> Manifest:
    """Parse and schema-check a manifest file's text (the signature is checked by :meth:`Manifest.verify`)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{origin}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{origin}: not valid TOML: {exc}") from None
    if "format" not in data:
        raise ManifestError(f"{origin}: format: required (is this a run manifest?)")
    if data["format"] != FORMAT or type(data["format"]) is not int:
        raise ManifestError(f"{origin}: format {data['format']!r:.20} is not supported by this p2ptrain "
                            f"(it reads format {FORMAT}); upgrade p2ptrain")
    _check_keys(data, (), _SECTIONS, origin, "")
    try:
        run = RunBlock.model_validate(_section(data, "run", origin))
        admission = AdmissionBlock.model_validate(_section(data, "admission", origin))
    except ValidationError as error:
        section = "run" if error.title == "RunBlock" else "admission"
        raise ManifestError(_describe(error, origin, section)) from None
    task_data = _section(data, "task", origin)
    task_required = tuple(n for n in TaskSection.model_fields if n not in OPTIONAL_TASK)
    _check_keys(task_data, task_required, tuple(TaskSection.model_fields), origin, "task")
    training_data = _section(data, "training", origin)
    _check_keys(training_data, RUN_WIDE_TRAINING, RUN_WIDE_TRAINING, origin, "training")
    try:
        task = TaskSection.model_validate(task_data).model_dump(mode="json")
    except ValidationError as error:
        raise ManifestError(_describe(error, origin, "task")) from None
    try:
        training_all = TrainingSection.model_validate(training_data).model_dump(mode="json")
    except ValidationError as error:
        raise ManifestError(_describe(error, origin, "training")) from None
    try:
        signature = decode_b64(SignatureBlock.model_validate(_section(data, "signature", origin)).ed25519,
                               "signature")
    except ValidationError as error:
        raise ManifestError(_describe(error, origin, "signature")) from None
    except ValueError as exc:
        raise ManifestError(f"{origin}: signature.ed25519: {exc}") from None
    manifest = Manifest(
        name=run.name, owner_key=decode_public_key(run.owner_key), version=run.version,
        created_at=run.created_at, updated_at=run.updated_at, fingerprint=run.fingerprint,
        policy=admission.policy, banned=tuple(admission.banned), revoked=tuple(admission.revoked),
        task=task, training={name: training_all[name] for name in RUN_WIDE_TRAINING}, signature=signature,
    )
    if run.reference != str(manifest.ref):
        raise ManifestError(f"{origin}: run.reference {run.reference!r:.80} is not the reference of its "
                            f"owner_key ({manifest.ref})")
    return manifest


def load_manifest(text: str, origin: str = "manifest", ref: RunRef | None = None) -> Manifest:
    """Parse, verify the signature (and the run, if ``ref`` is given) and demand the canonical bytes."""
    manifest = parse_manifest(text, origin).verify(ref, origin)
    canonical = manifest.to_toml()
    if text != canonical:
        line = next((i for i, (a, b) in enumerate(zip(text.splitlines(), canonical.splitlines(), strict=False), 1)
                     if a != b), min(len(text.splitlines()), len(canonical.splitlines())) + 1)
        raise ManifestError(f"{origin}: line {line} differs from the signed manifest's canonical form "
                            "(a manifest is changed only with p2ptrain run update, which re-signs it)")
    return manifest


def load_manifest_bytes(raw: bytes, origin: str = "manifest", ref: RunRef | None = None) -> Manifest:
    """:func:`load_manifest` on bytes (a file's or a DHT value's), bounded and UTF-8 checked first."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{origin}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{origin}: not UTF-8 text") from None
    return load_manifest(text, origin, ref)


def read_manifest_file(path: Path, ref: RunRef | None = None) -> Manifest:
    """:func:`load_manifest` on a file, with one-line errors for unreadable files."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"manifest {path}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"manifest {path}: is a directory, expected a manifest file") from None
    except OSError as exc:
        raise ManifestError(f"manifest {path}: cannot read ({exc.strerror})") from None
    return load_manifest_bytes(raw, f"manifest {path}", ref)


def settings_from(task: TaskSection, training: TrainingSection) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's ``task`` and ``training`` values taken from config sections."""
    training_all = training.model_dump(mode="json")
    return task.model_dump(mode="json"), {name: training_all[name] for name in RUN_WIDE_TRAINING}


def new_manifest(key: OwnerKey, name: str, task: TaskSection, training: TrainingSection, *,
                 policy: Literal["open", "invite"] = "open", clock: float | None = None) -> Manifest:
    """Version 1 of a run, signed."""
    task_values, training_values = settings_from(task, training)
    now = utc_now(clock)
    manifest = Manifest(name=key.ref(name).name, owner_key=key.public_key, version=1, created_at=now,
                        updated_at=now, task=task_values, training=training_values, policy=policy)
    return manifest.signed(key)

