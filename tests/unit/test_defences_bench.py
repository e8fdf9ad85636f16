"""The peer-checks benchmark's arithmetic: the cost per mode from alternating on/off runs."""

from __future__ import annotations

import pytest

from benchmarks.defences import parse_args, summarize


def _run(mode: str, checks: str, index: int, rate: float) -> dict[str, object]:
    return {"mode": mode, "checks": checks, "run": index, "seq_per_s": rate}


def test_cost_is_one_minus_on_over_off_per_mode_with_each_pair() -> None:
    runs = [_run("gradient", "on", 0, 57.0), _run("gradient", "off", 0, 60.0),
            _run("gradient", "on", 1, 59.0), _run("gradient", "off", 1, 58.0),
            _run("diloco", "on", 0, 70.0), _run("diloco", "off", 0, 70.0)]
    summary = summarize(runs)
    assert list(summary) == ["gradient", "diloco"]
    gradient = summary["gradient"]
    assert gradient["on_seq_per_s"] == pytest.approx(58.0) and gradient["off_seq_per_s"] == pytest.approx(59.0)
    assert gradient["cost"] == pytest.approx(1 - 58.0 / 59.0)
    assert gradient["pair_ratios"] == pytest.approx([57.0 / 60.0, 59.0 / 58.0])
    assert summary["diloco"]["cost"] == pytest.approx(0.0)


def test_a_mode_without_both_variants_or_without_training_is_an_error() -> None:
    with pytest.raises(ValueError, match="diloco: runs of both variants"):
        summarize([_run("diloco", "on", 0, 70.0)])
    with pytest.raises(RuntimeError, match="checks off trained nothing"):
        summarize([_run("gradient", "on", 0, 1.0), _run("gradient", "off", 0, 0.0)])


def test_modes_are_checked() -> None:
    assert parse_args(["--modes", "diloco"]).modes == ("diloco",)
    with pytest.raises(SystemExit):
        parse_args(["--modes", "gradient,ddp"])
    with pytest.raises(SystemExit):
        parse_args(["--peers", "1"])
