"""Volunteer policy: may the node train right now, or is it outside its time windows / is the machine busy?

Pure decisions over injected inputs: a wall clock (for time windows) and a load source (for
busy detection), so every rule is testable without waiting or loading a machine.  The node asks
:meth:`VolunteerPolicy.pause_reason` between steps; a manual pause is the node's own business.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING

from p2ptrain.config.windows import parse_window
from p2ptrain.status import PauseReason

if TYPE_CHECKING:
    from p2ptrain.config.schema import VolunteerSection

@dataclass(frozen=True)
class LoadSample:
    """One reading of the machine: ``None`` where the value is not known (yet)."""

    #: 1-minute load average per CPU core, less the node's own CPU share.
    other_load_per_core: float | None = None
    #: CPU use of every process except the node's own, in percent of the whole machine.
    other_cpu_percent: float | None = None


LoadSource = Callable[[], LoadSample]


class VolunteerPolicy:
    """Decides SCHEDULE / BUSY / NONE from config, clock and load, with hysteresis and a hold time."""

    def __init__(self, config: VolunteerSection, clock: Callable[[], float] = time.time,
                 load: LoadSource | None = None, tz: tzinfo | None = None) -> None:
        self._clock = clock
        self._load = load
        self._tz = tz  # None: the machine's local time, which is what volunteers write windows in
        self._busy = False
        self._busy_since = 0.0
        self._quiet_since: float | None = None
        self.update(config)

    def update(self, config: VolunteerSection) -> None:
        """Apply a reloaded ``[volunteer]`` section; an ongoing busy pause keeps its timers."""
        self.config = config
        self.windows = tuple(parse_window(text) for text in config.run_windows)

    @property
    def busy_detection(self) -> bool:
        enabled = self.config.busy_load_threshold > 0 or self.config.busy_cpu_percent > 0
        return self._load is not None and enabled

    def in_window(self, now: float | None = None) -> bool:
        if not self.windows:
            return True
        moment = datetime.fromtimestamp(self._clock() if now is None else now, self._tz)
        return any(window.contains(moment) for window in self.windows)

    def pause_reason(self) -> PauseReason:
        now = self._clock()
        if not self.in_window(now):
            return PauseReason.SCHEDULE
        if self.busy_detection and self._update_busy(now):
            return PauseReason.BUSY
        return PauseReason.NONE

    def _ratios(self, sample: LoadSample) -> list[float]:
        """Each enabled measure as a fraction of its threshold (>= 1 means busy)."""
        ratios = []
        if self.config.busy_load_threshold > 0 and sample.other_load_per_core is not None:
            ratios.append(sample.other_load_per_core / self.config.busy_load_threshold)
        if self.config.busy_cpu_percent > 0 and sample.other_cpu_percent is not None:
            ratios.append(sample.other_cpu_percent / self.config.busy_cpu_percent)
        return ratios

    def _update_busy(self, now: float) -> bool:
        assert self._load is not None
        ratios = self._ratios(self._load())
        if not ratios:
            return self._busy  # nothing measurable yet: keep the current decision
        if not self._busy:
            if max(ratios) >= 1.0:
                self._busy, self._busy_since, self._quiet_since = True, now, None
            return self._busy
        if max(ratios) >= self.config.busy_resume_ratio:
            self._quiet_since = None  # not quiet enough yet: hysteresis
            return True
        if self._quiet_since is None:
            self._quiet_since = now
        hold = self.config.busy_hold_seconds
        if now - self._busy_since >= hold and now - self._quiet_since >= hold:
            self._busy = False
        return self._busy

    def over_memory(self, rss_bytes: int) -> bool:
        """True when ``rss_bytes`` exceeds ``max_memory_mb`` (never when it is 0)."""
        limit = self.config.max_memory_mb
        return limit > 0 and rss_bytes > limit * 1024 * 1024


def own_rss_bytes() -> int | None:
    """Resident memory of this process from /proc/self/statm; None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _read_proc_stat() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


def _own_cpu_seconds() -> float:
    """CPU seconds of the node: its whole cgroup under systemd (helper processes included), else
    this process (all its threads)."""
    try:
        relative = Path("/proc/self/cgroup").read_text().strip().split("\n")[0].split("::", 1)[1]
        if relative.endswith(".service"):
            for line in Path("/sys/fs/cgroup", relative.lstrip("/"), "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        pass
    times = os.times()
    return times.user + times.system


class ProcLoadSource:
    """Reads /proc (Linux) at most every ``min_interval`` seconds; callers may poll it every step."""

    def __init__(self, min_interval: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._min_interval = min_interval
        self._clock = clock
        self._cores = os.cpu_count() or 1
        self._last_at: float | None = None
        self._last: tuple[float, float, float] | None = None
        self._sample = LoadSample()

    def __call__(self) -> LoadSample:
        now = self._clock()
        if self._last_at is not None and now - self._last_at < self._min_interval:
            return self._sample
        self._last_at = now
        try:
            busy, total = _read_proc_stat()
            own = _own_cpu_seconds()
            load = os.getloadavg()[0] / self._cores
        except OSError:
            return self._sample
        if self._last is not None and total > self._last[1]:
            span = total - self._last[1]
            own_share = max(0.0, own - self._last[2]) / span
            other = max(0.0, (busy - self._last[0]) / span - own_share)
            self._sample = LoadSample(max(0.0, load - own_share), min(100.0, 100.0 * other))
        self._last = (busy, total, own)
        return self._sample


def os_load_source() -> LoadSource | None:
    """The machine's load source, or None where /proc is missing (busy detection then stays off)."""
    return ProcLoadSource() if Path("/proc/stat").exists() else None
