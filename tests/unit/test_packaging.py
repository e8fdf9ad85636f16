"""pyproject.toml declares only what exists, a torch whose weights_only loading is safe and a pyarrow that
does not run code from Parquet files."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_package_data_patterns_match_files() -> None:
    package_dirs = PROJECT["tool"]["setuptools"]["package-dir"]
    for package, patterns in PROJECT["tool"]["setuptools"]["package-data"].items():
        folder = REPO / package_dirs[package]
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package-data {package}: {pattern} matches nothing in {folder}"


def test_torch_floor_has_the_weights_only_fixes() -> None:
    [spec] = [d for d in PROJECT["project"]["dependencies"] if re.match(r"torch\b", d)]
    floor = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert floor is not None and (int(floor[1]), int(floor[2])) >= (2, 10), spec
    assert "<3" in spec


def test_pyarrow_floor_excludes_the_parquet_code_execution_bug() -> None:
    from packaging.requirements import Requirement

    [spec] = [Requirement(d) for d in PROJECT["project"]["dependencies"] if re.match(r"pyarrow\b", d)]
    # CVE-2023-47248: pyarrow 0.14.0 to 14.0.0 unpickle code from a Parquet file's metadata.
    assert not spec.specifier.contains("14.0.0") and spec.specifier.contains("14.0.1"), spec


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it() -> None:
    # The table form ({ text = ... }) is deprecated and warned about on every install.
    assert PROJECT["project"]["license"] == "Apache-2.0"
    [spec] = [r for r in PROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.search(r">=\s*(\d+)", spec)
    assert floor is not None and int(floor[1]) >= 77, spec  # PEP 639 license expressions: setuptools 77
