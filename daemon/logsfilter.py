"""Keeps hivemind's and asyncio's internal chatter out of the operator's log, and says how much was kept out.

hivemind logs normal swarm weather loudly: a tensor part that a vanished peer never sent is a
WARNING ("Reducer: received 33.3% of input tensors"), a round without a group is an ERROR with a
traceback, a connection cut mid-request is an asyncio ERROR ("Task was destroyed but it is
pending!").  p2ptrain already counts that weather and says it once, in its own words.  So
:class:`SwarmNoiseFilter`, attached to every handler the daemon installs, turns each record from
those loggers (and each Python warning raised in hivemind's code) into a DEBUG record (its
original level kept in :data:`DEMOTED_FROM`), which shows only when the node runs with
``--log-level debug``, tracebacks included.  What it hid is tallied, and every few minutes one
INFO line says so, naming the most frequent of the hidden errors::

    hivemind: 12 partial reductions (median 67% received), 30 warnings and 2 errors hidden in the
    last 5 min (--log-level debug shows them); errors: 2x "Averaging step failed: could not find a group"

A few of hivemind's records do need an operator (:data:`OPERATOR_CONDITIONS`, chosen from
hivemind 1.1.12's source): p2pd, the libp2p daemon, reporting a fatal error (hivemind passes Go's
FATAL/PANIC on at CRITICAL), and an averaging helper process found dead at shutdown.  Each is
still demoted like the rest, and also said in our own words at ERROR, without a traceback, once
per summary window.  (A p2pd that is killed outright, e.g. by the OOM killer, makes hivemind log
nothing of its own: its rounds and lookups just fail, which the node counts as swarm weather.)

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

import collections
import logging
import os
import re
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

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
#: Distinct hidden errors tallied per window (the rest count as errors, unnamed); names shown.
_MAX_ERROR_KINDS = 50
_NAMED_ERRORS = 2
_NAME_LENGTH = 60
#: What varies between records of one kind: peer IDs, object addresses, numbers.
_VARYING = re.compile(r"\b(?:12D3Koo|Qm)[1-9A-HJ-NP-Za-km-z]{20,}|0x[0-9a-fA-F]+|\d+(?:\.\d+)?")

_summary_logger = logging.getLogger("p2ptrain.swarmlog")
_filters: weakref.WeakSet[SwarmNoiseFilter] = weakref.WeakSet()


#: Fixed names: hivemind renames WARNING to "WARN" process-wide when it is imported.
_LEVEL_NAMES = ((logging.CRITICAL, "CRITICAL"), (logging.ERROR, "ERROR"), (logging.WARNING, "WARNING"),
                (logging.INFO, "INFO"))


def level_name(levelno: int) -> str:
    """The standard name of a level, whatever hivemind renamed it to."""
    return next((name for threshold, name in _LEVEL_NAMES if levelno >= threshold), "DEBUG")


@dataclass(frozen=True)
class OperatorCondition:
    """A hivemind record an operator must act on, and what to tell them."""

    kind: str
    matches: Callable[[logging.LogRecord], bool]
    says: str
    """The ERROR line; ``{message}`` is the record's own message."""


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a record whose message cannot even be turned into text
        return str(record.msg)


OPERATOR_CONDITIONS: tuple[OperatorCondition, ...] = (
    # hivemind/p2p/p2p_daemon.py passes p2pd's own (go-log) records on with a ``caller`` field,
    # DPANIC/PANIC/FATAL as CRITICAL: the daemon is going down, and the node's swarm with it.
    OperatorCondition(
        "p2pd_fatal",
        lambda r: r.name == "hivemind.p2p.p2p_daemon" and r.levelno >= logging.CRITICAL and hasattr(r, "caller"),
        "p2pd, the libp2p daemon this node reaches the swarm through, failed ({message}): the node cannot reach "
        "the swarm until it is restarted"),
    # hivemind/averaging/averager.py, shutdown(): the helper process was already gone, so every
    # round since it died failed.
    OperatorCondition(
        "averager_died",
        lambda r: r.name.startswith("hivemind.averaging") and "process is already not alive" in _message(r),
        "an averaging helper process had died before the node stopped (killed, or out of memory?): its rounds "
        "failed since; the journal or dmesg says why"),
)


def error_name(record: logging.LogRecord) -> str:
    """A short name for a kind of error: the first line of its message, with what varies between
    records of one kind (peer IDs, addresses, numbers) replaced by ``N``."""
    try:
        text = str(record.msg).strip() or type(record.msg).__name__
    except Exception:
        text = type(record.msg).__name__
    name = _VARYING.sub("N", text.splitlines()[0])
    return name if len(name) <= _NAME_LENGTH else name[:_NAME_LENGTH - 3] + "..."


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
        self._error_kinds: collections.Counter[str] = collections.Counter()
        self._said: set[str] = set()

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
            self._tell_operator(record)
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
                name = error_name(record)
                if name in self._error_kinds or len(self._error_kinds) < _MAX_ERROR_KINDS:
                    self._error_kinds[name] += 1
            else:
                self._warnings += 1
        self.flush_if_due()

    def _tell_operator(self, record: logging.LogRecord) -> None:
        """Say a condition of :data:`OPERATOR_CONDITIONS` at ERROR, once per summary window."""
        for condition in OPERATOR_CONDITIONS:
            try:
                matched = condition.matches(record)
            except Exception:  # a judge never raises into someone else's logging call
                matched = False
            if not matched:
                continue
            with self._lock:  # the tally that just counted the record opened the window
                said, self._said = condition.kind in self._said, self._said | {condition.kind}
            if not said:
                lines = _message(record).strip().splitlines()
                _summary_logger.error(condition.says.format(message=lines[0][:200] if lines else "no message"))
            return

    def flush(self) -> str | None:
        """Log (at INFO) and return the summary of what was hidden since the last one; None if nothing."""
        with self._lock:
            if self._window_start is None:
                return None
            elapsed = self._clock() - self._window_start
            partial, fractions, warnings, errors = self._partial, self._fractions, self._warnings, self._errors
            kinds = self._error_kinds
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
        if kinds:
            line += "; errors: " + ", ".join(f'{count}x "{name}"' for name, count in kinds.most_common(_NAMED_ERRORS))
        _summary_logger.info(line)
        return line


def _after_fork_in_child() -> None:
    for noise_filter in list(_filters):
        noise_filter.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
