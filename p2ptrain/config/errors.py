"""A config problem as the one line a user sees: where the bad setting came from (the file, or the
environment variable that set it), which setting (the dotted field), and what is wrong with it.

User text in it (a file name, a TOML key, a variable's name) is quoted when it holds a newline or a
control character (:func:`p2ptrain.errors.printable`), so the line stays one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from p2ptrain.errors import printable


def source_of(loc: tuple[int | str, ...], origin: str, data: Mapping[str, Any],
              set_by: Mapping[tuple[str, str], str]) -> str:
    """Where the setting at ``loc`` came from: the environment variable that set it (``set_by``:
    (section, key) -> variable, :func:`p2ptrain.config.tomlfile.env_variables`), else ``origin``, the file
    whose parsed contents are ``data``."""
    name = set_by.get((str(loc[0]), str(loc[1]))) if len(loc) >= 2 else None
    if len(loc) == 1 and loc[0] not in data:  # a section that only the environment has
        name = next((variable for (section, _), variable in set_by.items() if section == loc[0]), None)
    return f"environment variable {printable(name)}" if name is not None else printable(origin)


def describe_problem(problem: Mapping[str, Any]) -> str:
    """``section.key: what is wrong``, for one of a ValidationError's problems."""
    # A TOML key may hold newlines or control characters: quoted, so the error stays one line.
    field = ".".join(printable(part) for part in problem["loc"]) or "(top level)"
    kind = problem["type"]
    if kind == "extra_forbidden":
        text = "unknown key"
    elif kind == "missing":
        text = "required"
    else:
        text = problem["msg"].removeprefix("Value error, ")
        if "input" in problem and not isinstance(problem["input"], dict | list):
            text += f" (got {problem['input']!r})"
    return f"{field}: {' '.join(text.split())}"


def describe_all(error: ValidationError, source: Callable[[tuple[int | str, ...]], str]) -> list[str]:
    """Every one of ``error``'s problems as ``source: section.key: problem`` (``source``: where the
    setting at a location came from)."""
    return [f"{source(tuple(problem['loc']))}: {describe_problem(problem)}" for problem in error.errors()]


def describe_invalid(error: ValidationError, source: str) -> str:
    """``source: section.key: problem``, for the first of ``error``'s problems (and how many more)."""
    more = len(error.errors()) - 1
    suffix = f" (+{more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {describe_problem(error.errors()[0])}{suffix}"
