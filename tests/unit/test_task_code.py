"""The user task's code is part of what nodes must share: its digest goes into the fingerprint and,
in an owned run, into the manifest, and a volunteer with other code is refused with one line."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from p2ptrain.cli.main import main
from p2ptrain.config.schema import ConfigError, TaskSection, TrainingSection, parse_config
from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.run.manifest import read_manifest_file
from p2ptrain.run.runconfig import merge_manifest
from p2ptrain.tasks import build_task, code_digest

TASK = """
import torch
from p2ptrain.tasks import IndexedStream, Task
from {package}.helpers import SCALE

def build(context):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return Task(model, lambda m, b: SCALE * m(b).sum(), IndexedStream(lambda i: torch.ones(1, 2)),
                lambda: [torch.ones(1, 2)], {{"kind": "tiny"}})
"""
_counter = itertools.count()


def _package(root: Path, monkeypatch: pytest.MonkeyPatch, scale: str = "1.0") -> str:
    """A task package ``<name>`` in ``root`` (on sys.path): ``task.py`` and the ``helpers.py`` it imports."""
    name = f"p2ptrain_code_task_{next(_counter)}"
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "task.py").write_text(TASK.format(package=name))
    (folder / "helpers.py").write_text(f"SCALE = {scale}\n")
    monkeypatch.syspath_prepend(str(root))
    return name


def _fingerprint(entrypoint: str, code_sha256: str | None = None) -> tuple[str, str]:
    task = build_task(TaskSection(entrypoint=entrypoint, code_sha256=code_sha256), TrainingSection(), 0)
    return task.shape_config["task_code_sha256"], model_fingerprint(task.model, task.shape_config)


def _forget(package: str) -> None:
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[module]


def test_a_changed_helper_changes_the_code_digest_and_the_fingerprint(tmp_path, monkeypatch):
    first = _package(tmp_path / "a", monkeypatch)
    code, fingerprint = _fingerprint(f"{first}.task:build")
    again = _fingerprint(f"{first}.task:build")
    assert again == (code, fingerprint)  # the same code: the same digest
    (tmp_path / "a" / first / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "a" / first / "__pycache__" / "stale.py").write_text("x = 1\n")
    assert _fingerprint(f"{first}.task:build") == (code, fingerprint)  # caches are not code
    (tmp_path / "a" / first / "helpers.py").write_text("SCALE = 2.0\n")  # same shapes, another loss
    _forget(first)
    changed_code, changed_fingerprint = _fingerprint(f"{first}.task:build")
    assert changed_code != code and changed_fingerprint != fingerprint


def test_a_package_beyond_the_bounds_is_digested_by_the_task_s_own_file(tmp_path, monkeypatch):
    name = _package(tmp_path, monkeypatch)
    whole, _ = _fingerprint(f"{name}.task:build")
    monkeypatch.setattr(code_digest, "MAX_CODE_FILES", 2)
    own, _ = _fingerprint(f"{name}.task:build")
    assert own != whole
    (tmp_path / name / "helpers.py").write_text("SCALE = 3.0\n")  # outside what is digested now
    assert _fingerprint(f"{name}.task:build")[0] == own


def test_code_other_than_the_run_s_is_refused_with_one_line(tmp_path, monkeypatch):
    name = _package(tmp_path, monkeypatch)
    code, _ = _fingerprint(f"{name}.task:build")
    assert _fingerprint(f"{name}.task:build", code_sha256=code)[0] == code
    other = "ab" * 32
    with pytest.raises(ConfigError) as info:
        _fingerprint(f"{name}.task:build", code_sha256=other)
    assert str(info.value) == (f"task.code_sha256: the code of {name}.task:build on this machine has sha256 {code}, "
                               f"the run's has {other}: install the run's version of the task")


def test_built_in_tasks_carry_no_code_digest():
    task = build_task(TaskSection(d_model=8, n_heads=2, n_layers=1, seq_len=16), TrainingSection(), 0)
    assert "task_code_sha256" not in task.shape_config


def test_init_records_the_code_and_a_volunteer_with_other_code_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = _package(tmp_path / "owner", monkeypatch)
    (tmp_path / "owner.toml").write_text(f'[task]\nentrypoint = "{name}.task:build"\n')
    assert main(["run", "init", "coded", "--from-config", "owner.toml"]) == 0
    code, fingerprint = _fingerprint(f"{name}.task:build")
    out = capsys.readouterr().out
    assert f"task code  sha256 {code}" in out
    manifest = read_manifest_file(tmp_path / "coded" / "manifest.toml")
    assert manifest.task["code_sha256"] == code and manifest.fingerprint == fingerprint

    volunteer = merge_manifest(parse_config({}, "node.toml"), manifest)
    assert volunteer.task.code_sha256 == code
    build_task(volunteer.task, volunteer.training, 0)  # the same code: accepted
    (tmp_path / "owner" / name / "helpers.py").write_text("SCALE = 2.0\n")  # the volunteer's copy differs
    _forget(name)
    with pytest.raises(ConfigError, match=rf"^task\.code_sha256: the code of {name}\.task:build on this machine has "
                                          rf"sha256 [0-9a-f]{{64}}, the run's has {code}: install the run's "
                                          r"version of the task$"):
        build_task(volunteer.task, volunteer.training, 0)

    # The owner changed the code: an update with a new fingerprint records the new code too.
    assert main(["run", "update", "coded/manifest.toml", "--fingerprint", "auto"]) == 0
    updated = read_manifest_file(tmp_path / "coded" / "manifest.toml")
    new_code, new_fingerprint = _fingerprint(f"{name}.task:build")
    assert updated.task["code_sha256"] == new_code != code and updated.fingerprint == new_fingerprint


def test_config_check_refuses_other_code_with_one_line_and_exit_78(tmp_path, monkeypatch, capsys):
    name = _package(tmp_path, monkeypatch)
    code, _ = _fingerprint(f"{name}.task:build")
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[task]\nentrypoint = "{name}.task:build"\n'
                      f'code_sha256 = "{code}"\n')
    assert main(["config", "check", str(config)]) == 0
    capsys.readouterr()
    config.write_text(config.read_text().replace(code, "cd" * 32))
    assert main(["config", "check", str(config)]) == 78
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"task.code_sha256: the code of {name}.task:build on this machine has sha256 " \
                                     f"{code}, the run's has {'cd' * 32}" in err
