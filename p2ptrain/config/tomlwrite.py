"""A small, deterministic TOML writer for the values p2ptrain writes (manifests).

The output is a function of the values alone (same values, same bytes), which is what lets a
signed manifest be checked byte for byte: every table's keys, inline ones included, are written in
sorted order, never in the order a mapping happened to be built or parsed in (two orders would be
two files for one signed meaning). Only what configs hold is supported: strings, booleans,
integers, floats, arrays and inline tables; ``None`` has no TOML form and is left out by callers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_string(text: str) -> str:
    """A TOML basic string; control characters (and DEL) escaped, everything else as is."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"integer {value} does not fit TOML's 64 bits")
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest repr that round-trips; always has '.', 'e' or is inf/nan
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = [f"{toml_key(str(k))} = {toml_value(v)}" for k, v in _sorted_items(value) if v is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _sorted_items(values: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    return sorted(values.items(), key=lambda item: str(item[0]))


def toml_table(name: str, values: Mapping[str, Any], *, sort_keys: bool = True) -> list[str]:
    """``[name]`` and one ``key = value`` line per non-None value, keys sorted (``sort_keys=False``: in
    the mapping's order, for files people read rather than verify, such as a node config)."""
    items = _sorted_items(values) if sort_keys else list(values.items())
    lines = [f"[{name}]"]
    lines.extend(f"{toml_key(key)} = {toml_value(value)}" for key, value in items if value is not None)
    return lines
