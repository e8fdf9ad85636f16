"""The run manifest: what every peer of a run must share, signed by the run's owner.

A manifest holds what is trained and on which data (the run-wide part of ``[task]``: the model,
the tokenizer, ``seq_len``, the dataset when it lives at a URL (http(s), an object store), or the fact that each node
brings its own copy), the run-wide part of ``[training]``, the admission policy (``open`` or
``invite``) with banned and revoked peer IDs, a strictly increasing version, the model
fingerprint once known, and the owner's public key. The owner signs a canonical JSON
serialization of all of it; the file is the canonical TOML rendering of the same values with the
signature appended, and is accepted only when it *is* that rendering byte for byte, so any edit
(a value, a comment, a space) is refused. Both forms write every table's keys in sorted order,
at every depth, whatever order a config or a parse gave them: one signed meaning has exactly one
file, so nobody can mint new copies of a signed manifest (reordered ``task.options``, say) to
flood the DHT with. Versions run from 1 to :data:`MAX_VERSION`. Anyone may hold and pass on a
manifest; only the owner can make one that verifies for the run's reference.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import time
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from p2ptrain.config import checks
from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.config.tomlwrite import toml_table, toml_value
from p2ptrain.errors import ConfigError
from p2ptrain.peerid import is_peer_id
from p2ptrain.run.owner import OwnerKey, decode_b64, decode_public_key, encode_public_key, verify
from p2ptrain.runref import NAME_PATTERN, RunRef

FORMAT = 1
#: Largest manifest accepted from a file or from the DHT.
MAX_MANIFEST_BYTES = 64 * 1024
#: Peer IDs one manifest may ban or revoke.
MAX_LISTED_PEERS = 4096
#: Highest manifest version: far more updates than a run's life holds, and a number every consumer
#: (a float gauge, a DHT subkey, the next ``run update``) carries exactly.
MAX_VERSION = 10**9
_SIGNING_DOMAIN = b"p2ptrain-manifest-v1\x00"
_TIME_RE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"

#: [training] fields every peer of a run must share; the rest of the section is local (threads,
#: validate_every, max_epochs, load_state_timeout, load_state_attempts).
RUN_WIDE_TRAINING: tuple[str, ...] = (
    "mode", "batch_size", "target_batch_size", "lr", "weight_decay", "warmup_epochs", "total_epochs",
    "max_grad_norm", "seed", "matchmaking_time", "averaging_timeout", "grad_compression",
    "state_compression", "overlap", "average_state_every", "inner_steps", "inner_batch_size", "outer_lr",
    "outer_momentum", "outer_nesterov", "outer_compression", "outer_topk_density", "outer_value_bits",
)
#: Run-wide [training] fields a manifest leaves out while they hold their defaults: they came after
#: manifests were first signed, so a manifest of a run that does not use them is, byte for byte, what
#: an older p2ptrain signed (its signature still verifies), and one that does use them is refused by
#: an older p2ptrain, which could not train that way.
OPTIONAL_TRAINING: tuple[str, ...] = ("outer_compression", "outer_topk_density", "outer_value_bits")
LOCAL_TRAINING: tuple[str, ...] = tuple(n for n in TrainingSection.model_fields if n not in RUN_WIDE_TRAINING)
#: [task] fields every peer of a run must share: the model, how text becomes tokens, and the
#: dataset's identity. ``data_path`` is among them only as a URL, http(s) or an object store's (a shard
#: or a shard index): a local path means nothing on another machine, so a run on local data records
#: ``local_data = true`` instead, and each node names its own copy in its config.
#: ``data_index_sha256``: the digest of the shard index the run was created with (URL or local), so a
#: node whose index differs, served by the data host or copied by the volunteer, is refused.
#: ``code_sha256``: the digest of a user task's code, so a volunteer with another version is refused.
RUN_WIDE_TASK: tuple[str, ...] = (
    "name", "kind", "entrypoint", "code_sha256", "data_path", "data_index_sha256", "data_format", "text_field",
    "seq_len", "d_model", "n_layers", "n_heads", "validation_fraction", "validation_batches", "options",
)
#: [task] fields that are each machine's own: memory for text, the download cache and its limits, and where
#: this machine keeps a Hugging Face model's directory (task.model_config, task.tokenizer; the fingerprint, which
#: holds the whole model config and the vocabulary size, keeps copies that differ apart).
LOCAL_TASK: tuple[str, ...] = tuple(n for n in TaskSection.model_fields if n not in RUN_WIDE_TASK)
#: [task] fields that may be left out of a manifest (their default is None).
OPTIONAL_TASK: tuple[str, ...] = tuple(n for n in RUN_WIDE_TASK if TaskSection.model_fields[n].default is None)
#: The manifest's own [task] key: the run trains on data each node keeps locally.
LOCAL_DATA_KEY = "local_data"
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
    version: int = Field(ge=1, le=MAX_VERSION)
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
    local_data: bool = False
    """The run's data is a local path on the owner's machine: each node sets ``task.data_path`` itself."""
    signature: bytes = field(default=b"", repr=False)

    @property
    def ref(self) -> RunRef:
        return RunRef.for_key(self.name, self.owner_key)

    def excluded(self) -> frozenset[str]:
        """Peers that may not take part: banned ones and those whose invites were revoked."""
        return frozenset(self.banned) | frozenset(self.revoked)

    def sections(self) -> dict[str, Any]:
        """The manifest's meaning as plain values (None left out); both forms sort each table's keys."""
        run = {"name": self.name, "reference": str(self.ref), "version": self.version,
               "created_at": self.created_at, "updated_at": self.updated_at,
               "owner_key": encode_public_key(self.owner_key), "fingerprint": self.fingerprint}
        return {
            "format": FORMAT,
            "run": {k: v for k, v in run.items() if v is not None},
            "admission": {"policy": self.policy, "banned": sorted(set(self.banned)),
                          "revoked": sorted(set(self.revoked))},
            "task": {k: v for k, v in self.task.items() if v is not None}
            | ({LOCAL_DATA_KEY: True} if self.local_data else {}),
            "training": {k: v for k, v in self.training.items()
                         if k not in OPTIONAL_TRAINING or v != TrainingSection.model_fields[k].default},
        }

    def signing_bytes(self) -> bytes:
        return _SIGNING_DOMAIN + canonical_json(self.sections()).encode("ascii")

    def signed(self, key: OwnerKey) -> Manifest:
        if key.public_key != self.owner_key:
            raise ManifestError(f"owner key is not the key of run {self.ref}")
        if not 1 <= self.version <= MAX_VERSION:
            raise ManifestError(f"run {self.ref}: version {self.version} is outside 1..{MAX_VERSION}; a run that "
                                "has used up its versions goes on as a new run (p2ptrain run init)")
        problem = data_problem(self.task.get("data_path"), self.local_data) or unwritable(self.sections())
        if problem:
            raise ManifestError(f"run {self.ref}: {problem}")
        signed = dataclasses.replace(self, signature=key.sign(self.signing_bytes()))
        _check_reads_back(signed)
        return signed

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
        """The canonical file: header, ``format``, the tables in a fixed order with their keys sorted (as in
        the signed JSON), the signature last."""
        sections = self.sections()
        lines = [_HEADER + f"format = {toml_value(FORMAT)}", ""]
        for name in ("run", "admission", "task", "training"):
            lines += toml_table(name, sections[name]) + [""]
        lines += toml_table("signature", {"ed25519": _b64(self.signature)})
        return "\n".join(lines) + "\n"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _leaves(value: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Every value inside ``value`` that is not a table or an array, with its dotted name; a table's
    key that is not text comes as a leaf of its own (``KeyError`` stands for it)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                yield from _leaves(item, f"{where}.{key}")
            else:
                yield f"{where}.{key!r}", KeyError
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{where}[{index}]")
    else:
        yield where, value


def _not_finite(where: str, leaf: Any) -> str | None:
    if isinstance(leaf, float) and not math.isfinite(leaf):
        return f"{where}: {leaf!r} is not a finite number; a run manifest holds finite numbers only"
    return None


def non_finite(values: Mapping[str, Any], section: str) -> str | None:
    """The first number in a config section's fields (before JSON conversion turns nan and inf into
    nothing) that is not finite, by name, as the reason they cannot go into a manifest; or None."""
    return next((p for where, leaf in _leaves(values, section) if (p := _not_finite(where, leaf))), None)


def unwritable(sections: Mapping[str, Any]) -> str | None:
    """Why a manifest's values (:meth:`Manifest.sections`) cannot be signed and read back as the same
    values, or None; names the first such value. TOML, the file's form, has no null, and JSON (what
    is signed) has no nan or inf; a field left unset (None right under its section) is left out."""
    for section in ("run", "admission", "task", "training"):
        for name, value in sections[section].items():
            if value is None:
                continue
            for where, leaf in _leaves(value, f"{section}.{name}"):
                problem = _leaf_problem(where, leaf)
                if problem:
                    return problem
    return None


def _leaf_problem(where: str, leaf: Any) -> str | None:
    if leaf is KeyError:
        return f"{where}: a key that is not text"
    if leaf is None:
        return f"{where}: has no value (TOML, a manifest's form, has no null)"
    if isinstance(leaf, bool):
        return None
    if isinstance(leaf, int):
        return None if -(2**63) <= leaf < 2**63 else f"{where}: integer {leaf} does not fit TOML's 64 bits"
    if isinstance(leaf, float):
        return _not_finite(where, leaf)
    if isinstance(leaf, str):
        return None if _is_unicode(leaf) else f"{where}: text that is not valid Unicode"
    return f"{where}: a {type(leaf).__name__}, which has no TOML form"


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_reads_back(manifest: Manifest) -> None:
    """Raise one line naming the first value whose file form would not read back as signed: a
    manifest that cannot verify must never be written (the file is how every node receives it)."""
    origin = f"run {manifest.ref}"
    try:
        back = parse_manifest(manifest.to_toml(), origin)
    except ManifestError as error:
        raise ManifestError(f"{error} (in the manifest about to be signed)") from None
    if back.signing_bytes() == manifest.signing_bytes():
        return
    where = _first_change(manifest.sections(), back.sections(), "") or "a value"
    raise ManifestError(f"{origin}: {where.lstrip('.')}: would not read back from the manifest file as signed")


def _first_change(ours: Any, theirs: Any, where: str) -> str | None:
    if isinstance(ours, Mapping) and isinstance(theirs, Mapping):
        for key in [*ours, *(k for k in theirs if k not in ours)]:
            found = _first_change(ours.get(key), theirs.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(ours, list | tuple) and isinstance(theirs, list | tuple) and len(ours) == len(theirs):
        return next((f for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                     if (f := _first_change(a, b, f"{where}[{i}]"))), None)
    return None if canonical_json(ours) == canonical_json(theirs) else where


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
                origin: str, section: str, local: tuple[str, ...] = ()) -> None:
    for key in data:
        if key in local:
            raise ManifestError(f"{origin}: {section}.{key}: a setting of each node's own config, not part of a "
                                "run manifest")
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
    task_data = dict(_section(data, "task", origin))
    local_data = task_data.pop(LOCAL_DATA_KEY, False)
    if type(local_data) is not bool:
        raise ManifestError(f"{origin}: task.{LOCAL_DATA_KEY}: must be true or false (got {local_data!r:.40})")
    task_required = tuple(n for n in RUN_WIDE_TASK if n not in OPTIONAL_TASK)
    _check_keys(task_data, task_required, RUN_WIDE_TASK, origin, "task", local=LOCAL_TASK)
    training_data = _section(data, "training", origin)
    training_required = tuple(n for n in RUN_WIDE_TRAINING if n not in OPTIONAL_TRAINING)
    _check_keys(training_data, training_required, RUN_WIDE_TRAINING, origin, "training", local=LOCAL_TRAINING)
    try:
        task_all = TaskSection.model_validate(task_data).model_dump(mode="json")
    except ValidationError as error:
        raise ManifestError(_describe(error, origin, "task")) from None
    problem = data_problem(task_all["data_path"], local_data)
    if problem:
        raise ManifestError(f"{origin}: {problem}")
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
        task={name: task_all[name] for name in RUN_WIDE_TASK},
        training={name: training_all[name] for name in RUN_WIDE_TRAINING}, local_data=local_data,
        signature=signature,
    )
    if run.reference != str(manifest.ref):
        raise ManifestError(f"{origin}: run.reference {run.reference!r:.80} is not the reference of its "
                            f"owner_key ({manifest.ref})")
    return manifest


def load_manifest(text: str, origin: str = "manifest", ref: RunRef | None = None, *,
                  any_form: bool = False) -> Manifest:
    """Parse, verify the signature (and the run, if ``ref`` is given) and demand the canonical bytes.

    ``any_form`` skips the last check, for the owner's ``run update`` alone: it signs anew, and so
    rewrites a file of an older p2ptrain (keys in another order) in the canonical form.
    """
    manifest = parse_manifest(text, origin).verify(ref, origin)
    canonical = manifest.to_toml()
    if text != canonical and not any_form:
        raise ManifestError(f"{origin}: {_first_difference(text, canonical)} (a manifest is changed only with "
                            "p2ptrain run update, which re-signs it)")
    return manifest


def _first_difference(text: str, canonical: str) -> str:
    """Where ``text`` leaves the canonical bytes, as a user would look for it in an editor."""
    if text != canonical and sorted(text.split("\n")) == sorted(canonical.split("\n")):
        return ("has its keys in another order than the signed manifest's canonical form, which sorts them (a "
                "file written by an older p2ptrain: its owner rewrites it with p2ptrain run update FILE)")
    if text.count("\r\n") == canonical.count("\n") and text.replace("\r\n", "\n") == canonical:
        return "has Windows (CRLF) line endings where the signed manifest has LF ones; convert it back (dos2unix)"
    ours, theirs = text.split("\n"), canonical.split("\n")  # a stray \r stays visible in its line
    for number, (a, b) in enumerate(zip(ours, theirs, strict=False), 1):
        if a == b + "\r":
            return f"line {number} ends in a Windows (CRLF) line ending where the signed manifest has LF"
        if a != b:
            return f"line {number} differs from the signed manifest's canonical form"
    if len(ours) < len(theirs):
        return "ends before the signed manifest does (its last line, or the newline after it, is missing)"
    return f"has text after the signed manifest's last line ({len(theirs) - 1})"


def load_manifest_bytes(raw: bytes, origin: str = "manifest", ref: RunRef | None = None, *,
                        any_form: bool = False) -> Manifest:
    """:func:`load_manifest` on bytes (a file's or a DHT value's), bounded and UTF-8 checked first."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{origin}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{origin}: not UTF-8 text") from None
    return load_manifest(text, origin, ref, any_form=any_form)


def read_manifest_file(path: Path, ref: RunRef | None = None, *, any_form: bool = False) -> Manifest:
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
    return load_manifest_bytes(raw, f"manifest {path}", ref, any_form=any_form)


def is_data_url(data_path: str | None) -> bool:
    """Whether ``data_path`` names data at a URL, http(s) or an object store's (the same for every node),
    not a local path."""
    return data_path is not None and checks.is_data_url(data_path)


def data_problem(data_path: str | None, local_data: bool) -> str | None:
    """Why a manifest's data setting is not one a run can share, or None."""
    if data_path is not None and not is_data_url(data_path):
        return ("task.data_path: a run manifest names its data only by URL (http(s)://, s3://...); a local path is "
                f"each node's own (task.data_path in its config, with task.{LOCAL_DATA_KEY} = true here)")
    if data_path is not None and local_data:
        return f"task.{LOCAL_DATA_KEY}: cannot be true when task.data_path names the run's data"
    return None


@dataclass(frozen=True)
class RunSettings:
    """The manifest's share of a config's ``[task]`` and ``[training]``."""

    task: dict[str, Any]
    training: dict[str, Any]
    local_data: bool


def settings_from(task: TaskSection, training: TrainingSection) -> RunSettings:
    """The manifest's ``task`` and ``training`` values taken from config sections.

    Machine-local fields stay out; a local ``data_path`` becomes ``local_data`` (every node then names
    its own copy), a URL stays in.
    """
    problem = (non_finite({name: getattr(task, name) for name in RUN_WIDE_TASK}, "task")
               or non_finite({name: getattr(training, name) for name in RUN_WIDE_TRAINING}, "training"))
    if problem:  # JSON conversion would turn it into nothing, silently
        raise ManifestError(problem)
    task_all, training_all = task.model_dump(mode="json"), training.model_dump(mode="json")
    values = {name: task_all[name] for name in RUN_WIDE_TASK}
    local_data = values["data_path"] is not None and not is_data_url(values["data_path"])
    if local_data:
        values["data_path"] = None
    return RunSettings(values, {name: training_all[name] for name in RUN_WIDE_TRAINING}, local_data)


def new_manifest(key: OwnerKey, name: str, task: TaskSection, training: TrainingSection, *,
                 policy: Literal["open", "invite"] = "open", clock: float | None = None) -> Manifest:
    """Version 1 of a run, signed."""
    settings = settings_from(task, training)
    now = utc_now(clock)
    manifest = Manifest(name=key.ref(name).name, owner_key=key.public_key, version=1, created_at=now,
                        updated_at=now, task=settings.task, training=settings.training, policy=policy,
                        local_data=settings.local_data)
    return manifest.signed(key)

