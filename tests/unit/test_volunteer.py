"""Volunteer policy: time windows, busy machine with hysteresis and hold time, [volunteer] validation."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from p2ptrain.config.schema import ConfigError, VolunteerSection, parse_config
from p2ptrain.config.windows import parse_window
from p2ptrain.daemon.volunteer import LoadSample, ProcLoadSource, VolunteerPolicy
from p2ptrain.status import PauseReason
from tests.support.clock import ManualClock


def at(text: str) -> float:
    """A UTC instant; 2024-01-01 is a Monday."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()




class Load:
    def __init__(self) -> None:
        self.sample = LoadSample()
        self.calls = 0

    def __call__(self) -> LoadSample:
        self.calls += 1
        return self.sample


def policy(clock: ManualClock, load: Load | None = None, **fields: object) -> VolunteerPolicy:
    return VolunteerPolicy(VolunteerSection.model_validate(fields), clock=clock, load=load, tz=UTC)


@pytest.mark.parametrize(("moment", "inside"), [
    ("2024-01-01 21:59", False), ("2024-01-01 22:00", True), ("2024-01-01 23:59", True),
    ("2024-01-02 00:00", True), ("2024-01-02 06:59", True), ("2024-01-02 07:00", False),
    ("2024-01-02 12:00", False),
])
def test_window_across_midnight(moment: str, inside: bool) -> None:
    clock = ManualClock(at(moment))
    expected = PauseReason.NONE if inside else PauseReason.SCHEDULE
    assert policy(clock, run_windows=["22:00-07:00"]).pause_reason() is expected


@pytest.mark.parametrize(("moment", "inside"), [
    ("2024-01-05 23:00", True),   # Friday evening: the window starts on Friday
    ("2024-01-06 06:00", True),   # Saturday morning: still Friday's window
    ("2024-01-06 23:00", False),  # Saturday evening: no window starts on Saturday
    ("2024-01-01 06:00", False),  # Monday morning: Sunday started no window
    ("2024-01-01 22:30", True),   # Monday evening
])
def test_weekday_window_belongs_to_its_start_day(moment: str, inside: bool) -> None:
    assert policy(ManualClock(at(moment)), run_windows=["Mon-Fri 22:00-07:00"]).in_window() is inside


def test_several_windows_and_whole_days() -> None:
    clock = ManualClock(at("2024-01-06 13:00"))  # Saturday
    p = policy(clock, run_windows=["Mon-Fri 19:00-08:00", "Sat,Sun 00:00-24:00"])
    assert p.pause_reason() is PauseReason.NONE
    clock.now = at("2024-01-03 13:00")  # Wednesday afternoon
    assert p.pause_reason() is PauseReason.SCHEDULE
    assert policy(clock).pause_reason() is PauseReason.NONE  # no windows: always


def test_day_ranges_wrap_and_full_names() -> None:
    assert parse_window("Fri-Mon 10:00-11:00").days == frozenset({4, 5, 6, 0})
    assert parse_window("saturday,Sun 10:00-11:00").days == frozenset({5, 6})
    assert parse_window("10:00-11:00").days == frozenset(range(7))


@pytest.mark.parametrize(("text", "message"), [
    ("22-07", "must look like 'HH:MM-HH:MM'"),
    ("25:00-07:00", "not a time of day"),
    ("22:60-07:00", "not a time of day"),
    ("24:00-07:00", "not a time of day"),
    ("08:00-08:00", "is empty"),
    ("Mun 08:00-09:00", "unknown day 'mun'"),
    ("Mon-Fry 08:00-09:00", "unknown day 'mon-fry'"),
])
def test_bad_windows_are_config_errors_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="volunteer.run_windows") as info:
        parse_config({"volunteer": {"run_windows": [text]}}, "node.toml")
    assert message in str(info.value)
    assert str(info.value).startswith("node.toml: volunteer.run_windows: ")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("busy_load_threshold", -1, "greater than or equal to 0"),
    ("busy_cpu_percent", 101, "less than or equal to 100"),
    ("busy_resume_ratio", 0, "greater than 0"),
    ("busy_resume_ratio", 1.5, "less than or equal to 1"),
    ("busy_hold_seconds", -5, "greater than or equal to 0"),
    ("max_memory_mb", -1, "greater than or equal to 0"),
    ("upload_kbps", -1, "greater than or equal to 0"),
    ("download_kbps", "fast", "valid integer"),
    ("cpu_threads", 2, "unknown key"),
])
def test_volunteer_field_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"volunteer.{field}: .*{message}"):
        parse_config({"volunteer": {field: value}}, "node.toml")


def test_volunteer_env_override() -> None:
    config = parse_config({}, "defaults", {"P2PTRAIN_VOLUNTEER__RUN_WINDOWS": '["22:00-07:00"]',
                                           "P2PTRAIN_VOLUNTEER__BUSY_CPU_PERCENT": "30"})
    assert config.volunteer.run_windows == ["22:00-07:00"]
    assert config.volunteer.busy_cpu_percent == 30


def test_busy_cpu_pauses_with_hysteresis_and_hold() -> None:
    clock, load = ManualClock(at("2024-01-01 12:00")), Load()
    p = policy(clock, load, busy_cpu_percent=40, busy_resume_ratio=0.5, busy_hold_seconds=60)
    load.sample = LoadSample(other_cpu_percent=10)
    assert p.pause_reason() is PauseReason.NONE
    load.sample = LoadSample(other_cpu_percent=45)
    assert p.pause_reason() is PauseReason.BUSY
    # Below the threshold but above threshold * ratio (20 %): still busy, however long it lasts.
    load.sample = LoadSample(other_cpu_percent=30)
    clock.now += 600
    assert p.pause_reason() is PauseReason.BUSY
    # Quiet now, but it must stay quiet for the hold time before training resumes.
    load.sample = LoadSample(other_cpu_percent=5)
    assert p.pause_reason() is PauseReason.BUSY
    clock.now += 59
    assert p.pause_reason() is PauseReason.BUSY
    load.sample = LoadSample(other_cpu_percent=25)  # a spike resets the quiet timer
    clock.now += 1
    assert p.pause_reason() is PauseReason.BUSY
    load.sample = LoadSample(other_cpu_percent=5)
    assert p.pause_reason() is PauseReason.BUSY
    clock.now += 60
    assert p.pause_reason() is PauseReason.NONE


def test_busy_pause_lasts_at_least_the_hold_time() -> None:
    clock, load = ManualClock(at("2024-01-01 12:00")), Load()
    p = policy(clock, load, busy_load_threshold=0.5, busy_hold_seconds=120)
    load.sample = LoadSample(other_load_per_core=0.9)
    assert p.pause_reason() is PauseReason.BUSY
    load.sample = LoadSample(other_load_per_core=0.0)
    assert p.pause_reason() is PauseReason.BUSY
    clock.now += 119
    assert p.pause_reason() is PauseReason.BUSY
    clock.now += 1
    assert p.pause_reason() is PauseReason.NONE


def test_unknown_load_keeps_decision_and_disabled_detection_reads_nothing() -> None:
    clock, load = ManualClock(at("2024-01-01 12:00")), Load()
    assert policy(clock, load).pause_reason() is PauseReason.NONE
    assert load.calls == 0  # both thresholds 0: busy detection is off
    p = policy(clock, load, busy_cpu_percent=10)
    assert p.pause_reason() is PauseReason.NONE  # first sample has no CPU figure yet
    load.sample = LoadSample(other_cpu_percent=50)
    assert p.pause_reason() is PauseReason.BUSY
    load.sample = LoadSample()
    clock.now += 10_000
    assert p.pause_reason() is PauseReason.BUSY


def test_schedule_wins_over_busy_and_reload_applies() -> None:
    clock, load = ManualClock(at("2024-01-01 12:00")), Load()
    load.sample = LoadSample(other_cpu_percent=90)
    p = policy(clock, load, run_windows=["22:00-07:00"], busy_cpu_percent=50)
    assert p.pause_reason() is PauseReason.SCHEDULE
    assert load.calls == 0
    p.update(VolunteerSection(run_windows=[], busy_cpu_percent=50))
    assert p.pause_reason() is PauseReason.BUSY
    p.update(VolunteerSection())
    assert p.pause_reason() is PauseReason.NONE


def test_memory_limit() -> None:
    p = policy(ManualClock(0.0), max_memory_mb=100)
    assert not p.over_memory(100 * 1024 * 1024)
    assert p.over_memory(100 * 1024 * 1024 + 1)
    assert not policy(ManualClock(0.0)).over_memory(10**12)


def test_proc_load_source_reads_this_machine() -> None:
    if not __import__("os").path.exists("/proc/stat"):
        pytest.skip("needs Linux /proc")
    clock = ManualClock(0.0)
    source = ProcLoadSource(min_interval=5.0, clock=clock)
    first = source()
    assert first.other_cpu_percent is None  # a CPU share needs two readings
    # Burn our own CPU between readings, long enough for the kernel's tick counters to move (a fixed
    # count of operations could end within one tick on a fast or lightly loaded machine).
    burn_until = time.perf_counter() + 0.1
    while time.perf_counter() < burn_until:
        pass
    clock.now = 5.0
    second = source()
    assert second.other_cpu_percent is not None and 0.0 <= second.other_cpu_percent <= 100.0
    assert second.other_load_per_core is not None and second.other_load_per_core >= 0.0
    clock.now = 6.0
    assert source() is second  # within min_interval: cached, /proc is not re-read
