"""Keeps hivemind's and asyncio's internal chatter out of the operator's log, and says how much was kept out.

hivemind logs normal swarm weather loudly: a tensor part that a vanished peer never sent is a
WARNING ("Reducer: received 33.3% of input tensors"), a round without a group is an ERROR with a
traceback, a connection cut mid-request is an asyncio ERROR ("Task was destroyed but it is
pending!").  p2ptrain already counts that weather and says it once, in its own words.  So
:class:`SwarmNoiseFilter`, attached to every handler the daemon installs, turns each record from
those loggers (and each Python warning raised in hivemind's code) into a DEBUG record (its
original level kept in :data:`DEMOTED_FROM`), which shows only when the node runs with
``--log-level debug``, tracebacks included.  What it hid is tallied, and every few minutes one
INFO line says so::

    hivemind: 12 partial reductions (median 67% received), 30 warnings and 2 errors hidden in the
    last 5 min (--log-level debug shows them)

hivemind runs much of its work in forked helper processes (DHT, averagers) that inherit the
logging setup, this filter included; each process tallies and reports its own records (a child
starts with an empty tally).

The filter never starts a thread: it runs wherever a record is logged, and that includes the
interpreter's last moments (asyncio reports a dying event loop from a garbage collection during
shutdown), when a thread that is started never runs and ``Thread.start`` waits for it for good.
A window that is due is reported by the next hidden record, and the daemon's one summary thread
(:meth:`SwarmNoiseFilter.start_summaries`, started at set-up) reports it when the swarm goes quiet.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import threading
import time
import weakref
from collections.abc import Callable

#: Loggers whose records are internals: theirs, not ours, to shout about.
NOISY_LOGGERS = ("hivemind", "asyncio")
#: A demoted record's original level name, for the formatters and for tests.
DEMOTED_FROM = "p2ptrain_demoted_from"
SUMMARY_EVERY = 300.0
#: Received fractions kept per summary window for its median (a bounded sample).
_MAX_FRACTIONS = 1000
_PARTIAL = re.compile(r"Reducer: received (\d+(?:\.\d+)?)% of input tensors")
#: Set on a record once judged, so the second handler neither re-counts nor re-judges it.
_VERDICT = "_p2ptrain_noise_verdict"

_summary_logger = logging.getLogger("p2ptrain.swarmlog")
_filters: weakref.WeakSet[SwarmNoiseFilter] = weakref.WeakSet()


#: Fixed names: hivemind renames WARNING to "WARN" process-wide when it is imported.
_LEVEL_NAMES = ((logging.CRITICAL, "CRITICAL"), (logging.ERROR, "ERROR"), (logging.WARNING, "WARNING"),
                (logging.INFO, "INFO"))


def level_name(levelno: int) -> str:
    """The standard name of a level, whatever hivemind renamed it to."""
    return next((name for threshold, name in _LEVEL_NAMES if levelno >= threshold), "DEBUG")


def is_noisy(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in NOISY_LOGGERS)


def _is_hivemind_warning(record: logging.LogRecord) -> bool:
    """A Python warning raised inside hivemind's own code (``logging.captureWarnings`` routes it to
    ``py.warnings`` with the file name first), e.g. its scheduler call order in torch's eyes."""
    if record.name != "py.warnings":
        return False
    try:
        text = record.getMessage()
    except Exception:
        return False
    return f"{os.sep}hivemind{os.sep}" in text.split(":", 1)[0]


class SwarmNoiseFilter(logging.Filter):
    """Demotes hivemind/asyncio records to DEBUG, passes them only at ``level`` DEBUG, and tallies them.

    A summary covers a window of ``every`` seconds from the first hidden record; ``clock`` is
    monotonic time for the window's length.
    """

    def __init__(self, level: int = logging.INFO, *, every: float = SUMMARY_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.level = level
        self.every = every
        self._clock = clock
        self._summaries: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reset_tally()
        _filters.add(self)

    def _reset_tally(self) -> None:
        self._window_start: float | None = None
        self._fractions: list[float] = []
        self._partial = 0
        self._warnings = 0
        self._errors = 0

    def after_fork(self) -> None:
        """In a new child: its lock may have been held by another thread, and the parent's tally is
        the parent's to report."""
        self._lock = threading.Lock()
        self._reset_tally()

    def start_summaries(self) -> None:
        """Start this process's one summary thread (idempotent): it reports a due window even when
        no further record arrives.  Called at set-up, never from :meth:`filter`."""
        if self._summaries is not None and self._summaries.is_alive():
            return
        self._summaries = threading.Thread(target=self._report_due_windows, name="p2ptrain-log-summary",
                                           daemon=True)
        self._summaries.start()

    def _report_due_windows(self) -> None:
        while True:
            time.sleep(min(self.every, 30.0))
            self.flush_if_due()

    def flush_if_due(self) -> str | None:
        """:meth:`flush` when the current window is ``every`` seconds old; None otherwise."""
        with self._lock:
            due = self._window_start is not None and self._clock() - self._window_start >= self.every
        return self.flush() if due else None

    def set_level(self, level: int) -> None:
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = getattr(record, _VERDICT, None)
        if verdict is None:
            verdict = self._judge(record)
            setattr(record, _VERDICT, verdict)
        return bool(verdict)

    def _judge(self, record: logging.LogRecord) -> bool:
        if not (is_noisy(record.name) or _is_hivemind_warning(record)):
            return True
        if record.levelno > logging.DEBUG:
            self._tally(record)
            setattr(record, DEMOTED_FROM, level_name(record.levelno))
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.level <= logging.DEBUG

    def _tally(self, record: logging.LogRecord) -> None:
        try:
            match = _PARTIAL.search(str(record.msg))
        except Exception:  # a record whose message cannot even be turned into text is still counted
            match = None
        with self._lock:
            if self._window_start is None:
                self._window_start = self._clock()
            if match:
                self._partial += 1
                if len(self._fractions) < _MAX_FRACTIONS:
                    self._fractions.append(float(match.group(1)) / 100.0)
            elif record.levelno >= logging.ERROR:
                self._errors += 1
            else:
                self._warnings += 1
        self.flush_if_due()

    def flush(self) -> str | None:
        """Log (at INFO) and return the summary of what was hidden since the last one; None if nothing."""
        with self._lock:
            if self._window_start is None:
                return None
            elapsed = self._clock() - self._window_start
            partial, fractions, warnings, errors = self._partial, self._fractions, self._warnings, self._errors
            self._reset_tally()
        parts = []
        if partial:
            parts.append(f"{partial} partial reduction{'s' if partial != 1 else ''} "
                         f"(median {statistics.median(fractions):.0%} received)")
        if warnings:
            parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
        if errors:
            parts.append(f"{errors} error{'s' if errors != 1 else ''}")
        listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        line = (f"hivemind: {listed} hidden in the last {max(1, round(elapsed / 60))} min "
                "(--log-level debug shows them)")
        _summary_logger.info(line)
        return line


def _after_fork_in_child() -> None:
    for noise_filter in list(_filters):
        noise_filter.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
