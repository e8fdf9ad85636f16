"""The newest manifest version a node has accepted, kept in its state directory.

A node that restarts must never go back to an older version of its run's manifest (one that
lifted a ban, say, or an outdated ``--manifest`` file): the tracker of a running node refuses
them, and this file carries that memory across restarts. It holds the whole signed manifest, so
a restarted node can also take the run's settings from it before it joins the swarm. It is
written atomically (temp file, fsync, rename) and only ever replaced by a newer version; a file
that does not verify for the run is ignored with one warning, never trusted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from p2ptrain.atomicfile import write_atomic
from p2ptrain.errors import ConfigError
from p2ptrain.run.manifest import Manifest, read_manifest_file
from p2ptrain.runref import RunRef

logger = logging.getLogger(__name__)


def stored_manifest_path(state_dir: Path, ref: RunRef) -> Path:
    """One file per run, so a state directory reused for another run keeps each run's memory."""
    return state_dir / f"{ref.run_id}.manifest.toml"


class ManifestStore:
    """Reads and (only forward) writes the newest accepted manifest of ``ref`` in ``state_dir``."""

    def __init__(self, state_dir: Path, ref: RunRef) -> None:
        self.path = stored_manifest_path(state_dir, ref)
        self.ref = ref
        self._saved_version = 0

    def load(self) -> Manifest | None:
        """The stored manifest, or None when there is none (or it does not verify: one warning)."""
        if not self.path.exists():
            return None
        try:
            manifest = read_manifest_file(self.path, self.ref)
        except ConfigError as error:
            logger.warning("ignoring the stored manifest of run %s: %s", self.ref, error)
            return None
        self._saved_version = max(self._saved_version, manifest.version)
        return manifest

    def save(self, manifest: Manifest) -> bool:
        """Keep ``manifest`` if it is newer than what is stored; True when written. A disk error is
        one warning: the running node still refuses older versions, only a restart would not."""
        if manifest.version <= self._saved_version:
            return False
        stored = self.load() if self._saved_version == 0 else None
        if stored is not None and stored.version >= manifest.version:
            return False
        try:
            write_atomic(self.path, manifest.to_toml().encode("utf-8"), mode=0o600)
        except OSError as exc:
            logger.warning("could not keep manifest version %d of run %s in %s: %s", manifest.version, self.ref,
                           self.path, exc.strerror or exc)
            return False
        self._saved_version = manifest.version
        return True

