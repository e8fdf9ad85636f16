"""The configuration error, its exit code and the one line both are shown as, with no dependencies.

Kept apart from :mod:`p2ptrain.config` (which needs pydantic) so that the CLI's front door can
catch :class:`ConfigError` without paying for pydantic's import on every command (``p2ptrain top``
must start fast).  :mod:`p2ptrain.config` re-exports both names.
"""

from __future__ import annotations

#: sysexits.h EX_CONFIG: ``RestartPreventExitStatus=78`` stops a restart loop on bad config.
EX_CONFIG = 78


class ConfigError(Exception):
    """A configuration problem, already phrased as the one line the user should see."""


def error_line(error: BaseException) -> str:
    """The line a failed command or node prints on stderr: the same prefix wherever it ends."""
    label = "config error: " if isinstance(error, ConfigError) else ""
    return f"p2ptrain: {label}{error}"
