"""`p2ptrain service install`: files, ExecStart of this installation, dry run, kept configs, errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from p2ptrain.cli.main import build_parser
from p2ptrain.config.schema import load_config
from p2ptrain.daemon import service_install
from p2ptrain.errors import EX_CANTCREAT, EX_USAGE


def run(argv: list[str], environ: dict[str, str] | None = None) -> int:
    args = build_parser().parse_args(["service", "install", *argv])
    return service_install.main(args, environ=environ or {})


def test_system_install_writes_unit_sysusers_and_config(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--root", str(tmp_path)]) == 0
    unit = (tmp_path / "etc/systemd/system/p2ptrain.service").read_text()
    assert f"ExecStart={sys.executable} -m p2ptrain.cli run --config %E/p2ptrain/node.toml" in unit
    assert "User=p2ptrain" in unit
    assert "u p2ptrain" in (tmp_path / "etc/sysusers.d/p2ptrain.conf").read_text()
    config = tmp_path / "etc/p2ptrain/node.toml"
    load_config(config, environ={})  # the written template is a valid config
    assert oct(os.stat(config).st_mode & 0o777) == "0o644"
    out = capsys.readouterr().out
    assert "systemd-sysusers /etc/sysusers.d/p2ptrain.conf" in out
    assert out.index("systemctl daemon-reload") < out.index("systemctl enable --now p2ptrain.service")


def test_gpu_install_allows_the_gpu_device_nodes_and_only_then(tmp_path: Path) -> None:
    unit = tmp_path / "etc/systemd/system/p2ptrain.service"
    assert run(["--root", str(tmp_path)]) == 0
    assert "DeviceAllow=" not in unit.read_text()
    assert run(["--root", str(tmp_path), "--gpu"]) == 0
    assert "DeviceAllow=char-nvidia* rw" in unit.read_text() and "DevicePolicy=closed" in unit.read_text()


def test_reinstall_updates_the_unit_but_keeps_the_config(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--root", str(tmp_path)]) == 0
    config = tmp_path / "etc/p2ptrain/node.toml"
    config.write_text('[swarm]\nrun_id = "mine"\n')
    unit = tmp_path / "etc/systemd/system/p2ptrain.service"
    unit.write_text("stale")
    capsys.readouterr()
    assert run(["--root", str(tmp_path)]) == 0
    assert config.read_text() == '[swarm]\nrun_id = "mine"\n'
    assert unit.read_text().startswith("# p2ptrain node")
    out = capsys.readouterr().out
    assert f"kept     {config}" in out and f"updated  {unit}" in out


def test_instance_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--root", str(tmp_path), "--instance", "gpu0"]) == 0
    unit = (tmp_path / "etc/systemd/system/p2ptrain@.service").read_text()
    assert "StateDirectory=p2ptrain/%i" in unit
    assert (tmp_path / "etc/p2ptrain/gpu0.toml").exists()
    out = capsys.readouterr().out
    assert "systemctl enable --now p2ptrain@gpu0.service" in out and "api.port" in out


def test_user_install_uses_xdg_dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "USER": "alice"}
    assert run(["--user"], environ) == 0
    unit = (tmp_path / "cfg/systemd/user/p2ptrain.service").read_text()
    assert "User=" not in unit and "WantedBy=default.target" in unit
    assert (tmp_path / "cfg/p2ptrain/node.toml").exists()
    assert not (tmp_path / "cfg/sysusers.d").exists()
    out = capsys.readouterr().out
    assert "systemctl --user enable --now p2ptrain.service" in out and "loginctl enable-linger alice" in out


def test_dry_run_prints_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--root", str(tmp_path), "--dry-run"]) == 0
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert "# --- write: " + str(tmp_path / "etc/systemd/system/p2ptrain.service") in out
    assert "Type=notify" in out and "[swarm]" in out and "systemctl daemon-reload" in out


def test_bad_instance_name_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--root", str(tmp_path), "--instance", "../etc"]) == EX_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--instance '../etc'" in err
    assert list(tmp_path.iterdir()) == []


def test_unwritable_target_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "etc").write_text("a file where a directory should be")
    assert run(["--root", str(tmp_path)]) == EX_CANTCREAT
    err = capsys.readouterr().err
    assert err.startswith("p2ptrain: cannot write ") and err.count("\n") == 1


def test_python_under_home_is_warned_about_for_system_units() -> None:
    plan = service_install.plan_install(user=False, instance=None, exec_prefix=["/home/a/venv/bin/python"],
                                        environ={})
    assert any("ProtectHome" in w for w in plan.warnings)
    plan = service_install.plan_install(user=True, instance=None, exec_prefix=["/home/a/venv/bin/python"],
                                        environ={"HOME": "/home/a"})
    assert plan.warnings == ()
