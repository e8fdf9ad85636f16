"""A config problem as the one line a user sees: where the bad setting came from (the file, or the
environment variable that set it), which setting (the dotted field), and what is wrong with it.

User text in it (a file name, a TOML key, a variable's name) is quoted when it holds a newline or a
control character (:func:`p2ptrain.errors.printable`), so the line stays one line.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def describe_invalid(error: ValidationError, source: str) -> str:
    """``source: section.key: problem``, for the first of ``error``'s problems (and how many more)."""
    more = len(error.errors()) - 1
    suffix = f" (+{more} more problem{'s' if more > 1 else ''})" if more else ""
    return describe_problem(error.errors()[0], source) + suffix


def describe_problem(item: Mapping[str, Any], source: str) -> str:
    """``source: section.key: problem`` for one of a ValidationError's ``errors()``."""
    # A TOML key may hold newlines or control characters: quoted, so the error stays one line.
    field = ".".join(printable(part) for part in item["loc"]) or "(top level)"
    kind = item["type"]
    if kind == "extra_forbidden":
        problem = "unknown key"
    elif kind == "missing":
        problem = "required"
    else:
        problem = item["msg"].removeprefix("Value error, ")
        if "input" in item and not isinstance(item["input"], dict | list):
            problem += f" (got {item['input']!r})"
    problem = " ".join(problem.split())
    return f"{source}: {field}: {problem}"
