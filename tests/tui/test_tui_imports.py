"""``p2ptrain top`` must start fast: the TUI never loads torch, hivemind, or the pydantic config.

From the project it imports only its own modules and a few standard-library-only library modules.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.imports import REPO, imports_of, is_stdlib, module_path, project_imports, source_files

#: Library modules the TUI may import: each uses only the standard library and this list.
TUI_MAY_IMPORT = frozenset({"p2ptrain", "p2ptrain.status", "p2ptrain.paths", "p2ptrain.errors",
                            "p2ptrain.config.tomlfile", "p2ptrain.client.http", "p2ptrain.client.discovery"})
HEAVY = ("torch", "hivemind", "pydantic", "multiaddr", "numpy", "p2ptrain.config.schema", "p2ptrain.daemon")

PROBE = f"""
import sys
from pathlib import Path
import p2ptrain.tui.app as app_module
from p2ptrain.client.http import NodeClient
app = app_module.TopApp(NodeClient("http://127.0.0.1:9", None, timeout=0.5), Path("/nonexistent"))

async def leave(pilot):  # runs once the first screen is up: every widget of every view exists
    await pilot.pause(0.2)
    pilot.app.exit()

app.run(headless=True, size=(80, 24), auto_pilot=leave)
loaded = [m for m in {HEAVY!r} if m in sys.modules]
print(",".join(loaded))
"""


def test_tui_imports_no_heavy_modules() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"the TUI loaded: {result.stdout.strip()}"


def test_importtime_lists_no_heavy_modules() -> None:
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", "import p2ptrain.tui.app"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "p2ptrain.tui.app" in imported  # the probe itself works
    assert not {m for m in imported if m.split(".")[0] in ("torch", "hivemind", "pydantic")}


def test_tui_imports_only_its_own_modules_and_the_allowed_ones() -> None:
    seen = set()
    for path in source_files("p2ptrain.tui"):
        for name in project_imports(path):
            seen.add(name)
            assert name.startswith("p2ptrain.tui") or name in TUI_MAY_IMPORT, f"{path.relative_to(REPO)} imports {name}"
    assert {"p2ptrain.client.http", "p2ptrain.client.discovery", "p2ptrain.status"} <= seen  # the reader works


def test_allowed_library_modules_need_only_the_standard_library() -> None:
    for name in sorted(TUI_MAY_IMPORT):
        path = module_path(name)
        for imported in project_imports(path):
            assert imported in TUI_MAY_IMPORT, f"{name} imports {imported}"
        # Third-party imports would show up as neither stdlib nor project names.
        others = {m for m in imports_of(path) if not is_stdlib(m) and not m.startswith("p2ptrain")}
        assert others == set(), f"{name} imports {others}"
