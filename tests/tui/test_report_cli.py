"""``p2ptrain report`` against the fake node over real HTTP: the text, the JSON, and one line per failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakenode import SELF_ID, FakeNode, status_script, swarm_view

from p2ptrain.cli.main import main
from p2ptrain.cli.report import loss_chart


def _report(node: FakeNode, tmp_path: Path, *extra: str) -> int:
    # A token file that does not exist: reads on loopback need none, and a state dir must not be guessed.
    return main(["report", "--url", node.url, "--token-file", str(tmp_path / "none"), *extra])


def test_text_report_has_the_loss_chart_contributors_and_coverage(fake_node: FakeNode, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(fake_node, tmp_path) == 0
    out = capsys.readouterr().out
    assert "Run bytelm-demo@mfvu2prtod62tp5pp2vgyrz7ty · model 9f2c4e1ab37d" in out
    lines = out.splitlines()
    chart = [line for line in lines if "┤" in line or "│" in line]
    assert len(chart) == 8 and chart[0].strip().startswith("5.600 ┤•")  # the highest loss first, top left
    assert any("└" in line for line in lines) and any("epoch 0" in line and line.rstrip().endswith("42")
                                                     for line in lines)
    table = lines[lines.index(next(line for line in lines if line.strip().startswith("peer"))):][:6]
    assert [row.split()[-4] for row in table[1:]] == ["2,073,600", "1,046,400", "880,128", "402,304", "0"]
    assert table[2].lstrip().startswith("▶ …" + SELF_ID[-8:])
    assert "Contributors: 4 of 5 peers, 4,402,432 samples contributed" in out
    assert "Data: the swarm's pass 3 has 45% of 20 shards read; pass 2: 100%" in out


def test_json_report_holds_the_same_figures(fake_node: FakeNode, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "report.json"
    assert _report(fake_node, tmp_path, "--json", str(target)) == 0
    assert f"written as JSON to {target}" in capsys.readouterr().out
    report = json.loads(target.read_text())
    status, view = status_script()[0], swarm_view()
    assert report["format"] == "p2ptrain-report"
    assert report["loss"]["epochs"] == list(status.loss_history_epochs)
    assert report["loss"]["training"] == pytest.approx(list(status.loss_history))
    assert report["loss"]["validation"] == list(status.val_loss_history)
    contributors = report["contributors"]
    assert [c["peer_id"] for c in contributors][:2] == [view.peers[1].peer_id, SELF_ID]
    assert sum(c["share"] for c in contributors) == pytest.approx(1.0)
    assert [c["this_node"] for c in contributors].count(True) == 1
    assert report["credit"] == {"samples_contributed": 1_046_400, "samples_not_averaged": 2_304,
                                "samples_processed": 1_100_000, "swarm_samples_contributed": 4_402_432,
                                "contributors": 4}
    assert report["coverage"]["swarm_coverage"] == 0.45 and report["coverage"]["swarm_last_pass_coverage"] == 1.0
    # "-" prints the JSON instead of the text.
    assert _report(fake_node, tmp_path, "--json", "-") == 0
    assert json.loads(capsys.readouterr().out)["credit"]["contributors"] == 4


def test_no_node_is_one_line_and_exit_69(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = FakeNode().start()
    node.stop()  # the port is closed now: connection refused
    assert _report(node, tmp_path) == 69
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"p2ptrain report: no node answers at {node.url} (")
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("url", ["notaurl", "ftp://127.0.0.1:41480", "http://", "http://127.0.0.1:port"])
def test_a_url_that_is_not_one_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["report", "--url", url, "--token-file", str(tmp_path / "none")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument --url: not a node API URL: {url!r} (example: http://127.0.0.1:41480)" in err


def test_a_bad_answer_or_an_unwritable_file_is_one_line(fake_node: FakeNode, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    fake_node.mode = "garbage"
    assert _report(fake_node, tmp_path) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not JSON" in err
    fake_node.mode = "ok"
    assert _report(fake_node, tmp_path, "--json", str(tmp_path / "missing" / "r.json")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err and not (tmp_path / "missing").exists()


def test_loss_chart_places_points_and_says_when_there_are_none() -> None:
    lines = loss_chart([0, 5, 10], [3.0, 2.0, 1.0], [8], [2.0], width=11, height=3)
    assert lines[0] == "3.000 ┤•"
    assert lines[1] == "      │     •  o"
    assert lines[2] == "1.000 ┤          •"
    assert lines[3] == "      └" + "─" * 11 and lines[4] == "       epoch 0  10"
    assert loss_chart([], []) == ["(no loss recorded yet)"]
    flat = loss_chart([0, 1], [2.0, 2.0], width=4, height=3)
    assert flat[1] == "      │•  •"  # a flat curve sits in the middle


def test_report_starts_without_heavy_modules() -> None:
    import subprocess
    import sys

    probe = ("import sys, p2ptrain.cli.report\n"
             "print(','.join(m for m in ('torch', 'hivemind', 'pydantic', 'textual', 'p2ptrain.daemon') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr
