"""Run nodes with another checkout's code, for a before/after side by side on one machine.

The project maps ``p2ptrain.daemon`` and ``p2ptrain.tui`` onto the top-level ``daemon/`` and ``tui/``
folders (pyproject's ``package-dir``), and an installed p2ptrain (editable or not) resolves those
names to its own checkout whatever the working directory.  A node of the other checkout therefore
starts with a ``sitecustomize`` (on its ``PYTHONPATH``) that puts a finder in front of every other:
the project's packages come from that checkout, everything else (torch, hivemind) from the same
interpreter and environment as this one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

SITECUSTOMIZE = '''"""Made by benchmarks.checkout: this interpreter imports p2ptrain from {root}."""
import importlib.abc
import importlib.util
import sys

PACKAGES = {packages!r}


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        folder = PACKAGES.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(name, folder + "/__init__.py",
                                                      submodule_search_locations=[folder])


sys.meta_path.insert(0, _CheckoutFinder())
'''


def package_folders(checkout: Path) -> dict[str, str]:
    """The checkout's top-level package and its mapped sub-packages, by name, as absolute folders."""
    setuptools = tomllib.loads((checkout / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {"p2ptrain": str(checkout / "p2ptrain")}
    folders.update({name: str(checkout / folder) for name, folder in setuptools.get("package-dir", {}).items()
                    if name.count(".") == 1})
    return folders


def checkout_environment(checkout: Path, scratch: Path) -> dict[str, str]:
    """Environment entries that make a Python process import the project from ``checkout``."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "sitecustomize.py").write_text(
        SITECUSTOMIZE.format(root=checkout, packages=package_folders(checkout.resolve())), encoding="utf-8")
    return {"PYTHONPATH": str(scratch)}
