"""The project's import graph, read from the source with ``ast`` (nothing is imported or run)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Import package -> folder, as pyproject.toml's package-dir maps them.
PACKAGE_DIRS = {"p2ptrain.daemon": REPO / "daemon", "p2ptrain.tui": REPO / "tui", "p2ptrain": REPO / "p2ptrain"}


def module_name(path: Path) -> str:
    """``daemon/api.py`` -> ``p2ptrain.daemon.api``; a package's ``__init__.py`` names the package."""
    for package, folder in PACKAGE_DIRS.items():
        if path.is_relative_to(folder):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise ValueError(f"{path} is not in a project package")


def module_path(name: str) -> Path:
    """The source file of a project module (``p2ptrain.tui.app`` -> ``tui/app.py``)."""
    for package, folder in PACKAGE_DIRS.items():
        if name == package or name.startswith(package + "."):
            relative = Path(*name[len(package):].lstrip(".").split(".")) if name != package else Path()
            candidate = folder / relative
            return candidate / "__init__.py" if candidate.is_dir() else candidate.with_suffix(".py")
    raise ValueError(f"{name} is not a project module")


def source_files(package: str) -> Iterator[Path]:
    """Every .py file of ``package``'s folder (``p2ptrain`` excludes the daemon and tui folders,
    which are separate folders anyway)."""
    yield from sorted(PACKAGE_DIRS[package].rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, anywhere in the file (lazy imports too).
    ``from a import b`` yields both ``a`` and ``a.b`` (b may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def project_imports(path: Path) -> set[str]:
    """The project modules (``p2ptrain...``) among :func:`imports_of`, keeping only real modules."""
    names = set()
    for name in imports_of(path):
        if name == "p2ptrain" or name.startswith("p2ptrain."):
            try:
                if module_path(name).exists():
                    names.add(name)
            except ValueError:
                continue
    return names


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"
