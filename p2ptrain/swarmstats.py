"""Counters about averaging rounds and state downloads, safe to write from two threads.

Who writes what: with ``training.overlap`` (the default) hivemind finishes a gradient round on a
background thread of its own, and the DiLoCo averager's rounds land from the training thread; the
state downloads run on the training thread.  Readers (the snapshot the node publishes twice a
second) must never see a round half-recorded (a duration counted in the histogram but not in the
totals), so every write and every read goes through one lock, and readers get an immutable
:class:`SwarmStatsView` taken under it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from p2ptrain.status import ROUND_DURATION_BUCKETS


@dataclass(frozen=True)
class SwarmStatsView:
    """One consistent reading of :class:`SwarmStats`."""

    rounds_ok: int = 0
    rounds_failed: int = 0
    last_round_duration: float | None = None
    last_group_size: int = 0
    round_bucket_counts: tuple[int, ...] = (0,) * (len(ROUND_DURATION_BUCKETS) + 1)
    round_duration_sum: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    state_downloads: int = 0
    state_downloads_failed: int = 0
    state_download_seconds: float = 0.0
    state_download_progress: float | None = None


@dataclass
class SwarmStats:
    """The live counters behind :class:`SwarmStatsView`; every method takes the lock."""

    _view: SwarmStatsView = field(default_factory=SwarmStatsView)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self) -> SwarmStatsView:
        with self._lock:
            return self._view

    def record_round(self, ok: bool, duration: float, group_size: int, payload_bytes: int) -> None:
        """One finished (or abandoned) averaging round.

        Traffic is estimated from the payload and the group size: a butterfly all-reduce makes each
        peer send and receive (n-1)/n of the tensors, twice (reduce-scatter, then all-gather).
        """
        index = next((i for i, bound in enumerate(ROUND_DURATION_BUCKETS) if duration <= bound),
                     len(ROUND_DURATION_BUCKETS))
        with self._lock:
            old = self._view
            buckets = list(old.round_bucket_counts)
            buckets[index] += 1
            moved = int(2 * payload_bytes * (group_size - 1) / max(group_size, 1)) if ok else 0
            self._view = replace(
                old,
                rounds_ok=old.rounds_ok + ok,
                rounds_failed=old.rounds_failed + (not ok),
                last_group_size=group_size if ok else old.last_group_size,
                last_round_duration=duration,
                round_duration_sum=old.round_duration_sum + duration,
                round_bucket_counts=tuple(buckets),
                bytes_sent=old.bytes_sent + moved,
                bytes_received=old.bytes_received + moved,
            )

    def download_started(self) -> None:
        with self._lock:
            self._view = replace(self._view, state_download_progress=0.0)

    def download_finished(self, ok: bool, seconds: float) -> None:
        with self._lock:
            old = self._view
            self._view = replace(
                old,
                state_downloads=old.state_downloads + ok,
                state_downloads_failed=old.state_downloads_failed + (not ok),
                state_download_seconds=old.state_download_seconds + (seconds if ok else 0.0),
                state_download_progress=None,
            )
