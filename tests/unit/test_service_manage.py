"""`p2ptrain service uninstall` and `service status` with a fake systemctl: no running systemd needed."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.cli.main import build_parser
from p2ptrain.daemon import service_install, service_manage
from p2ptrain.daemon.service_manage import Installed
from p2ptrain.errors import EX_UNAVAILABLE, EX_USAGE


class FakeSystemctl:
    def __init__(self, answers: dict[str, tuple[int, str]] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        self.calls.append(list(argv))
        verb = next(word for word in argv if not word.startswith("--"))
        return self.answers.get(verb, (0, ""))


def _args(action: str, *argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["service", action, *argv])


def _install(tmp_path: Path, *argv: str) -> None:
    assert service_install.main(build_parser().parse_args(["service", "install", "--root", str(tmp_path), *argv]),
                                environ={"HOME": str(tmp_path / "home")}) == 0


def test_uninstall_stops_disables_removes_the_unit_and_keeps_config_and_state(tmp_path: Path, capsys) -> None:
    _install(tmp_path)
    capsys.readouterr()
    systemctl = FakeSystemctl()
    assert service_manage.uninstall(_args("uninstall", "--root", str(tmp_path)), environ={},
                                    systemctl=systemctl) == 0
    assert systemctl.calls == [["disable", "--now", "p2ptrain.service"], ["daemon-reload"]]
    assert not (tmp_path / "etc/systemd/system/p2ptrain.service").exists()
    assert (tmp_path / "etc/p2ptrain/node.toml").is_file()
    out = capsys.readouterr().out
    assert "removed" in out and "/var/lib/p2ptrain" in out and "kept" in out


def test_uninstall_of_a_user_instance_keeps_the_template_other_instances_use(tmp_path: Path, capsys) -> None:
    environ = {"HOME": str(tmp_path / "home")}
    for name in ("gpu0", "gpu1"):
        assert service_install.main(build_parser().parse_args(["service", "install", "--user", "--instance", name]),
                                    environ=environ) == 0
    systemctl = FakeSystemctl({"disable": (1, "Unit p2ptrain@gpu0.service not loaded.")})
    assert service_manage.uninstall(_args("uninstall", "--user", "--instance", "gpu0"), environ=environ,
                                    systemctl=systemctl) == 0
    assert systemctl.calls == [["--user", "disable", "--now", "p2ptrain@gpu0.service"]]
    assert (tmp_path / "home/.config/systemd/user/p2ptrain@.service").exists()
    captured = capsys.readouterr()
    assert "other instances: gpu1" in captured.out and "not loaded" in captured.err


def test_uninstall_with_nothing_installed_refuses_in_one_line(tmp_path: Path, capsys) -> None:
    systemctl = FakeSystemctl()
    assert service_manage.uninstall(_args("uninstall", "--root", str(tmp_path)), environ={},
                                    systemctl=systemctl) == EX_USAGE
    err = capsys.readouterr().err
    assert err.startswith("p2ptrain: nothing to uninstall: no unit at ") and err.count("\n") == 1
    assert systemctl.calls == []
    bad_name = _args("uninstall", "--instance", "../x")
    assert service_manage.uninstall(bad_name, environ={}, systemctl=systemctl) == EX_USAGE


SHOW = ("LoadState=loaded\nActiveState=active\nSubState=running\nUnitFileState=enabled\nResult=success\n"
        "MainPID=4242\nNRestarts=0\nExecMainStartTimestamp=Sat 2026-12-05 10:00:00 UTC\nStatusText=training epoch=3\n")


def test_status_shows_the_unit_and_the_node(tmp_path: Path, capsys) -> None:
    _install(tmp_path)
    capsys.readouterr()
    systemctl = FakeSystemctl({"show": (0, SHOW)})

    def node(args: Any, installed: Installed) -> tuple[dict[str, Any] | None, str]:
        return {"url": "http://127.0.0.1:41480", "state": "training", "pause_reason": "", "local_epoch": 3,
                "peers_online": 2, "run_ref": "", "run_id": "demo"}, ""

    assert service_manage.status(_args("status", "--root", str(tmp_path)), environ={}, systemctl=systemctl,
                                 node_status=node) == 0
    assert systemctl.calls[0][:2] == ["show", "p2ptrain.service"] and "ActiveState" in systemctl.calls[0][2]
    out = capsys.readouterr().out
    assert "loaded, active (running), enabled" in out and "main pid  4242" in out
    assert "node      training, epoch 3, 2 peers online, run demo" in out
    assert service_manage.status(_args("status", "--root", str(tmp_path), "--json"), environ={},
                                 systemctl=systemctl, node_status=node) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["installed"] is True and shown["unit"]["MainPID"] == "4242" and shown["node"]["local_epoch"] == 3
    assert shown["schema_version"] == 1 and shown["node_error"] is None


def test_status_of_a_service_that_is_not_installed_or_not_running(tmp_path: Path, capsys) -> None:
    asked: list[str] = []

    def node(args: Any, installed: Installed) -> tuple[dict[str, Any] | None, str]:
        asked.append("node")
        return None, "unreachable"

    systemctl = FakeSystemctl({"show": (0, "LoadState=not-found\nActiveState=inactive\nSubState=dead\n")})
    assert service_manage.status(_args("status", "--root", str(tmp_path)), environ={}, systemctl=systemctl,
                                 node_status=node) == EX_UNAVAILABLE
    out = capsys.readouterr().out
    assert "not installed" in out and "not-found, inactive (dead)" in out and "node      not running" in out
    assert asked == []  # a stopped unit's API is not asked
    no_systemd = FakeSystemctl({"show": (127, "systemctl not found (is this a systemd machine?)")})
    assert service_manage.status(_args("status", "--root", str(tmp_path), "--json"), environ={},
                                 systemctl=no_systemd, node_status=node) == EX_UNAVAILABLE
    captured = capsys.readouterr()
    assert json.loads(captured.out)["systemd_error"].startswith("systemctl not found")
    assert captured.err.count("\n") == 1


def test_parse_show() -> None:
    assert service_manage.parse_show("A=1\nB=x=y\nnoise\n") == {"A": "1", "B": "x=y"}


def test_the_real_runner_without_systemctl_is_a_failure_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    code, text = service_manage.run_systemctl(["show", "p2ptrain.service"])
    assert code == 127 and "systemctl not found" in text
