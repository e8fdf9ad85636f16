"""The library type-checks: mypy over p2ptrain, p2ptrain.daemon and p2ptrain.tui with pyproject.toml's
``[tool.mypy]`` (``python -m tests.support.typecheck``; make lint runs it too)."""

from __future__ import annotations

import re

from tests.support import typecheck
from tests.support.imports import REPO

PLANTED = "from __future__ import annotations\n\ncount: int = 'one'\n"


def test_the_library_type_checks() -> None:
    result = typecheck.run(capture=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    checked = re.search(r"no issues found in (\d+) source files", result.stdout)
    assert checked is not None, result.stdout[-2000:]
    # every module of the three folders, none skipped
    assert int(checked.group(1)) == sum(1 for folder in typecheck.LAYOUT for _ in (REPO / folder).rglob("*.py"))


def test_an_error_in_the_daemon_or_the_tui_is_reported_at_its_own_path() -> None:
    result = typecheck.run(capture=True, files={"p2ptrain/daemon/_planted.py": PLANTED,
                                               "p2ptrain/tui/_planted.py": PLANTED})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    errors = sorted(line.split(":")[:2] for line in result.stdout.splitlines() if ": error:" in line)
    assert errors == [["daemon/_planted.py", "3"], ["tui/_planted.py", "3"]], result.stdout[-3000:]
