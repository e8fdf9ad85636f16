"""Whether a node is alive, ready, healthy: decided from its latest snapshot and the current time.

Three questions for three kinds of probe. ``liveness``: is the process's loop still turning (a
supervisor restarts it when not). ``readiness``: is it doing what it should, which includes being
paused on purpose by its owner's schedule or the machine's load (nothing to restart, nothing to
alarm). ``evaluate``: the older combined ``/healthz`` (training and progressing), kept for probes
that use it. Pure logic (no I/O, the clock is an argument) so the API, the TUI and tests agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2ptrain.status import LIVE_STATES, NodeState, PauseReason, StatusSnapshot

#: A snapshot older than this means the node loop itself is stuck (it publishes every ~0.5 s).
DEFAULT_MAX_SNAPSHOT_AGE = 30.0
#: A training node whose last completed step is older than this is not making progress.
DEFAULT_MAX_PROGRESS_AGE = 300.0


@dataclass(frozen=True)
class Health:
    healthy: bool
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"healthy": self.healthy, "reason": self.reason}


def progress_age(status: StatusSnapshot, now: float) -> float | None:
    """Seconds since the last completed local step as of ``now``; None before the first step.

    ``seconds_since_progress`` was measured when the snapshot was taken, so the snapshot's own
    age is added: a frozen loop keeps publishing nothing and its progress age keeps growing.
    """
    if status.seconds_since_progress is None:
        return None
    return status.seconds_since_progress + max(0.0, now - status.taken_at)


def evaluate(
    status: StatusSnapshot,
    now: float,
    *,
    max_snapshot_age: float = DEFAULT_MAX_SNAPSHOT_AGE,
    max_progress_age: float = DEFAULT_MAX_PROGRESS_AGE,
) -> Health:
    """Healthy iff the snapshot is fresh, the state is live and, when training, steps keep coming.

    STARTING/JOINING/SYNCING need only a fresh snapshot (joining and state downloads take a while
    and make no steps).  TRAINING before its first step gets ``max_progress_age`` of grace,
    counted from the node's start.
    """
    if status.taken_at <= 0:
        return Health(False, "the node has not published a status yet")
    snapshot_age = now - status.taken_at
    if snapshot_age > max_snapshot_age:
        return Health(False, f"status not refreshed for {snapshot_age:.0f} s (node loop stuck?)")
    if status.state not in LIVE_STATES:
        reason = f"state is {status.state}"
        if status.pause_reason:
            reason += f" ({status.pause_reason})"
        return Health(False, reason)
    if status.state != NodeState.TRAINING:
        return Health(True, f"state is {status.state}")
    age = progress_age(status, now)
    if age is None:
        since_start = now - status.started_at if status.started_at > 0 else status.uptime_seconds
        if since_start > max_progress_age:
            return Health(False, f"no training step completed in {since_start:.0f} s since start")
        return Health(True, "training, waiting for the first step")
    if age > max_progress_age:
        return Health(False, f"no training progress for {age:.0f} s")
    return Health(True, f"training, last step {age:.1f} s ago")


def liveness(status: StatusSnapshot, now: float, *, max_snapshot_age: float = DEFAULT_MAX_SNAPSHOT_AGE) -> Health:
    """Alive iff the node loop published a status recently, whatever its state: paused, syncing and
    even failed-but-reporting nodes are alive (restarting them helps nothing); a loop that stopped
    publishing is stuck.  Before the first status the process is starting, and alive."""
    if status.taken_at <= 0:
        return Health(True, "starting: no status published yet")
    snapshot_age = now - status.taken_at
    if snapshot_age > max_snapshot_age:
        return Health(False, f"status not refreshed for {snapshot_age:.0f} s (node loop stuck?)")
    return Health(True, f"state is {status.state}")


def readiness(status: StatusSnapshot, now: float, *, max_snapshot_age: float = DEFAULT_MAX_SNAPSHOT_AGE,
              max_progress_age: float = DEFAULT_MAX_PROGRESS_AGE) -> Health:
    """Ready iff training and progressing, or paused on purpose (the reason says which); joining,
    syncing, stopping or stuck nodes are not ready."""
    if status.state == NodeState.PAUSED and status.pause_reason != PauseReason.NONE:
        alive = liveness(status, now, max_snapshot_age=max_snapshot_age)
        return alive if not alive.healthy else Health(True, f"paused on purpose ({status.pause_reason})")
    if status.state != NodeState.TRAINING:
        alive = liveness(status, now, max_snapshot_age=max_snapshot_age)
        return alive if not alive.healthy else Health(False, f"state is {status.state}")
    return evaluate(status, now, max_snapshot_age=max_snapshot_age, max_progress_age=max_progress_age)
