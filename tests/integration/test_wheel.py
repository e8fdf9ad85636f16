"""The wheel as a user installs it: built from this tree, installed into a new venv outside it, its
console script run from elsewhere.  Its dependencies come from this venv's site-packages (a path
line in the new venv, so no index is needed); the project itself only from the wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Without build isolation: setuptools and wheel come from the dev extra, nothing is downloaded.
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=180)
    (built,) = out.glob("p2ptrain-*.whl")
    return built


def test_the_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in ((ROOT / "p2ptrain", "p2ptrain"), (ROOT / "daemon", "p2ptrain/daemon"),
                            (ROOT / "tui", "p2ptrain/tui")):
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                relative = path.relative_to(folder).as_posix()
                if package == "p2ptrain" and relative.split("/")[0] in ("daemon", "tui"):
                    continue
                assert f"{package}/{relative}" in names, f"{package}/{relative} is not in the wheel"
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Provides-Extra: gpu" in metadata and "Provides-Extra: tui" in metadata
    assert "## Volunteer: install with one command" in metadata  # the README is the long description
    assert not any(name.split("/")[0] in ("daemon", "tui") for name in names)  # never top-level daemon or tui


def test_the_installed_console_script_runs_outside_the_tree(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=120)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # A path line only: this venv's .pth files (the editable install's finder) are not run there.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    script = env_dir / "bin" / "p2ptrain"
    where = subprocess.run([str(python), "-c", "import p2ptrain.tui, sys; print(p2ptrain.tui.__file__)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    assert where.startswith(str(site)), where
    version = subprocess.run([str(script), "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.splitlines()[2] == "hivemind 1.1.12", version
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[swarm]\nlisten_addrs = ["/ip4/127.0.0.1/tcp/0"]\n')
    doctor = subprocess.run([str(script), "doctor", "-c", str(config), "--json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    checks = {check["name"]: check["status"] for check in json.loads(doctor.stdout)["checks"]}
    assert checks["config"] == "ok" and checks["versions"] == "ok", doctor.stdout
    assert (site / "p2ptrain" / "tui" / "p2ptrain.tcss").is_file()
