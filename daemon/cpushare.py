"""Holds the node's CPU use to a share of the machine with a duty cycle around training steps.

This is BOINC's "use at most N% of CPU time" for p2ptrain (``volunteer.max_cpu_percent``).  The
share is a percentage of the whole machine, that is of every CPU core the node may run on: 25 on
a 4-core machine is one core's worth, 50 on a 2-core machine is one core, 100 (or 0) is no limit.
That is what a desktop's system monitor shows as the node's "% CPU", and it matches
``volunteer.busy_cpu_percent``.  To hold a node to a quarter of ONE core, write ``25 / cores``.

What is held to the share is the node's own process (all its threads): the training.  Like BOINC,
which throttles the science application and not its own client, the swarm's helper processes
(hivemind's DHT and averager processes, the p2p daemon) are not counted: a duty cycle can only hold
back training steps, and counting work it cannot slow would starve training whenever the swarm is
busy (a peer's DHT process and p2p daemon are busiest while its partner looks for a group and nearly
idle otherwise: docs/benchmarks.md).  For a hard cap on everything use systemd's ``CPUQuota=``.  Every CPU second
the process uses is a debt that idling pays back at the share's rate, and unused time earns no credit; so
before each step the node asks :meth:`CpuShare.wait_for_budget`, which idles (through the node's
stop-aware wait, a bounded slice at a time) until the debt is paid.  The use over any window is
then at most the share plus one step, and exactly the share in the long run while training is
busy.  Everything is injected (CPU-time source, clock, wait), so the rule is unit-testable, and a
test or benchmark can make any process a slow peer with it.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: Cumulative CPU seconds of what the share holds back (never decreasing).
CpuSource = Callable[[], float]
#: Sleeps up to the given seconds; True when a stop was requested meanwhile (``Stopper.wait``).
WaitFunction = Callable[[float], bool]

#: Seconds of history the shown use is measured over, and the most idling that swarm work (not a
#: step) can put on the debt: long enough to average several steps and averaging rounds.
DEFAULT_WINDOW = 10.0
#: Longest single idle slice, so the node's loop still answers control requests and feeds the
#: systemd watchdog while it holds back.
DEFAULT_MAX_WAIT = 1.0
#: Debts shorter than this are forgiven: sleeping a few microseconds costs more than it saves.
_MIN_IDLE = 0.001
#: Without a limit the use is still measured (for status), but not on every step.
_MEASURE_EVERY_UNLIMITED = 1.0


def machine_cores() -> int:
    """CPU cores this process may run on (its affinity mask), which 100% stands for."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def process_cpu() -> float:
    """CPU seconds of this process, every thread included: the training step and its threads."""
    return time.process_time()


def default_cpu_source() -> CpuSource:
    """What the share holds back: the node's own process (see the module docstring for why the
    swarm's helper processes are not counted)."""
    return process_cpu


def check_limit(limit_percent: float) -> float:
    """The limit as given, or ValueError naming what is wrong (config validates it first)."""
    if not math.isfinite(limit_percent) or not 0 <= limit_percent <= 100:
        raise ValueError(f"CPU share must be a percentage from 0 to 100, got {limit_percent!r}")
    return float(limit_percent)


@dataclass(frozen=True)
class CpuShareFigures:
    """What status, metrics and the TUI show about the CPU share."""

    #: The limit in percent of the machine; 0 when there is none (0 and 100 both mean none).
    limit_percent: float
    #: The node process's CPU use over the window, percent of the machine; None before two samples.
    used_percent: float | None
    #: Seconds spent idling to hold the share, since the node started.
    idle_seconds_total: float


class CpuShare:
    """Decides before each step how long to idle so the node process stays at or under its share.

    ``cores`` is what 100% stands for (default: :func:`machine_cores`); a test that wants "25% of
    one core" on any machine passes ``cores=1``.  Not thread-safe: the node's loop owns it (a
    SIGHUP reload reaches it through that loop too).
    """

    def __init__(self, limit_percent: float, *, cpu_seconds: CpuSource, clock: Callable[[], float] = time.monotonic,
                 wait: WaitFunction, cores: int | None = None, window: float = DEFAULT_WINDOW,
                 max_wait: float = DEFAULT_MAX_WAIT) -> None:
        if window <= 0 or max_wait <= 0:
            raise ValueError("window and max_wait must be positive")
        self._cpu_seconds = cpu_seconds
        self._clock = clock
        self._wait = wait
        self.cores = cores if cores is not None else machine_cores()
        if self.cores < 1:
            raise ValueError(f"cores must be at least 1, got {self.cores}")
        self.window = window
        self.max_wait = max_wait
        #: (monotonic time, process CPU seconds, seconds idled so far), oldest first: the shown use.
        self._samples: collections.deque[tuple[float, float, float]] = collections.deque()
        #: CPU seconds owed (<= 0), and how deep the debt may go (the last step's, or one window).
        self._balance = 0.0
        self._floor = 0.0
        self.idle_seconds_total = 0.0
        self._starved = False
        self.limit_percent = 0.0
        self.update(limit_percent)

    @property
    def enabled(self) -> bool:
        return 0 < self.limit_percent < 100

    @property
    def _allowed_cores(self) -> float:
        return self.limit_percent / 100.0 * self.cores

    def update(self, limit_percent: float) -> None:
        """Apply a (reloaded) limit.  A changed limit starts afresh: time used under the old limit
        is not paid back under the new one."""
        limit = check_limit(limit_percent)
        if limit != self.limit_percent:
            self._samples.clear()
            self._balance = 0.0
        self.limit_percent = limit

    def _sample(self, after_step: bool) -> tuple[float, float]:
        """Read the clock and the process's CPU, charge what was used since the last reading."""
        now, cpu = self._clock(), self._cpu_seconds()
        if self._samples and cpu < self._samples[-1][1]:
            self._samples.clear()  # the source went backwards (it was replaced): measure afresh
            self._balance = 0.0
        if self._samples and self.enabled:
            last_time, last_cpu, _ = self._samples[-1]
            allowed = self._allowed_cores
            balance = min(0.0, self._balance + (now - last_time) * allowed - (cpu - last_cpu))
            if after_step:  # a step's debt is paid in full; swarm work adds at most a window's worth
                self._floor = min(balance, -allowed * self.window)
            self._balance = max(balance, self._floor)
        self._samples.append((now, cpu, self.idle_seconds_total))
        # Keep exactly one sample at or before the window's start, as the baseline.
        while len(self._samples) >= 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()
        return now, cpu

    def wait_for_budget(self) -> bool:
        """Call between training steps.  True: step now.  False: still over the share after idling
        ``max_wait`` seconds, or a stop was requested; run the loop's other work and ask again."""
        if not self.enabled:
            if not self._samples or self._clock() - self._samples[-1][0] >= _MEASURE_EVERY_UNLIMITED:
                self._sample(after_step=False)
            return True
        began = self._clock()
        after_step = True
        while True:
            now, cpu = self._sample(after_step)
            after_step = False
            owed = -self._balance / self._allowed_cores
            if owed < _MIN_IDLE:
                self._note_starved(False)
                return True
            left = self.max_wait - (now - began)
            if left < _MIN_IDLE:
                self._note_starved(self._background_alone_over(now, cpu))
                return False
            stop = self._wait(min(owed, left))
            self.idle_seconds_total += max(0.0, self._clock() - now)
            if stop:
                return False

    def _background_alone_over(self, now: float, cpu: float) -> bool:
        """True when the node idled for nearly the whole window and is still over its share."""
        start, _, idle_start = self._samples[0]
        span = now - start
        idled = self.idle_seconds_total - idle_start
        used = self._used_percent(now, cpu)
        return (span >= 0.9 * self.window and idled >= 0.9 * span and used is not None
                and used > 1.05 * self.limit_percent)

    def _note_starved(self, starved: bool) -> None:
        if starved and not self._starved:
            logger.warning("the node's work between training steps alone uses %.0f%% of the machine, above "
                           "volunteer.max_cpu_percent=%g: training steps are held back; raise the limit",
                           self._used_percent(*self._samples[-1][:2]) or 0.0, self.limit_percent)
        elif self._starved and not starved:
            logger.info("training again within volunteer.max_cpu_percent=%g", self.limit_percent)
        self._starved = starved

    def _used_percent(self, now: float, cpu: float) -> float | None:
        start, start_cpu, _ = self._samples[0]
        if now - start <= 0:
            return None
        return 100.0 * (cpu - start_cpu) / (now - start) / self.cores

    def figures(self) -> CpuShareFigures:
        used = self._used_percent(*self._samples[-1][:2]) if self._samples else None
        return CpuShareFigures(limit_percent=self.limit_percent if self.enabled else 0.0,
                               used_percent=used, idle_seconds_total=self.idle_seconds_total)
