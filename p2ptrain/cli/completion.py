"""Shell completion of commands, options and paths through argcomplete, which is optional: without it
the CLI works the same and ``p2ptrain completion`` says how to get it.

argcomplete runs the program with ``_ARGCOMPLETE`` set and the command line in ``COMP_LINE``; the
front door hands it the parser before parsing anything.  ``p2ptrain run ACTION`` has a parser of its
own (:func:`p2ptrain.cli.main.build_run_parser`), so a line past ``run ACTION`` is completed with that
one, as if ``run`` were not there.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from p2ptrain.errors import EX_OK, EX_UNAVAILABLE

#: What goes into the shell's rc file (argcomplete 3 speaks bash and zsh with the same script).
SHELL_LINES = {
    "bash": 'eval "$(register-python-argcomplete p2ptrain)"',
    "zsh": 'eval "$(register-python-argcomplete p2ptrain)"',
}


def completing(environ: MutableMapping[str, str]) -> bool:
    return "_ARGCOMPLETE" in environ


def autocomplete(build_main: Callable[[], argparse.ArgumentParser], build_run: Callable[[], argparse.ArgumentParser],
                 run_actions: Sequence[str], environ: MutableMapping[str, str] | None = None,
                 **options: Any) -> None:
    """Answer the shell's completion request and exit (argcomplete's way), or return at once when there
    is none or argcomplete is not installed.  ``options`` go to ``argcomplete.autocomplete`` (tests pass
    ``output_stream`` and ``exit_method``)."""
    environ = os.environ if environ is None else environ
    if not completing(environ):
        return
    try:
        import argcomplete
    except ImportError:
        return
    parser = build_main()
    line = environ.get("COMP_LINE", "")
    point = int(environ.get("COMP_POINT", len(line)))
    words = line[:point].split()
    past_action = len(words) > 3 or (len(words) == 3 and line[:point].endswith(" "))
    if len(words) >= 3 and words[1] == "run" and words[2] in run_actions and past_action:
        start = line.index(" run ") if " run " in line else -1
        if 0 <= start < point:
            environ["COMP_LINE"] = line[:start] + line[start + 4:]
            environ["COMP_POINT"] = str(point - 4)
            parser = build_run()
    argcomplete.autocomplete(parser, **options)


def completion_command(args: argparse.Namespace) -> int:
    """``p2ptrain completion bash|zsh``: the line to put in the shell's rc file."""
    try:
        import argcomplete  # noqa: F401 (only whether it is there)
    except ImportError:
        print("p2ptrain: shell completion needs argcomplete: pip install argcomplete (then run this again)",
              file=sys.stderr)
        return EX_UNAVAILABLE
    print(f"# add to ~/.{args.shell}rc:")
    print(SHELL_LINES[args.shell])
    return EX_OK
