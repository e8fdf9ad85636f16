"""The files of a run's directory, as ``p2ptrain run init`` writes them and every reader looks for them."""

from __future__ import annotations

from pathlib import Path

#: The owner's private key (mode 0600); commands that sign find it here unless ``--key`` says otherwise.
KEY_FILE = "owner.key"
#: The signed manifest.
MANIFEST_FILE = "manifest.toml"
#: The owner's node config: local matters, the run by reference and manifest.
NODE_FILE = "node.toml"


def manifest_path(path: Path) -> Path:
    """``path``, or the manifest inside it when it is a run's directory."""
    return path / MANIFEST_FILE if path.is_dir() and (path / MANIFEST_FILE).is_file() else path
