"""``p2ptrain top`` must start fast: the TUI never loads torch, hivemind, or the pydantic config."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "hivemind", "pydantic", "multiaddr", "numpy", "p2ptrain.config", "p2ptrain.daemon")

PROBE = f"""
import sys
from pathlib import Path
import p2ptrain.tui.app as app_module
from p2ptrain.tui.client import NodeClient
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
