"""Where a node keeps its state.

Standard library only, so that ``p2ptrain top`` (which must not load pydantic, torch or hivemind)
finds a node by exactly the rules the node itself uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def resolve_state_dir(configured: Path | str | None, environ: Mapping[str, str]) -> Path:
    """``node.state_dir`` if set, then systemd's ``$STATE_DIRECTORY``, then XDG's state home.

    Raises RuntimeError when nothing is configured and there is no home directory to fall back on.
    """
    if configured:
        return Path(configured).expanduser()
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0])
    xdg = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "p2ptrain"
