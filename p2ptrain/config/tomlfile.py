"""Reading a node's TOML config file and its ``P2PTRAIN_<SECTION>__<KEY>`` environment overrides.

Standard library only: the validated config (:mod:`p2ptrain.config.schema`, pydantic) and node discovery
(:mod:`p2ptrain.client.discovery`, used by ``p2ptrain top``, which must not load pydantic) read the same
file and the same overrides through these functions, so they can never disagree about either.
Problems become a one-line :class:`~p2ptrain.errors.ConfigError` naming the file or variable.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from p2ptrain.errors import ConfigError, printable

ENV_PREFIX = "P2PTRAIN_"


def read_toml(path: Path) -> dict[str, Any]:
    """The parsed file; ConfigError (one line, starting with the path) when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        shown = printable(path)
        raise ConfigError(f"{shown}: no such file (create one with: p2ptrain config init {shown})") from None
    except IsADirectoryError:
        raise ConfigError(f"{printable(path)}: is a directory, expected a TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{printable(path)}: cannot read ({exc.__class__.__name__}: {printable(exc)})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{printable(path)}: not valid TOML: {printable(exc)}") from None


def parse_literal(raw: str) -> Any:
    """An override (an environment variable, ``--set``) is a TOML literal when it parses as one
    (``8``, ``true``, ``["a"]``), else the text."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_settings(environ: Mapping[str, str]) -> Iterator[tuple[str, str, str, str]]:
    """(variable name, section, key, raw value) of every ``P2PTRAIN_<SECTION>__<KEY>`` variable
    (section and key lower-cased); a malformed name is a ConfigError."""
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX):].partition("__")
        if not section or not key:
            raise ConfigError(f"environment variable {printable(name)}: expected {ENV_PREFIX}<SECTION>__<KEY>")
        yield name, section.lower(), key.lower(), raw


def env_overrides(environ: Mapping[str, str],
                  is_text: Callable[[str, str], bool] = lambda section, key: False) -> dict[str, dict[str, Any]]:
    """``P2PTRAIN_<SECTION>__<KEY>=value`` as ``{section: {key: value}}`` (names lower-cased).

    Values are TOML literals, except that a key for which ``is_text(section, key)`` holds keeps
    its text when the literal is not a string: ``P2PTRAIN_SWARM__RUN_ID=2024`` names a run, it
    is not the number 2024.  A malformed variable name is a ConfigError.
    """
    overrides: dict[str, dict[str, Any]] = {}
    for _, section, key, raw in _env_settings(environ):
        value = parse_literal(raw)
        if not isinstance(value, str) and is_text(section, key):
            value = raw
        overrides.setdefault(section, {})[key] = value
    return overrides


def env_variables(environ: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """Which variable set each ``(section, key)`` of :func:`env_overrides` (of two spellings of one
    setting, the one that won), so an error about a setting can name the variable."""
    return {(section, key): name for name, section, key, _ in _env_settings(environ)}


def with_overrides(data: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of ``data`` with ``overrides`` laid over its sections (the file is not modified)."""
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    for section, values in overrides.items():
        target = merged.setdefault(section, {})
        if isinstance(target, dict):
            target.update(values)
    return merged
