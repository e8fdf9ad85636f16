"""Runs mypy over the library with pyproject.toml's ``[tool.mypy]``: ``python -m tests.support.typecheck``.

daemon/ and tui/ are mapped into the ``p2ptrain`` package by pyproject.toml's package-dir, which mypy
cannot follow; it reads a copy of the tree laid out as the installed package, and the paths in its
report are turned back into the repository's.  The cache lives in the repository's ``.mypy_cache`` (git
ignores it): mypy keys it by module and file hash, so a fresh copy each run still reuses it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".mypy_cache"
#: Where each folder of the repository sits in the installed package.
LAYOUT = {"p2ptrain": "p2ptrain", "daemon": "p2ptrain/daemon", "tui": "p2ptrain/tui"}
_IN_TREE = re.compile(r"(?<![\w/.])p2ptrain/(daemon|tui)/")


def run(extra: list[str] | None = None, capture: bool = False,
        files: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """mypy's verdict on the library.  ``files`` adds modules to the copy (path in the installed
    layout -> source), so a test can show that a planted error is found."""
    with tempfile.TemporaryDirectory(prefix="p2ptrain-types-") as tree:
        for folder, installed in LAYOUT.items():
            shutil.copytree(REPO / folder, Path(tree) / installed,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for path, source in (files or {}).items():
            (Path(tree) / path).write_text(source, encoding="utf-8")
        command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                   "--cache-dir", str(CACHE), *(extra or []), "-p", "p2ptrain"]
        result = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=600, check=False)
    result.stdout = _IN_TREE.sub(r"\1/", result.stdout)
    if not capture:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
    return result


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]).returncode)
