"""The CPU share duty cycle on a simulated machine, the /proc process-tree reader, and one real busy loop."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from p2ptrain.daemon.cpushare import CpuShare, check_limit, default_cpu_source


class FakeMachine:
    """A clock and a CPU counter that advance together: steps burn CPU, waits only the background's."""

    def __init__(self, background_cores: float = 0.0) -> None:
        self.now = 1000.0
        self.cpu = 50.0
        self.background = background_cores
        self.waits: list[float] = []
        self.stop_after: int | None = None

    def clock(self) -> float:
        return self.now

    def cpu_seconds(self) -> float:
        return self.cpu

    def step(self, seconds: float, cores: float = 1.0) -> None:
        self.now += seconds
        self.cpu += seconds * (cores + self.background)

    def wait(self, seconds: float) -> bool:
        assert seconds > 0
        self.waits.append(seconds)
        self.now += seconds
        self.cpu += seconds * self.background
        return self.stop_after is not None and len(self.waits) >= self.stop_after

    def share(self, limit: float, cores: int = 2, **kwargs: float) -> CpuShare:
        return CpuShare(limit, cpu_seconds=self.cpu_seconds, clock=self.clock, wait=self.wait, cores=cores,
                        **kwargs)


def train(machine: FakeMachine, share: CpuShare, seconds: float, step: float = 0.1, cores: float = 1.0) -> int:
    """Run steps through the duty cycle for ``seconds`` of simulated time; returns steps taken."""
    end, steps = machine.now + seconds, 0
    while machine.now < end:
        if share.wait_for_budget():
            machine.step(step, cores)
            steps += 1
    return steps


@pytest.mark.parametrize("limit, cores, step, step_cores",
                         [(25.0, 2, 0.1, 1.0), (12.5, 2, 0.3, 1.0), (60.0, 4, 0.05, 3.0), (10.0, 1, 1.5, 1.0)])
def test_duty_cycle_holds_the_share_of_the_machine(limit: float, cores: int, step: float, step_cores: float) -> None:
    machine = FakeMachine()
    share = machine.share(limit, cores=cores)
    train(machine, share, 120.0, step=step, cores=step_cores)
    start_cpu, start = machine.cpu, machine.now
    train(machine, share, 60.0, step=step, cores=step_cores)
    measured = 100.0 * (machine.cpu - start_cpu) / (machine.now - start) / cores
    # The share is a percentage of all cores: a one-core step loop at 25% of 2 cores runs half the time.
    assert measured == pytest.approx(limit, abs=0.05 * limit + step * 100 / 60)
    figures = share.figures()
    assert figures.limit_percent == limit
    assert figures.used_percent == pytest.approx(limit, abs=0.1 * limit + step * 100 / 10)
    busy = limit * cores / 100 / step_cores  # the fraction of wall time a step runs
    assert figures.idle_seconds_total == pytest.approx(180.0 * (1 - busy), rel=0.05)
    assert max(machine.waits) <= share.max_wait + 1e-9


def test_any_window_holds_the_share_plus_one_step() -> None:
    machine = FakeMachine()
    share = machine.share(30.0, cores=2, window=10.0)
    train(machine, share, 30.0, step=0.2)
    for _ in range(200):
        if share.wait_for_budget():
            machine.step(0.2)
        used = share.figures().used_percent
        assert used is not None and used <= 30.0 + 100 * 0.2 / 10.0 / 2 + 1e-6


def test_background_work_counts_against_the_share() -> None:
    machine = FakeMachine(background_cores=0.2)
    share = machine.share(50.0, cores=1)
    train(machine, share, 100.0)
    start_cpu, start = machine.cpu, machine.now
    steps = train(machine, share, 50.0)
    assert 100.0 * (machine.cpu - start_cpu) / (machine.now - start) == pytest.approx(50.0, abs=2.0)
    assert steps == pytest.approx(50.0 * 0.3 / 0.1, rel=0.05)  # 0.3 of the core is left for training


@pytest.mark.parametrize("limit", [0.0, 100.0])
def test_no_limit_never_waits_but_still_measures(limit: float) -> None:
    machine = FakeMachine()
    share = machine.share(limit)
    assert not share.enabled
    train(machine, share, 30.0)
    assert machine.waits == []
    figures = share.figures()
    assert figures.limit_percent == 0.0 and figures.idle_seconds_total == 0.0
    assert figures.used_percent == pytest.approx(50.0)  # one busy core of two


def test_first_step_is_free_and_a_long_debt_is_paid_in_bounded_slices() -> None:
    machine = FakeMachine()
    share = machine.share(25.0, cores=1, max_wait=1.0)
    assert share.wait_for_budget() and machine.waits == []
    machine.step(5.0)  # one long step: 5 s of CPU need 20 s of wall time at a quarter core
    calls = 0
    while not share.wait_for_budget():
        calls += 1
        assert sum(machine.waits) <= calls * 1.0 + 1e-9  # the loop gets control back every second
    assert calls == 14 and sum(machine.waits) == pytest.approx(15.0)


def test_a_stop_ends_the_wait_at_once() -> None:
    machine = FakeMachine()
    machine.stop_after = 1
    share = machine.share(10.0, cores=1, max_wait=5.0)
    share.wait_for_budget()
    machine.step(2.0)
    assert share.wait_for_budget() is False
    assert len(machine.waits) == 1


def test_reload_changes_the_limit_and_starts_a_new_window() -> None:
    machine = FakeMachine()
    share = machine.share(0.0, cores=1)
    train(machine, share, 20.0)  # unlimited: a full core
    share.update(50.0)
    assert share.wait_for_budget()  # the time used before the limit is not paid back
    assert machine.waits == []
    train(machine, share, 60.0)
    assert share.figures().used_percent == pytest.approx(50.0, abs=2.0)
    share.update(100.0)
    assert not share.enabled and share.figures().limit_percent == 0.0


@pytest.mark.parametrize("bad", [-1.0, 100.5, float("nan"), float("inf")])
def test_bad_limits_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="CPU share must be a percentage from 0 to 100"):
        check_limit(bad)
    machine = FakeMachine()
    share = machine.share(20.0)
    with pytest.raises(ValueError, match="percentage from 0 to 100"):
        share.update(bad)
    assert share.limit_percent == 20.0


def test_bad_construction_is_refused() -> None:
    machine = FakeMachine()
    with pytest.raises(ValueError, match="cores must be at least 1"):
        machine.share(20.0, cores=0)
    with pytest.raises(ValueError, match="window and max_wait must be positive"):
        machine.share(20.0, window=0.0)


def test_background_alone_over_the_share_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    machine = FakeMachine(background_cores=0.3)
    share = machine.share(20.0, cores=1)
    with caplog.at_level(logging.INFO, logger="p2ptrain.daemon.cpushare"):
        steps = train(machine, share, 40.0)
        assert steps <= 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "work between training steps alone" in warnings[0].getMessage()
        assert "volunteer.max_cpu_percent=20" in warnings[0].getMessage()
        machine.background = 0.05
        # Swarm work put at most a window's worth of idling on the debt: training resumes soon.
        assert train(machine, share, 40.0) >= 40
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "training again within volunteer.max_cpu_percent=20"]


def test_source_going_backwards_restarts_the_window() -> None:
    machine = FakeMachine()
    share = machine.share(50.0, cores=1)
    train(machine, share, 20.0)
    machine.cpu -= 30.0
    assert share.wait_for_budget()
    assert share.figures().used_percent is None


# ---------------------------------------------------------------------------------- /proc reader

def test_default_source_reads_this_process() -> None:
    source = default_cpu_source()
    first = source()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert source() - first >= 0.1


def test_real_busy_loop_held_to_a_quarter_core() -> None:
    """The duty cycle on the real CPU-time source: a busy loop in 20 ms slices, 25% of one core.

    Time here is this process's CPU time plus the time idled (a virtual clock, the idling too), so
    a loaded machine changes how long the test takes, not what it measures: 0.3 s of CPU must come
    with about 0.9 s of idling.  Without the duty cycle the loop measures 100%.
    """
    idled = [0.0]

    def clock() -> float:
        return time.process_time() + idled[0]

    def idle(seconds: float) -> bool:
        idled[0] += seconds
        return False

    share = CpuShare(25.0, cpu_seconds=default_cpu_source(), clock=clock, wait=idle, cores=1, window=2.0)
    cpu_start, start = time.process_time(), clock()
    while time.process_time() - cpu_start < 0.3:
        if share.wait_for_budget():
            slice_end = time.process_time() + 0.02
            while time.process_time() < slice_end:
                pass
    cpu, span = time.process_time() - cpu_start, clock() - start
    used = 100.0 * cpu / span
    assert 20.0 <= used <= 30.0, f"a 25% share measured {used:.1f}% of a core ({cpu:.2f} s CPU, {idled[0]:.2f} s idled)"
    assert share.idle_seconds_total == pytest.approx(idled[0], abs=0.05)  # it also counts CPU spent meanwhile


# ---------------------------------------------------------------------------------- config

@pytest.mark.parametrize("toml_value, message", [
    ("-1", "greater than or equal to 0"),
    ("100.5", "less than or equal to 100"),
    ('"half"', "valid number"),
    ("nan", "finite number"),
    ("inf", "finite number"),
])
def test_max_cpu_percent_bad_values_name_the_field(tmp_path: Path, toml_value: str, message: str) -> None:
    from p2ptrain.config.schema import ConfigError, load_config

    path = tmp_path / "node.toml"
    path.write_text(f"[volunteer]\nmax_cpu_percent = {toml_value}\n")
    with pytest.raises(ConfigError, match=f"volunteer.max_cpu_percent: .*{message}") as caught:
        load_config(path, environ={})
    assert "\n" not in str(caught.value)


def test_max_cpu_percent_defaults_off_takes_env_and_reloads() -> None:
    from p2ptrain.config.schema import NodeConfig, parse_config
    from p2ptrain.daemon.reload import reloadable_changes

    assert NodeConfig().volunteer.max_cpu_percent == 0.0
    config = parse_config({}, "defaults", {"P2PTRAIN_VOLUNTEER__MAX_CPU_PERCENT": "12.5"})
    assert config.volunteer.max_cpu_percent == 12.5
    assert reloadable_changes(NodeConfig(), config) == (["volunteer.max_cpu_percent"], [])
