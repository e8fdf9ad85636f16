"""The one hivemind version our subclasses of its internals were written and tested against.

The hardened averager, reducer, state averager and progress tracker override private methods of
hivemind (named in each class's docstring).  Those methods change between releases without notice,
so each module that overrides one calls :func:`require_hivemind` at import: a different version
fails loudly at start-up instead of silently skipping a defence.
"""

from __future__ import annotations

import hivemind

HIVEMIND_VERSION = "1.1.12"


def require_hivemind(component: str) -> None:
    """Raise ImportError unless the installed hivemind is the pinned one."""
    found = getattr(hivemind, "__version__", "unknown")
    if found != HIVEMIND_VERSION:
        raise ImportError(
            f"{component} overrides hivemind {HIVEMIND_VERSION} internals but hivemind {found} is installed; "
            f"install hivemind=={HIVEMIND_VERSION}"
        )
