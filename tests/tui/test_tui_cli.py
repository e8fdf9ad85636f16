"""``p2ptrain top`` on the command line: flags parse, a bad --config is one line and exit 78."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.cli.main import build_parser, main


def test_top_flags_parse() -> None:
    args = build_parser().parse_args(["top", "--url", "http://127.0.0.1:5000", "--token-file", "/t",
                                      "--config", "/c.toml"])
    assert (args.url, args.token_file, args.config) == ("http://127.0.0.1:5000", Path("/t"), Path("/c.toml"))
    assert callable(args.handler)


@pytest.mark.parametrize("content, error", [(None, "no such file"), ("[node\n", "not valid TOML")])
def test_bad_config_is_one_line_and_exit_78(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            content: str | None, error: str) -> None:
    config = tmp_path / "node.toml"
    if content is not None:
        config.write_text(content)
    assert main(["top", "--config", str(config)]) == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and error in err and str(config) in err
