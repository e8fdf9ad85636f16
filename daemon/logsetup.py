"""Logging configuration for the daemon's entry point: journald-aware format, levels, hivemind's handler.

Under systemd, stderr is connected to the journal and ``$JOURNAL_STREAM`` names that stream's
``device:inode``; lines then start with a ``<N>`` syslog priority (so ``journalctl -p warning``
works) and carry no timestamp (journald adds its own).  Anywhere else: a human format with
timestamps.  ``json`` (for log shippers): one JSON object per line with ``time``, ``level``, ``logger``,
``message`` and any structured fields a record carries (``extra=``), a traceback as ``exception``.
hivemind installs its own coloured handler on the ``hivemind`` logger and stops
propagation; we switch it to ``"nowhere"`` so hivemind's records flow through our one handler.
There, :class:`~p2ptrain.daemon.logsfilter.SwarmNoiseFilter` turns hivemind's and asyncio's records into
DEBUG records (shown with ``--log-level debug``) and logs a periodic count of what it hid.  Forked
helper processes (hivemind's DHT and averagers) inherit all of this at fork time.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from p2ptrain.daemon.logsfilter import DEMOTED_FROM, SwarmNoiseFilter, level_name

LogFormat = Literal["auto", "human", "journal", "json"]

#: Loggers whose level follows ``node.log_level``; everything else stays at WARNING.
OWN_LOGGERS = ("p2ptrain", "__main__")
#: sd-daemon(3) priorities.
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}
#: Marks the handler this module installed, so a second call replaces it instead of adding another.
_OWNED = "_p2ptrain_owned"
#: The one noise filter of this process, shared by every handler installed here.
_NOISE = SwarmNoiseFilter()


def noise_filter() -> SwarmNoiseFilter:
    """The filter that hides hivemind's and asyncio's internals (e.g. to flush its summary now)."""
    return _NOISE


def _message(record: logging.LogRecord) -> str:
    """The record's text; a record demoted from hivemind/asyncio says what level it came with."""
    demoted = getattr(record, DEMOTED_FROM, None)
    return f"({demoted}) {record.getMessage()}" if demoted else record.getMessage()


def _priority(levelno: int) -> int:
    for threshold, priority in sorted(_PRIORITY.items(), reverse=True):
        if levelno >= threshold:
            return priority
    return 7


class JournalFormatter(logging.Formatter):
    """``<N>logger: message``; every line of a multi-line record (a traceback) gets the prefix,
    because journald turns each line of a stream into its own entry."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.name}: {_message(record)}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        prefix = f"<{_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.splitlines() or [""])


class HumanFormatter(logging.Formatter):
    """``2024-05-01 12:00:00.123 WARNING p2ptrain.swarm.dht: message`` for terminals and files."""

    def __init__(self) -> None:
        super().__init__(datefmt="%Y-%m-%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        stamp = f"{self.formatTime(record, self.datefmt)}.{int(record.msecs):03d}"
        text = f"{stamp} {level_name(record.levelno):<7} {record.name}: {_message(record)}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


#: A LogRecord's own attributes; anything else on a record is a structured field someone attached.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                                      "taskName", DEMOTED_FROM}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (RFC 3339, UTC), ``level``, ``logger``,
    ``message``, the record's structured fields, ``demoted_from`` and ``exception`` when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        entry: dict[str, Any] = {
            "time": stamp.replace("+00:00", "Z"),
            "level": level_name(record.levelno), "logger": record.name, "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_") and key not in entry:
                entry[key] = value
        demoted = getattr(record, DEMOTED_FROM, None)
        if demoted:
            entry["demoted_from"] = demoted
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def stream_is_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """True when ``stream`` is the journal stream systemd connected (``$JOURNAL_STREAM=dev:ino``)."""
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        info = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no real file behind it (a test's StringIO)
        return False
    return info.st_dev == int(device) and info.st_ino == int(inode)


def quiet_hivemind_handler() -> bool:
    """Route hivemind's records through the root logger instead of its own stderr handler.

    Imports hivemind (which the daemon loads anyway); False when it is not installed.
    """
    try:
        from hivemind.utils.logging import use_hivemind_log_handler
    except ImportError:
        return False
    use_hivemind_log_handler("nowhere")
    return True


def set_log_level(level: str) -> None:
    """Apply ``node.log_level`` (also on SIGHUP): ours at ``level``; hivemind's and asyncio's records
    only at DEBUG (and then all of hivemind's, down to its own DEBUG)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(numeric)
    # WARNING, not higher: hivemind's warnings and errors still reach the filter, which counts them.
    logging.getLogger("hivemind").setLevel(logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING)
    _NOISE.set_level(numeric)


def configure_logging(
    level: str,
    fmt: LogFormat = "auto",
    extra_handlers: Iterable[logging.Handler] = (),
    environ: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
    *,
    tame_hivemind: bool = True,
) -> logging.Handler:
    """Install the one stderr handler (plus ``extra_handlers``, e.g. the LogRing) on the root logger.

    Safe to call again: the previous handler from this function is replaced, extra handlers are
    not added twice.  Returns the stream handler.
    """
    environ = os.environ if environ is None else environ
    stream = sys.stderr if stream is None else stream
    if tame_hivemind:
        quiet_hivemind_handler()
    journal = fmt == "journal" or (fmt == "auto" and stream_is_journal(stream, environ))
    handler = logging.StreamHandler(stream)
    formatter: logging.Formatter = (JsonFormatter() if fmt == "json"
                                    else JournalFormatter() if journal else HumanFormatter())
    handler.setFormatter(formatter)
    handler.addFilter(_NOISE)
    setattr(handler, _OWNED, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OWNED, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    for extra in extra_handlers:
        if _NOISE not in extra.filters:
            extra.addFilter(_NOISE)
        if extra not in root.handlers:
            root.addHandler(extra)
    # Third-party libraries stay at WARNING; our own loggers and hivemind's are set explicitly.
    root.setLevel(logging.WARNING)
    set_log_level(level)
    logging.captureWarnings(True)
    _NOISE.start_summaries()
    return handler
