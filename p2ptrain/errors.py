"""The configuration error, its exit code and the one line both are shown as, with no dependencies.

Kept apart from :mod:`p2ptrain.config.schema` (which needs pydantic) so that the CLI's front door can
catch :class:`ConfigError` without paying for pydantic's import on every command (``p2ptrain top``
must start fast).  :mod:`p2ptrain.config.schema` re-exports both names.
"""

from __future__ import annotations

#: sysexits.h EX_CONFIG: ``RestartPreventExitStatus=78`` stops a restart loop on bad config.
EX_CONFIG = 78


def printable(value: object) -> str:
    """``value`` as it goes into a one-line message: as it is when every character is printable,
    else quoted as Python's repr does, with newlines, escape sequences and other control characters
    spelled out.  User-provided text (a file name, a TOML key, an environment variable's name)
    goes through this wherever a message embeds it, so an error stays the one line the CLI prints
    and cannot paint on the terminal."""
    text = str(value)
    return text if text.isprintable() else repr(text)


class ConfigError(Exception):
    """A configuration problem, already phrased as the one line the user should see."""


def error_line(error: BaseException) -> str:
    """The line a failed command or node prints on stderr: the same prefix wherever it ends."""
    label = "config error: " if isinstance(error, ConfigError) else ""
    return f"p2ptrain: {label}{error}"
