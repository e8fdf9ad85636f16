"""The digest of a user task's code, so that volunteers who run another version of it are told apart.

Two nodes whose models have the same shapes still cannot train together when their task code
differs: another loss, another tokenisation or another data pipeline makes their averages
meaningless, and nothing in the tensors shows it.  The digest covers every ``.py`` file of the
top-level package that defines the entrypoint (a helper module beside the task counts as much as
the task), or the entrypoint's own file when it is a lone module.  It goes into the model
fingerprint and, for an owned run, into the manifest (``task.code_sha256``).

The package is read within bounds: a task inside a very large package (more than
:data:`MAX_CODE_FILES` files or :data:`MAX_CODE_BYTES` bytes of Python) is digested by its own module's
file only, which still tells most versions apart.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import ModuleType

#: The most ``.py`` files, and bytes of them, read from a task's package.
MAX_CODE_FILES = 2000
MAX_CODE_BYTES = 64 << 20


def module_of(entrypoint: str) -> ModuleType | None:
    """The imported module of ``"package.module:function"`` (import it first), None if not imported."""
    return sys.modules.get(entrypoint.partition(":")[0])


def task_code_sha256(module: ModuleType) -> str | None:
    """sha256 over the relative names and contents of the task's Python files; None for code that has
    no source file (a module built into the interpreter or loaded from a zip)."""
    own = _source_file(module)
    if own is None:
        return None
    files = _package_files(module) or [(own.name, own)]
    digest = hashlib.sha256()
    for name, path in files:
        content = path.read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def _source_file(module: ModuleType) -> Path | None:
    origin = getattr(module, "__file__", None)
    if not origin or not origin.endswith(".py") or not Path(origin).is_file():
        return None
    return Path(origin)


def _package_files(module: ModuleType) -> list[tuple[str, Path]]:
    """``(name relative to the package's parent, path)`` of the top-level package's ``.py`` files, sorted;
    empty for a lone module or a package beyond the bounds."""
    top = sys.modules.get(module.__name__.partition(".")[0])
    roots = list(getattr(top, "__path__", []) or [])
    if len(roots) != 1:  # a lone module, or a namespace package spread over several folders
        return []
    root = Path(roots[0])
    paths: list[Path] = []
    for path in root.rglob("*.py"):  # stops at the bound: a huge tree is not listed whole
        if "__pycache__" in path.parts or not path.is_file():
            continue
        paths.append(path)
        if len(paths) > MAX_CODE_FILES:
            return []
    if sum(path.stat().st_size for path in paths) > MAX_CODE_BYTES:
        return []
    return [(path.relative_to(root.parent).as_posix(), path) for path in sorted(paths)]
