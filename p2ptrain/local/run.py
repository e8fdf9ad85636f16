"""A throwaway owned run for nodes on this machine: an owner key, a signed manifest, invites.

The demo and the tests use it to show the one-line join for real: the run's settings (loopback
timings included) go into the manifest, each node's config keeps only local matters, and
volunteers start with ``--join ADDR --run REF``. The owner key is written beside the manifest,
mode 0600, like ``p2ptrain run init`` does; it owns nothing but this run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from p2ptrain.atomicfile import write_atomic
from p2ptrain.config.schema import NodeConfig
from p2ptrain.local.swarm import LOOPBACK_TRAINING
from p2ptrain.model.fingerprint import choose_fingerprint
from p2ptrain.run.invite import issue_invite
from p2ptrain.run.layout import KEY_FILE, MANIFEST_FILE
from p2ptrain.run.manifest import LOCAL_TRAINING, Manifest, new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.run.runconfig import local_data_path, run_wide
from p2ptrain.runref import RunRef


@dataclass
class LocalRun:
    """An owned run created on this machine."""

    directory: Path
    key: OwnerKey
    manifest: Manifest

    @property
    def ref(self) -> RunRef:
        return self.manifest.ref

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST_FILE

    def invite(self, peer_id: str, days: float = 1.0) -> str:
        return issue_invite(self.key, self.ref, peer_id, days)

    def update(self, **changes: Any) -> Manifest:
        """The next manifest version with ``changes`` (e.g. ``training={...}``, ``revoked=(...)``), signed
        and written over the manifest file (what ``p2ptrain run update`` does)."""
        manifest = dataclasses.replace(self.manifest, version=self.manifest.version + 1, **changes).signed(self.key)
        write_atomic(self.manifest_path, manifest.to_toml().encode("utf-8"))
        self.manifest = manifest
        return manifest


def create_local_run(directory: Path, name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
                     policy: Literal["open", "invite"] = "open", fingerprint: str = "auto") -> LocalRun:
    """A new run: loopback-tuned run-wide settings plus ``overrides`` (their local parts are ignored).

    ``fingerprint``: ``auto`` records the model's fingerprint (builds the model once), ``none`` does not,
    or 16 hex characters to record (``p2ptrain run init --fingerprint``).
    """
    wide = run_wide(overrides or {})
    training = {k: v for k, v in LOOPBACK_TRAINING.items() if k not in LOCAL_TRAINING} | wide["training"]
    local_data = local_data_path(overrides or {})  # the manifest then says each node brings its own
    task = wide["task"] | ({"data_path": local_data} if local_data is not None else {})
    config = NodeConfig.model_validate({"task": task, "training": training})
    recorded = choose_fingerprint(fingerprint, config)
    key = OwnerKey.generate()
    manifest = new_manifest(key, name, config.task, config.training, policy=policy)
    if recorded is not None:
        manifest = dataclasses.replace(manifest, fingerprint=recorded).signed(key)
    directory.mkdir(parents=True, exist_ok=True)
    key.save(directory / KEY_FILE)
    write_atomic(directory / MANIFEST_FILE, manifest.to_toml().encode("utf-8"))
    return LocalRun(directory, key, manifest)
