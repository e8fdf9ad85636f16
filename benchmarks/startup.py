"""What a benchmark's node runs when its interpreter starts: another checkout's code, a DHT counter.

Both go into one ``sitecustomize`` on the node's ``PYTHONPATH`` (the interpreter imports one).

*Another checkout*, for a before/after side by side on one machine.  The project maps
``p2ptrain.daemon`` and ``p2ptrain.tui`` onto the top-level ``daemon/`` and ``tui/`` folders
(pyproject's ``package-dir``), and an installed p2ptrain (editable or not) resolves those names to
its own checkout whatever the working directory.  The node's interpreter therefore gets a finder in
front of every other: the project's packages come from that checkout, everything else (torch,
hivemind) from the same interpreter and environment as this one.

*The DHT counter* (:mod:`benchmarks.dht_ops`) counts the node's DHT operations by key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

CHECKOUT = '''
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
DHT_COUNTER = '''
import sys

sys.path.append({benchmarks_root!r})  # after everything else: the project still comes from its own place
from benchmarks.dht_ops import install

install({out!r}, {run_id!r})
'''
BENCHMARKS_ROOT = Path(__file__).resolve().parents[1]


def package_folders(checkout: Path) -> dict[str, str]:
    """The checkout's top-level package and its mapped sub-packages, by name, as absolute folders."""
    setuptools = tomllib.loads((checkout / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {"p2ptrain": str(checkout / "p2ptrain")}
    folders.update({name: str(checkout / folder) for name, folder in setuptools.get("package-dir", {}).items()
                    if name.count(".") == 1})
    return folders


def node_environment(scratch: Path, checkout: Path | None = None, dht_counts: Path | None = None,
                     run_id: str = "") -> dict[str, str]:
    """Environment entries for a node that imports the project from ``checkout`` and/or counts its DHT
    operations of run ``run_id`` into ``dht_counts``; {} when neither is asked."""
    parts = ['"""Made by benchmarks.startup for a benchmark\'s node."""\n']
    if checkout is not None:
        parts.append(CHECKOUT.format(packages=package_folders(checkout.resolve())))
    if dht_counts is not None:
        dht_counts.mkdir(parents=True, exist_ok=True)
        parts.append(DHT_COUNTER.format(benchmarks_root=str(BENCHMARKS_ROOT), out=str(dht_counts), run_id=run_id))
    if len(parts) == 1:
        return {}
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "sitecustomize.py").write_text("".join(parts), encoding="utf-8")
    return {"PYTHONPATH": str(scratch)}
