"""write_atomic: the target holds its old content or the whole new one, never a part."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from p2ptrain.atomicfile import write_atomic


def test_replaces_the_file_with_the_mode_asked_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "run.toml"
    target.write_text("old")
    write_atomic(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]


def test_a_failed_write_keeps_the_old_content_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, b"new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
