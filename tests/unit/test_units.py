"""systemd unit files: required directives, `systemd-analyze verify` clean, `security --offline` <= 3.5.

The tools come from the distribution's ``systemd`` package (Debian/Ubuntu: ``apt-get install
systemd``).  In CI (``CI=true``) a missing tool fails the test; elsewhere it is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.daemon.units import SYSUSERS, render_unit

REPO = Path(__file__).resolve().parents[2]
UNIT_DIR = REPO / "configs" / "systemd"
EXEC = [sys.executable, "-m", "p2ptrain.cli"]  # an ExecStart binary that exists on this machine
MAX_EXPOSURE = 3.5


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found (install the 'systemd' package)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_checked_in_units_match_what_install_writes() -> None:
    assert (UNIT_DIR / "p2ptrain.service").read_text() == render_unit()
    assert (UNIT_DIR / "p2ptrain@.service").read_text() == render_unit(instance=True)
    assert (UNIT_DIR / "p2ptrain.sysusers.conf").read_text() == SYSUSERS


@pytest.mark.parametrize("instance", [False, True])
def test_system_unit_has_the_service_contract(instance: bool) -> None:
    d = directives(render_unit(instance=instance))
    for key, value in {
        "Type": "notify", "KillMode": "mixed", "Restart": "on-failure", "RestartPreventExitStatus": "78",
        "IOSchedulingClass": "idle", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
        "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "", "User": "p2ptrain",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK", "DevicePolicy": "closed",
    }.items():
        assert d.get(key) == [value], key
    for key in ("WatchdogSec", "StateDirectory", "CacheDirectory", "ConfigurationDirectory", "Nice",
                "ProtectKernelTunables", "ProtectKernelModules", "RestrictNamespaces", "ExecReload"):
        assert key in d, key
    assert "@system-service" in d["SystemCallFilter"]
    assert "DeviceAllow" not in d  # GPU device nodes only when asked (see below)
    assert int(d["LimitNOFILE"][0]) >= 65536
    stop = d["TimeoutStopSec"][0]
    stop_seconds = int(stop.removesuffix("min")) * 60 if stop.endswith("min") else int(stop.rstrip("s"))
    assert stop_seconds >= 60  # time for a graceful leave and a final checkpoint
    # GPUs need real device nodes and writable+executable memory for JIT kernels.
    assert "PrivateDevices" not in d and "MemoryDenyWriteExecute" not in d
    if instance:
        assert d["StateDirectory"] == ["p2ptrain/%i"]
        assert d["ExecStart"][0].endswith("run --config %E/p2ptrain/%i.toml")


@pytest.mark.parametrize("instance", [False, True])
def test_gpu_unit_allows_the_gpu_device_nodes_only(instance: bool) -> None:
    plain, gpu = directives(render_unit(instance=instance)), directives(render_unit(instance=instance, gpu=True))
    assert gpu["DeviceAllow"] == ["char-nvidia* rw", "char-kfd rw", "char-drm rw"]
    assert gpu["DevicePolicy"] == ["closed"]
    assert {k: v for k, v in gpu.items() if k != "DeviceAllow"} == plain


def test_user_unit_drops_what_the_user_manager_cannot_do() -> None:
    d = directives(render_unit(user=True))
    assert "User" not in d and "LimitNOFILE" not in d and "ProtectSystem" not in d
    assert d["WantedBy"] == ["default.target"] and d["Type"] == ["notify"]


@pytest.fixture()
def unit_copies(tmp_path: Path) -> Path:
    (tmp_path / "p2ptrain.service").write_text(render_unit(EXEC))
    (tmp_path / "p2ptrain@.service").write_text(render_unit(EXEC, instance=True))
    (tmp_path / "p2ptrain-gpu.service").write_text(render_unit(EXEC, gpu=True))
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    (user_dir / "p2ptrain.service").write_text(render_unit(EXEC, user=True))
    return tmp_path


@pytest.mark.parametrize("name", ["p2ptrain.service", "p2ptrain@.service", "p2ptrain@ci-run.service",
                                  "p2ptrain-gpu.service"])
def test_systemd_analyze_verify_is_silent(unit_copies: Path, name: str) -> None:
    tool = need_tool("systemd-analyze")
    result = subprocess.run([tool, "verify", "--man=no", str(unit_copies / name)],
                            capture_output=True, text=True, timeout=60, cwd=unit_copies)
    assert result.stderr == "" and result.returncode == 0, result.stderr


def test_systemd_analyze_verify_user_unit(unit_copies: Path, tmp_path: Path) -> None:
    tool = need_tool("systemd-analyze")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    unit = unit_copies / "user" / "p2ptrain.service"
    result = subprocess.run([tool, "--user", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.stderr == "" and result.returncode == 0, result.stderr


def test_verify_catches_a_broken_unit(unit_copies: Path) -> None:
    """The verify check above can fail: a typo'd directive is reported on stderr."""
    tool = need_tool("systemd-analyze")
    broken = unit_copies / "broken.service"
    broken.write_text(render_unit(EXEC).replace("KillMode=mixed", "KillMode=sometimes"))
    result = subprocess.run([tool, "verify", "--man=no", str(broken)],
                            capture_output=True, text=True, timeout=60)
    assert "kill mode" in result.stderr


@pytest.mark.parametrize("name", ["p2ptrain.service", "p2ptrain@.service", "p2ptrain-gpu.service"])
def test_security_exposure_is_at_most_3_5(unit_copies: Path, name: str) -> None:
    tool = need_tool("systemd-analyze")
    result = subprocess.run([tool, "security", "--offline=yes", "--no-pager", str(unit_copies / name)],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_sysusers_file_is_valid(tmp_path: Path) -> None:
    tool = need_tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group"):
        (tmp_path / "etc" / name).touch()
    conf = UNIT_DIR / "p2ptrain.sysusers.conf"
    result = subprocess.run([tool, "--dry-run", f"--root={tmp_path}", str(conf)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Creating user 'p2ptrain'" in result.stdout + result.stderr
