"""The suite's file order: longest recorded files first, the record merged and never a failure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.support.durations import DurationRecorder, longest_first, recorded


def _item(nodeid: str) -> Any:
    return SimpleNamespace(nodeid=nodeid)


def test_longest_files_go_first_and_each_file_keeps_its_tests_together_in_order() -> None:
    items = [_item(n) for n in ("a.py::x", "a.py::y", "b.py::x", "c.py::x", "c.py::y", "d.py::x")]
    longest_first(items, {"c.py": 90.0, "b.py": 10.0})
    assert [i.nodeid for i in items] == ["c.py::x", "c.py::y", "b.py::x", "a.py::x", "a.py::y", "d.py::x"]


def test_a_missing_or_garbled_record_orders_nothing(tmp_path: Path) -> None:
    assert recorded(tmp_path / "none.json") == {}
    for text in ("{", "[1, 2]", '{"a.py": "slow", "b.py": 3}'):
        (tmp_path / "d.json").write_text(text)
        assert recorded(tmp_path / "d.json") == ({"b.py": 3.0} if "b.py" in text else {})


def test_the_recorder_sums_each_file_s_reports_and_merges_them_into_the_record(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"old.py": 5.0, "a.py": 99.0}))
    recorder = DurationRecorder(path)
    for nodeid, seconds in (("a.py::x", 1.25), ("a.py::x", 2.0), ("a.py::y", 0.5), ("b.py::z", 4.0)):
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    recorder.pytest_sessionfinish(None, 0)
    assert json.loads(path.read_text()) == {"a.py": 3.8, "b.py": 4.0, "old.py": 5.0}
