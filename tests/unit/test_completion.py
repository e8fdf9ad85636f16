"""Shell completion (argcomplete): command names, options, the run owner's actions; works without it."""

from __future__ import annotations

import builtins
import io
from typing import Any

import pytest

from p2ptrain.cli import completion
from p2ptrain.cli.main import RUN_ACTIONS, build_parser, build_run_parser, main

finders = pytest.importorskip("argcomplete.finders")


class Exited(Exception):
    pass


def _complete(line: str) -> list[str]:
    environ = {"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n"}
    out = io.StringIO()

    def leave(code: int = 0) -> None:
        raise Exited(code)

    with pytest.MonkeyPatch.context() as patch:
        for key, value in environ.items():
            patch.setenv(key, value)
        # argcomplete's debug output goes to fd 9, which it closes afterwards: pytest may hold that one
        patch.setattr(finders.CompletionFinder, "_init_debug_stream", lambda self: setattr(finders._io, "debug_stream",
                                                                                            io.StringIO()))
        import os

        with pytest.raises(Exited):
            completion.autocomplete(build_parser, build_run_parser, RUN_ACTIONS, os.environ, output_stream=out,
                                    exit_method=leave)
    return sorted(word.strip() for word in out.getvalue().split("\n") if word.strip())


def test_command_names_and_options_complete() -> None:
    commands = _complete("p2ptrain ")
    assert {"run", "checkpoint", "service", "config", "completion", "report"} <= set(commands)
    assert "--json" in _complete("p2ptrain config check --j")
    assert {"install", "status", "uninstall"} <= set(_complete("p2ptrain service "))


def test_the_run_owner_s_actions_complete_with_their_own_parser() -> None:
    assert "--json" in _complete("p2ptrain run show --j")
    assert "--from-config" in _complete("p2ptrain run init --from")


def test_no_completion_request_returns_at_once() -> None:
    completion.autocomplete(build_parser, build_run_parser, RUN_ACTIONS, {})  # returns: nothing asked


def test_completion_command_prints_the_rc_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    assert 'eval "$(register-python-argcomplete p2ptrain)"' in capsys.readouterr().out
    assert main(["completion", "zsh"]) == 0


def test_without_argcomplete_the_cli_works_and_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    real_import = builtins.__import__

    def no_argcomplete(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "argcomplete":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_argcomplete)
    asked = {"_ARGCOMPLETE": "1", "COMP_LINE": "p2ptrain "}
    completion.autocomplete(build_parser, build_run_parser, RUN_ACTIONS, asked)  # returns: nothing to answer with
    assert main(["completion", "bash"]) == 69
    assert "pip install argcomplete" in capsys.readouterr().err
