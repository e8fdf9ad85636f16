"""The pure formatters behind every number the TUI shows."""

from __future__ import annotations

import pytest

from p2ptrain.status import StatusSnapshot
from p2ptrain.tui.widgets.format import (
    age,
    averaging_line,
    byte_count,
    cpu_line,
    duration,
    last_round_line,
    number,
    rounds_line,
    share,
    short_id,
    traffic_line,
)


@pytest.mark.parametrize("seconds, text", [(None, "—"), (-3, "0s"), (59.9, "59s"), (60, "1m 00s"),
                                           (3599, "59m 59s"), (7385, "2h 03m"), (90000, "1d 01h")])
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_other_formatters() -> None:
    assert byte_count(999) == "999 B" and byte_count(1_288_490_188) == "1.3 GB"
    assert byte_count(5 * 10**15) == "5000.0 TB"
    assert number(None) == "—" and number(float("nan")) == "nan" and number(12345.678, 2) == "12,345.68"
    assert age(None, 100.0) == "never" and age(40.0, 100.0) == "1m 00s ago"
    assert short_id("12D3KooWHk9ZjmCpZbB7rRWw") == "…ZbB7rRWw" and short_id("") == "—"
    assert short_id("abc") == "abc"


@pytest.mark.parametrize("part, total, text", [(40, 42, "95%"), (199, 200, "99%"), (1, 1000, "1%"), (0, 5, "0%"),
                                               (7, 7, "100%"), (1, 3, "33%"), (2, 3, "66%")])
def test_share_never_rounds_a_shortfall_to_all_or_a_few_to_none(part: int, total: int, text: str) -> None:
    assert share(part, total) == text


def test_averaging_lines() -> None:
    assert averaging_line(StatusSnapshot()) == "no rounds yet"
    assert last_round_line(StatusSnapshot()) == "none yet"
    status = StatusSnapshot(averaging_rounds_ok_total=37, averaging_rounds_partial_total=3,
                            averaging_rounds_failed_total=2, median_received_fraction=1.0, last_round_group_size=3,
                            last_round_peers_online=3, last_round_duration_seconds=0.5,
                            last_round_received_fraction=2 / 3)
    assert averaging_line(status) == "42 rounds · 88% full · median 100% received · group 3/3"
    assert rounds_line(status) == "37 full, 3 partial, 2 failed"
    assert last_round_line(status) == "0.50s · 67% received"
    # Unknown peers online, and a swarm view that lags behind the group.
    assert averaging_line(StatusSnapshot(averaging_rounds_ok_total=1, last_round_group_size=2)) == \
        "1 round · 100% full · group of 2"
    assert averaging_line(StatusSnapshot(averaging_rounds_ok_total=1, last_round_group_size=3,
                                         last_round_peers_online=2)).endswith("group 3/3")


def test_a_schema_1_node_is_not_credited_with_full_rounds() -> None:
    old = StatusSnapshot(schema_version=1, averaging_rounds_ok_total=40, averaging_rounds_failed_total=2,
                         last_round_group_size=2, last_round_duration_seconds=1.25)
    assert averaging_line(old) == "42 rounds · 95% completed · group of 2"
    assert rounds_line(old) == "40 completed, 2 failed"
    assert last_round_line(old) == "1.25s"


def test_traffic_line_adds_what_is_relayed_once_there_is_any() -> None:
    quiet = StatusSnapshot(bytes_sent_total=1_200_000, bytes_received_total=3_400_000, relay_active=True)
    assert traffic_line(quiet) == "↑ 1.2 MB  ↓ 3.4 MB"
    relaying = StatusSnapshot(bytes_sent_total=0, relay_bytes_total=5_600_000, relay_reservations=1)
    assert traffic_line(relaying) == "↑ 0 B  ↓ 0 B · relayed 5.6 MB, 1 slot held"
    assert traffic_line(StatusSnapshot(relay_reservations=2)).endswith("relayed 0 B, 2 slots held")


def test_cpu_line() -> None:
    assert cpu_line(StatusSnapshot()) == "use not measured · no limit"
    assert cpu_line(StatusSnapshot(cpu_used_percent=48.25, cpu_limit_percent=100.0)) == \
        "48.2% of the machine · no limit"
    assert cpu_line(StatusSnapshot(cpu_used_percent=12.0, cpu_limit_percent=12.5, cpu_idle_seconds_total=75)) == \
        "12.0% of the machine (limit 12.5%) · idled 1m 15s"
    assert cpu_line(StatusSnapshot(cpu_limit_percent=float("nan"))) == "use not measured · no limit"


def test_contribution_shares_round_but_never_to_zero_or_all() -> None:
    from p2ptrain.tui.widgets.contributors import part_share

    assert part_share(1, 1000) == "1%" and part_share(999, 1000) == "99%"
    assert part_share(0, 10) == "0%" and part_share(10, 10) == "100%"
    assert part_share(2, 3) == "67%" and part_share(5, 0) == "—"
