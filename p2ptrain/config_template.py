"""``p2ptrain config init`` and ``config check``: the commented template and the validator.

The template is generated from the config models themselves (defaults and field docstrings),
so it can never drift from what the node actually accepts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from p2ptrain.atomicfile import write_atomic
from p2ptrain.config import ConfigError, NodeConfig, load_config
from p2ptrain.errors import printable

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
    if type(section).__doc__:
        lines.insert(0, f"# {type(section).__doc__.strip().splitlines()[0]}")
    for field_name, info in type(section).model_fields.items():
        for doc_line in (info.description or "").strip().splitlines():
            lines.append(f"# {doc_line.strip()}")
        literal = _toml_value(getattr(section, field_name))
        lines.append(f"#{field_name} = {literal}" if literal is not None else f"#{field_name} = ...  (unset)")
        lines.append("")
    return lines


def render_template() -> str:
    """The full commented template, every section and field with its default."""
    defaults = NodeConfig()
    lines = [_HEADER]
    for name in type(defaults).model_fields:
        lines.extend(_section_lines(name, getattr(defaults, name)))
    return "\n".join(lines).rstrip() + "\n"


def init_command(args: argparse.Namespace) -> int:
    text = render_template()
    path: Path | None = args.path
    if path is None:
        sys.stdout.write(text)
        return 0
    if path.exists() and not args.force:
        print(f"p2ptrain: {path} already exists (use --force to overwrite)", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))
    print(f"wrote {path}")
    return 0


def check_command(args: argparse.Namespace) -> int:
    config = load_config(args.path)  # ConfigError -> one line + exit 78 in the CLI
    if config.swarm.run is None and config.swarm.manifest is None and config.swarm.invite is None:
        print(f"{printable(args.path)}: ok (run_id={config.swarm.run_id}, state_dir={printable(config.state_dir())})")
        return 0
    # An owned run: check the manifest and invite as the node would, and show what it would use.
    from p2ptrain.ownedrun import prepare_run  # hivemind: only for owned runs
    from p2ptrain.run_cli import show_lines
    from p2ptrain.swarm import identity_path

    plan = prepare_run(config, identity_path(config.state_dir()))
    assert plan is not None
    if plan.excluded_by is not None:
        raise ConfigError(f"{plan.excluded_by}; the node asks the swarm for a newer version that readmits it "
                          "(p2ptrain run update --unrevoke/--unban) before it gives up")
    print(f"{printable(args.path)}: ok (run {plan.ref}, run_id={plan.config.swarm.run_id}, "
          f"state_dir={printable(config.state_dir())})")
    if plan.manifest is None:
        print(f"the manifest of run {plan.ref} is fetched from the swarm when the node joins; to see it now: "
              f"p2ptrain run show {plan.ref} --join ADDR")
    else:
        print("\n".join(show_lines(plan.manifest, plan.source)))
    return 0
