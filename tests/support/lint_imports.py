"""Runs import-linter over the import contracts of pyproject.toml: ``python -m tests.support.lint_imports``.

daemon/ and tui/ are mapped into the ``p2ptrain`` package by pyproject.toml's package-dir, which
import-linter cannot follow; it reads a copy of the tree laid out as the installed package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(extra: list[str], capture: bool = False) -> subprocess.CompletedProcess[str]:
    linter = Path(sys.executable).parent / "lint-imports"
    with tempfile.TemporaryDirectory(prefix="p2ptrain-imports-") as tree:
        shutil.copytree(REPO / "p2ptrain", Path(tree) / "p2ptrain")
        shutil.copytree(REPO / "daemon", Path(tree) / "p2ptrain" / "daemon")
        shutil.copytree(REPO / "tui", Path(tree) / "p2ptrain" / "tui")
        env = {**os.environ, "PYTHONPATH": tree}
        return subprocess.run([str(linter), "--no-cache", str(REPO / "pyproject.toml"), *extra], cwd=tree, env=env,
                              capture_output=capture, text=True, timeout=300, check=False)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]).returncode)
