"""Manifest updates: what changed between two versions, whether a running node may apply it, and
which version a node holds (never an older one again).

A change is *live* when a running node can apply it without rebuilding anything: training
settings (learning rate and schedule, weight decay, clipping, the target batch size, how often
state is averaged) at its next epoch boundary, bans and revocations as soon as it holds the new
version (its keeper updates the admission gate then); it *needs a restart* when the model, the
task, the mode or anything baked into the optimizer when it was built changes, which includes
the matchmaking window and the averaging timeout: hivemind's averagers run in forked processes
that took them (and request timeouts derived from them) at build time. The node decides what to
do with a restart change (stop with one line and let the service manager start it again with the
new manifest).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from p2ptrain.errors import ConfigError
from p2ptrain.run.manifest import Manifest
from p2ptrain.runref import RunRef

#: [training] fields a running node applies at an epoch boundary (not ``batch_size``: the micro-batch
#: shape is built into the node's data stream; not ``matchmaking_time`` or ``averaging_timeout``:
#: the averagers' processes hold them, and a window shorter than a request timeout fixed at build
#: can bring back the matchmaking deadlock p2ptrain.optim.build works around).
LIVE_TRAINING = frozenset({
    "target_batch_size", "lr", "weight_decay", "warmup_epochs", "total_epochs", "max_grad_norm",
    "average_state_every",
    "seed",  # only shapes a model's initialisation: nothing to do for a node that is already training
})
#: Fields of the manifest's other parts that are live (metadata, and who may take part).
LIVE_OTHER = frozenset({"run.updated_at", "admission.banned", "admission.revoked"})


@dataclass(frozen=True)
class FieldChange:
    field: str
    old: Any
    new: Any
    live: bool

    @property
    def when(self) -> str:
        """How a running node takes the change up, in words (``p2ptrain run update`` prints it)."""
        if not self.live:
            return "nodes restart to apply it"
        if self.field.startswith("training."):
            return "applied live at an epoch boundary"
        return "applied as soon as a node has this version"


@dataclass(frozen=True)
class ManifestChange:
    """The differences from one manifest version to the next."""

    old_version: int
    new_version: int
    changes: tuple[FieldChange, ...]

    @property
    def live(self) -> bool:
        """True when a running node can apply every change without a restart."""
        return all(change.live for change in self.changes)

    @property
    def fields(self) -> list[str]:
        return [change.field for change in self.changes]

    @property
    def restart_fields(self) -> list[str]:
        return [change.field for change in self.changes if not change.live]

    def describe(self) -> str:
        """One line for the log: the changed fields, the restart ones marked."""
        if not self.changes:
            return f"manifest version {self.old_version} -> {self.new_version}: no setting changed"
        parts = [f"{c.field} {c.old!r} -> {c.new!r}" + ("" if c.live else " (needs a restart)")
                 for c in self.changes]
        return f"manifest version {self.old_version} -> {self.new_version}: " + ", ".join(parts)


def _flatten(manifest: Manifest) -> dict[str, Any]:
    sections = manifest.sections()
    flat: dict[str, Any] = {}
    for section in ("run", "admission", "task", "training"):
        for name, value in sections[section].items():
            flat[f"{section}.{name}"] = value
    return flat


def _is_live(field: str, old: Any, new: Any) -> bool:
    section, _, name = field.partition(".")
    if section == "training":
        return name in LIVE_TRAINING
    if field == "run.fingerprint":
        return old is None  # first recorded: each node compares it with its own model
    return field in LIVE_OTHER


def classify(old: Manifest, new: Manifest) -> ManifestChange:
    """Every field that differs between ``old`` and ``new`` (version and signature aside)."""
    before, after = _flatten(old), _flatten(new)
    changes = []
    for field in sorted(set(before) | set(after)):
        if field == "run.version":
            continue
        if before.get(field) != after.get(field):
            old_value, new_value = before.get(field), after.get(field)
            changes.append(FieldChange(field, old_value, new_value, _is_live(field, old_value, new_value)))
    return ManifestChange(old.version, new.version, tuple(changes))


@dataclass(frozen=True)
class Offer:
    """What :meth:`ManifestTracker.offer` did with a manifest."""

    accepted: bool
    reason: str
    change: ManifestChange | None = None


class ManifestTracker:
    """Holds the newest verified manifest of one run; thread-safe."""

    def __init__(self, ref: RunRef, current: Manifest | None = None) -> None:
        self.ref = ref
        self._lock = threading.Lock()
        self._current: Manifest | None = None
        self.ignored_total = 0
        if current is not None:
            result = self.offer(current)
            if not result.accepted:
                raise ConfigError(result.reason)

    @property
    def current(self) -> Manifest | None:
        with self._lock:
            return self._current

    def offer(self, manifest: Manifest) -> Offer:
        """Accept ``manifest`` if it verifies for the run and is newer than the one held."""
        try:
            manifest.verify(self.ref, f"manifest version {manifest.version}")
        except ConfigError as error:
            return self._ignore(str(error))
        with self._lock:
            current = self._current
            if current is not None and manifest.version <= current.version:
                self.ignored_total += manifest.version < current.version or manifest != current
                return Offer(False, f"manifest version {manifest.version} is not newer than the current "
                                    f"version {current.version}")
            self._current = manifest
        if current is None:
            return Offer(True, f"manifest version {manifest.version} of run {self.ref}")
        change = classify(current, manifest)
        return Offer(True, change.describe(), change)

    def _ignore(self, reason: str) -> Offer:
        with self._lock:
            self.ignored_total += 1
        return Offer(False, reason)
