"""How a command fails: the configuration error, the one line a failure is shown as, and every exit code.

Kept apart from :mod:`p2ptrain.config.schema` (which needs pydantic) so that the CLI's front door can
catch :class:`ConfigError` without paying for pydantic's import on every command (``p2ptrain top``
must start fast).  :mod:`p2ptrain.config.schema` re-exports ``ConfigError`` and ``EX_CONFIG``.

Every exit code of the CLI and the daemon is named here, once: sysexits.h's codes as :mod:`os`
has them, and the few that sysexits.h has no name for.

=====  ==================  ==========================================================================
code   name                used for
=====  ==================  ==========================================================================
0      ``EX_OK``           done as asked (a node: a clean stop)
1      ``EX_FAILURE``      failed for a reason none of the others name (the swarm could not be joined,
                           a node refused a control request, a file could not be written)
2      ``EX_BAD_ARGUMENT`` a command-line value out of range, checked after parsing (as argparse exits)
64     ``EX_USAGE``        a command used wrongly (``service install`` with a bad instance name,
                           ``service uninstall`` with nothing installed)
65     ``EX_DATAERR``      a model file or run manifest refused as data: task code not trusted, too many
                           parameters
66     ``EX_NOINPUT``      the ``--config`` file cannot be read
69     ``EX_UNAVAILABLE``  nothing answers (a node's API; the swarm, for ``p2ptrain fetch``), or a command
                           needs an extra this install lacks (``p2ptrain top``: ``p2ptrain[tui]``)
73     ``EX_CANTCREAT``    an output file cannot be created
75     ``EX_TEMPFAIL``     try again later: another node holds the state directory, or a new manifest
                           version needs a restart (systemd restarts the node)
77     ``EX_NOPERM``       no readable API token, or the node refused it
78     ``EX_CONFIG``       bad configuration: ``RestartPreventExitStatus=78`` stops a restart loop
130    ``EX_INTERRUPTED``  stopped by SIGINT (Ctrl-C) before done, as a shell reports it
141    ``EX_BROKEN_PIPE``  the reader of stdout went away (``| head``), as a shell reports SIGPIPE
=====  ==================  ==========================================================================
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

EX_OK = os.EX_OK
#: A failure sysexits.h has no code for: the command ran and did not get what it was asked for.
EX_FAILURE = 1
#: What argparse exits with for bad arguments; values it cannot check (a range) exit the same way.
EX_BAD_ARGUMENT = 2
EX_USAGE = os.EX_USAGE
EX_DATAERR = os.EX_DATAERR
EX_NOINPUT = os.EX_NOINPUT
EX_UNAVAILABLE = os.EX_UNAVAILABLE
EX_CANTCREAT = os.EX_CANTCREAT
EX_TEMPFAIL = os.EX_TEMPFAIL
EX_NOPERM = os.EX_NOPERM
#: ``RestartPreventExitStatus=78`` stops a restart loop on bad config.
EX_CONFIG = os.EX_CONFIG


def killed_by(signum: int) -> int:
    """The exit code a shell reports for a process ended by signal ``signum`` (128 + its number)."""
    return 128 + int(signum)


EX_INTERRUPTED = killed_by(signal.SIGINT)
EX_BROKEN_PIPE = killed_by(signal.SIGPIPE)


def printable(value: object) -> str:
    """``value`` as it goes into a one-line message: as it is when every character is printable,
    else quoted as Python's repr does, with newlines, escape sequences and other control characters
    spelled out.  User-provided text (a file name, a TOML key, an environment variable's name)
    goes through this wherever a message embeds it, so an error stays the one line the CLI prints
    and cannot paint on the terminal."""
    text = str(value)
    return text if text.isprintable() else repr(text)


class ConfigError(Exception):
    """A configuration problem, already phrased as the one line the user should see.

    ``problems`` holds every problem found, one line each (``config check`` lists them all); the
    message itself stays one line: the first problem and how many more."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) or (message,)


def error_line(error: BaseException) -> str:
    """The line a failed command or node prints on stderr: the same prefix wherever it ends."""
    label = "config error: " if isinstance(error, ConfigError) else ""
    return f"p2ptrain: {label}{error}"
