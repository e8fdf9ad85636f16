"""Test files ordered longest first, from the seconds each took in a recorded run (``--longest-first``).

xdist hands out whole files (``--dist loadfile``) in collection order, by default reordered by their
number of tests, and a phase lasts until its last file ends: a file of half a minute handed out near
the end (the type check has two tests) keeps one process busy while the other idles.  Started first,
the long files overlap the others and the short ones fill the gaps (``--no-loadscope-reorder`` keeps this
order).  Only the order depends on the recorded seconds; a file missing from the record keeps its
place after the recorded ones.  ``pytest --store-durations ...`` merges the seconds of the files it
ran into the record.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

#: File path (as in a test's node ID) -> seconds of its tests' set-up, call and tear-down.
RECORD = Path(__file__).parents[1] / "durations.json"


def file_of(nodeid: str) -> str:
    return nodeid.partition("::")[0]


def recorded(path: Path = RECORD) -> dict[str, float]:
    """The record, or nothing when it is missing or unreadable (the order is a help, never a failure)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {name: float(seconds) for name, seconds in data.items()
            if isinstance(name, str) and isinstance(seconds, (int, float))}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort in place by the file's recorded seconds, longest first; a stable sort keeps each file's
    tests together and in their own order."""
    items.sort(key=lambda item: -seconds.get(file_of(item.nodeid), 0.0))


class DurationRecorder:
    """A plugin of the controlling pytest process: sums the seconds of each file's reports and merges
    them into the record at the end of the session."""

    def __init__(self, path: Path = RECORD) -> None:
        self.path = path
        self.seconds: collections.Counter[str] = collections.Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        if not self.seconds:
            return
        merged = {**recorded(self.path), **{name: round(total, 1) for name, total in self.seconds.items()}}
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
