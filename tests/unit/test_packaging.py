"""The distribution's metadata: every package and every file a command reads is in the wheel, a
headless install stays small, the test tools' extra brings what the tests exercise, and the floors of
torch and pyarrow leave out the versions that run code from a file they read."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PROJECT["tool"]["setuptools"]


def _folder(package: str) -> Path:
    mapped = SETUPTOOLS["package-dir"]
    return ROOT / mapped.get(package, package.replace(".", "/"))


def test_every_package_folder_is_listed() -> None:
    folders = {_folder(package).resolve() for package in SETUPTOOLS["packages"]}
    found = {init.parent.resolve() for top in ("p2ptrain", "daemon", "tui")
             for init in (ROOT / top).rglob("__init__.py") if "__pycache__" not in init.parts}
    assert found - folders == set(), "add these packages to [tool.setuptools] packages"


def test_every_data_file_of_a_package_is_package_data() -> None:
    missing = []
    for package in SETUPTOOLS["packages"]:
        folder = _folder(package)
        patterns = SETUPTOOLS["package-data"].get(package, [])
        for path in folder.iterdir():
            if path.is_file() and path.suffix not in (".py", ".pyc") and not any(
                    fnmatch.fnmatch(path.name, pattern) for pattern in patterns):
                missing.append(str(path.relative_to(ROOT)))
    assert missing == [], "list these in [tool.setuptools.package-data] or they are not in the wheel"


def test_a_headless_install_needs_neither_textual_nor_pyarrow() -> None:
    names = {requirement.split(">")[0].split("=")[0].split("<")[0].strip() for requirement in
             PROJECT["project"]["dependencies"]}
    assert {"textual", "pyarrow"} & names == set()
    extras = PROJECT["project"]["optional-dependencies"]
    assert any(r.startswith("textual") for r in extras["tui"])
    assert any(r.startswith("pyarrow") for r in extras["parquet"])
    # The tests exercise every extra but gpu and cloud (whose store clients they stand in for; fsspec comes with torch).
    assert "p2ptrain[tui,parquet,zstd,hf]" in extras["dev"] and "fsspec" in extras["cloud"][0]
    assert "gpu" in extras


def _requirement(name: str, requirements: list[str]) -> Requirement:
    [found] = [Requirement(r) for r in requirements if re.match(rf"{name}\b", r)]
    return found


def test_pyarrow_floor_excludes_the_parquet_code_execution_bug() -> None:
    # CVE-2023-47248: pyarrow 0.14.0 to 14.0.0 unpickle code from a Parquet file's metadata.
    spec = _requirement("pyarrow", PROJECT["project"]["optional-dependencies"]["parquet"]).specifier
    assert not spec.contains("14.0.0") and spec.contains("14.0.1"), spec


def test_torch_floor_has_the_weights_only_fixes() -> None:
    # torch.load(weights_only=True) keeps a checkpoint from running code only from 2.10 on
    # (CVE-2025-32434, fixed in 2.6; CVE-2026-24747, fixed in 2.10).  2.13.0 is the CPU build CI installs.
    spec = _requirement("torch", PROJECT["project"]["dependencies"]).specifier
    assert not spec.contains("2.9.1") and spec.contains("2.10.0") and spec.contains("2.13.0"), spec


def test_the_console_script_and_long_description() -> None:
    assert PROJECT["project"]["scripts"] == {"p2ptrain": "p2ptrain.cli.main:main"}
    assert PROJECT["project"]["readme"] == "README.md" and PROJECT["project"]["classifiers"]
