"""The code shows its architecture: a few modules at the top, packages that map themselves, a
README that names every package, and import contracts that a real tool checks."""

from __future__ import annotations

import ast
import re

from tests.support import lint_imports
from tests.support.imports import REPO

LIBRARY = REPO / "p2ptrain"
#: The library's top level holds the stdlib-only base and the packages, not a bag of modules.
MAX_TOP_LEVEL_MODULES = 12


def _packages() -> list[str]:
    return sorted(p.name for p in LIBRARY.iterdir() if (p / "__init__.py").is_file())


def test_the_top_level_holds_at_most_a_dozen_modules() -> None:
    modules = sorted(p.name for p in LIBRARY.glob("*.py"))
    assert "__init__.py" in modules  # the count sees the folder
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_every_package_maps_its_modules_in_its_docstring() -> None:
    assert {"optim", "swarm", "trust"} <= set(_packages())
    unmapped = {}
    for package in _packages():
        init = LIBRARY / package / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        names = [p.stem for p in (LIBRARY / package).glob("*.py") if p.name != "__init__.py"]
        missing = [name for name in names if f"``{name}``" not in doc]
        if missing:
            unmapped[package] = missing
    assert unmapped == {}


def test_the_readme_names_every_package() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Architecture"):]
    named = set(re.findall(r"`p2ptrain\.(\w+)`", section))
    assert set(_packages()) - named == set()
    assert {"daemon", "tui"} <= named


def test_the_import_contracts_hold() -> None:
    """Layers, torch- and hivemind-free policy, hivemind only in the adapter and free of its policy objects,
    transformers only in the Hugging Face task, a TUI that loads neither, no cycles (pyproject.toml)."""
    result = lint_imports.run([], capture=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout and "7 kept" in result.stdout


def test_every_exit_code_is_named_once_in_errors() -> None:
    """The CLI, the daemon and the TUI take their exit codes from p2ptrain.errors, sysexits.h's as os has them."""
    import os

    from p2ptrain import errors

    assert (errors.EX_CONFIG, errors.EX_TEMPFAIL, errors.EX_UNAVAILABLE) == (os.EX_CONFIG, os.EX_TEMPFAIL,
                                                                           os.EX_UNAVAILABLE) == (78, 75, 69)
    assert (errors.EX_INTERRUPTED, errors.EX_BROKEN_PIPE) == (130, 141)
    defined: dict[str, list[str]] = {}
    for folder in ("p2ptrain", "daemon", "tui"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                for target in targets:
                    if isinstance(target, ast.Name) and target.id.startswith("EX_"):
                        defined.setdefault(target.id, []).append(str(path.relative_to(REPO)))
    assert "EX_CONFIG" in defined  # the scan sees assignments
    assert {name: where for name, where in defined.items() if where != ["p2ptrain/errors.py"]} == {}


def test_no_two_classes_share_a_name() -> None:
    """A class name says what it is once: two ``RoundReport``s (or ``Fetcher``s) make every reader
    check which one a module means."""
    where: dict[str, list[str]] = {}
    for folder in ("p2ptrain", "daemon", "tui", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert len(where) > 100  # the scan sees the project's classes
    assert {name: places for name, places in where.items() if len(places) > 1} == {}
