"""Health verdicts from a snapshot and an injected clock."""

from __future__ import annotations

import pytest

from p2ptrain.health import evaluate, liveness, progress_age, readiness
from p2ptrain.status import NodeState, StatusSnapshot

NOW = 1_000_000.0


def snap(state: NodeState, *, taken_ago: float = 0.5, progress: float | None = 1.0, **kw) -> StatusSnapshot:
    return StatusSnapshot(state=state.value, taken_at=NOW - taken_ago, seconds_since_progress=progress,
                          started_at=NOW - 1000, **kw)


@pytest.mark.parametrize("state", [NodeState.STARTING, NodeState.JOINING, NodeState.SYNCING])
def test_early_states_healthy_without_steps_while_snapshot_fresh(state):
    assert evaluate(snap(state, progress=None), NOW).healthy
    verdict = evaluate(snap(state, progress=None, taken_ago=31), NOW)
    assert not verdict.healthy and "not refreshed for 31 s" in verdict.reason


def test_training_needs_recent_progress_counting_the_snapshot_age():
    assert evaluate(snap(NodeState.TRAINING, progress=5.0), NOW).healthy
    stale = evaluate(snap(NodeState.TRAINING, progress=290.0, taken_ago=20.0), NOW)
    assert not stale.healthy and stale.reason == "no training progress for 310 s"
    assert evaluate(snap(NodeState.TRAINING, progress=290.0, taken_ago=20.0), NOW,
                    max_progress_age=400).healthy
    assert progress_age(snap(NodeState.TRAINING, progress=2.0, taken_ago=3.0), NOW) == pytest.approx(5.0)
    assert progress_age(snap(NodeState.TRAINING, progress=None), NOW) is None


def test_training_before_first_step_gets_grace_from_start():
    fresh = StatusSnapshot(state="training", taken_at=NOW, started_at=NOW - 10)
    assert evaluate(fresh, NOW).healthy
    late = StatusSnapshot(state="training", taken_at=NOW, started_at=NOW - 400)
    verdict = evaluate(late, NOW)
    assert not verdict.healthy and "no training step completed in 400 s" in verdict.reason


@pytest.mark.parametrize("state", [NodeState.PAUSED, NodeState.STOPPING, NodeState.STOPPED, NodeState.FAILED])
def test_non_live_states_unhealthy_with_reason(state):
    verdict = evaluate(snap(state, pause_reason="manual" if state is NodeState.PAUSED else ""), NOW)
    assert not verdict.healthy
    assert verdict.reason.startswith(f"state is {state.value}")
    if state is NodeState.PAUSED:
        assert verdict.reason == "state is paused (manual)"


def test_no_snapshot_yet_is_unhealthy():
    verdict = evaluate(StatusSnapshot(), NOW)
    assert not verdict.healthy and "not published" in verdict.reason
    assert verdict.to_dict() == {"healthy": False, "reason": verdict.reason}


def test_liveness_is_a_turning_loop_whatever_the_state():
    assert liveness(StatusSnapshot(), NOW).healthy  # starting: nothing published yet
    for state in NodeState:
        assert liveness(snap(state), NOW).healthy, state
        assert not liveness(snap(state, taken_ago=31), NOW).healthy, state


def test_readiness_counts_a_purposeful_pause_and_nothing_before_training():
    assert readiness(snap(NodeState.TRAINING), NOW).healthy
    assert not readiness(snap(NodeState.TRAINING, progress=400.0), NOW).healthy
    paused = readiness(snap(NodeState.PAUSED, pause_reason="schedule"), NOW)
    assert paused.healthy and paused.reason == "paused on purpose (schedule)"
    assert not readiness(snap(NodeState.PAUSED, pause_reason="schedule", taken_ago=31), NOW).healthy
    for state in (NodeState.STARTING, NodeState.JOINING, NodeState.SYNCING, NodeState.STOPPING):
        verdict = readiness(snap(state), NOW)
        assert not verdict.healthy and verdict.reason == f"state is {state}"
