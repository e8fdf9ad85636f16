"""``p2ptrain demo --private`` through the front door, as short as it can be: one invited node, a
node without an invite that is refused, the summary, exit 0."""

from __future__ import annotations

import re

import pytest

from p2ptrain.cli import demo
from p2ptrain.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_private_demo_refuses_the_uninvited_node_and_sums_up(tmp_path, monkeypatch, capsys):
    # The stranger gives up after 3 s instead of 10 and the table refreshes every second, so the
    # refusal lands well inside a short run.
    monkeypatch.setattr(demo, "STRANGER_BOOTSTRAP", 3.0)
    monkeypatch.setattr(demo, "REFRESH_SECONDS", 1.0)
    assert main(["demo", "--private", "--peers", "1", "--duration", "25", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "created an invite-only run demo@" in out
    assert ">>> stranger exited with code 1\n" in out, out
    assert ("so it was refused: it never joined a group or got any state (no state directory, no averaging round, "
            "no download)") in out, out
    last = re.search(r"its last line: (.*)", out)
    assert last and "no initial peer answered our DHT requests" in last[1] and "may be invite-only" in last[1], out
    refused = re.search(r"the invited nodes refused (\d+) of its DHT requests", out)
    assert refused and int(refused[1]) >= 1, out
    summary = out[out.index("=== p2ptrain demo summary ==="):]
    assert "admission          invited nodes only" in summary and "stranger (no invite) was refused" in summary
    assert not (tmp_path / "stranger" / "state").exists()  # refused before it wrote anything
