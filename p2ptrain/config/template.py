"""The commented config template ``p2ptrain config init`` and ``service install`` write: every
section and key with its default and its description, read from the config's own fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from p2ptrain.config.schema import NodeConfig

_HEADER = """\
# p2ptrain node configuration.
#
# Every key below is shown with its default value, commented out: uncomment what you change.
# Any key can also be set from the environment as P2PTRAIN_<SECTION>__<KEY>, for example
#   P2PTRAIN_SWARM__INITIAL_PEERS='["/ip4/203.0.113.7/tcp/41400/p2p/12D3KooW..."]'
# Validate with: p2ptrain config check <this file>
"""


def _toml_value(value: Any) -> str | None:
    """TOML literal for a default, or None when the default means "unset"."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) or '""' for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def _section_lines(name: str, section: BaseModel) -> list[str]:
    lines = [f"[{name}]"]
    doc = type(section).__doc__
    if doc:
        lines.insert(0, f"# {doc.strip().splitlines()[0]}")
    for field_name, info in type(section).model_fields.items():
        for doc_line in (info.description or "").strip().splitlines():
            lines.append(f"# {doc_line.strip()}")
        literal = _toml_value(getattr(section, field_name))
        key = info.alias or field_name  # the name the file uses (task.model_config: pydantic reserves it)
        lines.append(f"#{key} = {literal}" if literal is not None else f"#{key} = ...  (unset)")
        lines.append("")
    return lines


def render_template() -> str:
    """The full commented template, every section and field with its default."""
    defaults = NodeConfig()
    lines = [_HEADER]
    for name in type(defaults).model_fields:
        lines.extend(_section_lines(name, getattr(defaults, name)))
    return "\n".join(lines).rstrip() + "\n"
