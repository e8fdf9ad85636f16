"""``p2ptrain run --log-level``: overrides node.log_level, also for reloads; bad values are refused."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain.cli.main import LOG_LEVEL_ENV, _with_log_level, build_parser
from p2ptrain.config.schema import load_config


def test_flag_parses_case_insensitively_and_defaults_to_none() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "--log-level", "DEBUG"]).log_level == "debug"
    assert parser.parse_args(["run"]).log_level is None


def test_flag_overrides_the_config_file_and_survives_a_reload(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOG_LEVEL_ENV, "INFO")  # recorded, so the flag's own setting is undone afterwards
    monkeypatch.delenv(LOG_LEVEL_ENV)
    path = tmp_path / "node.toml"
    path.write_text('[node]\nlog_level = "WARNING"\n')
    seen: list[str] = []

    def handler(args: argparse.Namespace) -> int:
        seen.append(load_config(args.config).node.log_level)
        seen.append(load_config(args.config).node.log_level)  # what a SIGHUP reload reads
        return 0

    assert _with_log_level(handler)(build_parser().parse_args(["run", "--config", str(path)])) == 0
    assert seen == ["WARNING", "WARNING"]
    assert _with_log_level(handler)(build_parser().parse_args(
        ["run", "--config", str(path), "--log-level", "debug"])) == 0
    assert seen[2:] == ["DEBUG", "DEBUG"]
    assert os.environ[LOG_LEVEL_ENV] == "DEBUG"


def test_bad_level_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "run", "--log-level", "loud"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert "argument --log-level: invalid choice: 'loud' (choose from 'debug', 'info', 'warning', 'error')" \
        in result.stderr



def test_log_format_flag_overrides_node_log_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from p2ptrain.cli.main import LOG_FORMAT_ENV

    monkeypatch.setenv(LOG_FORMAT_ENV, "auto")
    monkeypatch.delenv(LOG_FORMAT_ENV)
    path = tmp_path / "node.toml"
    path.write_text('[node]\nlog_format = "human"\n')
    seen: list[str] = []

    def handler(args: argparse.Namespace) -> int:
        seen.append(load_config(args.config).node.log_format)
        return 0

    for command in (["run"], ["fetch", "out"]):
        assert _with_log_level(handler)(build_parser().parse_args([*command, "-c", str(path)])) == 0
        assert build_parser().parse_args([*command, "--log-format", "JSON"]).log_format == "json"
        assert _with_log_level(handler)(build_parser().parse_args(
            [*command, "-c", str(path), "--log-format", "json"])) == 0
        monkeypatch.delenv(LOG_FORMAT_ENV)
    assert seen == ["human", "json", "human", "json"]
