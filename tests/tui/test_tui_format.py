"""The pure formatters behind every number the TUI shows."""

from __future__ import annotations

import pytest

from p2ptrain.tui.widgets.format import age, byte_count, duration, number, percent, short_id


@pytest.mark.parametrize("seconds, text", [(None, "—"), (-3, "0s"), (59.9, "59s"), (60, "1m 00s"),
                                           (3599, "59m 59s"), (7385, "2h 03m"), (90000, "1d 01h")])
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_other_formatters() -> None:
    assert byte_count(999) == "999 B" and byte_count(1_288_490_188) == "1.3 GB"
    assert byte_count(5 * 10**15) == "5000.0 TB"
    assert number(None) == "—" and number(float("nan")) == "nan" and number(12345.678, 2) == "12,345.68"
    assert percent(0, 0) == "no rounds yet" and percent(40, 2) == "95.2% ok (40/42)"
    assert age(None, 100.0) == "never" and age(40.0, 100.0) == "1m 00s ago"
    assert short_id("12D3KooWHk9ZjmCpZbB7rRWw") == "…ZbB7rRWw" and short_id("") == "—"
    assert short_id("abc") == "abc"
