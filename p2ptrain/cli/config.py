"""``p2ptrain config init`` and ``config check``: the commented template and the validator.

The template is generated from the config models themselves (defaults and field docstrings),
so it can never drift from what the node actually accepts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from p2ptrain.atomicfile import write_atomic
from p2ptrain.config.schema import ConfigError, NodeConfig, load_config
from p2ptrain.config.template import render_template
from p2ptrain.errors import EX_FAILURE, EX_OK, printable


def init_command(args: argparse.Namespace) -> int:
    text = render_template()
    path: Path | None = args.path
    if path is None:
        sys.stdout.write(text)
        return EX_OK
    if path.exists() and not args.force:
        print(f"p2ptrain: {path} already exists (use --force to overwrite)", file=sys.stderr)
        return EX_FAILURE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))
    print(f"wrote {path}")
    return EX_OK


def check_command(args: argparse.Namespace) -> int:
    config = load_config(args.path)  # ConfigError -> one line + exit 78 in the CLI
    if config.swarm.run is None and config.swarm.manifest is None and config.swarm.invite is None:
        _check_data(config)
        print(f"{printable(args.path)}: ok (run_id={config.swarm.run_id}, state_dir={printable(config.state_dir())})")
        return EX_OK
    # An owned run: check the manifest and invite as the node would, and show what it would use.
    from p2ptrain.cli.run import show_lines
    from p2ptrain.swarm.identity import identity_path
    from p2ptrain.swarm.ownedrun import prepare_run  # hivemind: only for owned runs

    plan = prepare_run(config, identity_path(config.state_dir()))
    assert plan is not None
    if plan.excluded_by is not None:
        raise ConfigError(f"{plan.excluded_by}; the node asks the swarm for a newer version that readmits it "
                          "(p2ptrain run update --unrevoke/--unban) before it gives up")
    _check_data(plan.config)
    print(f"{printable(args.path)}: ok (run {plan.ref}, run_id={plan.config.swarm.run_id}, "
          f"state_dir={printable(config.state_dir())})")
    if plan.manifest is None:
        print(f"the manifest of run {plan.ref} is fetched from the swarm when the node joins; to see it now: "
              f"p2ptrain run show {plan.ref} --join ADDR")
    else:
        print("\n".join(show_lines(plan.manifest, plan.source)))
    return EX_OK


def _check_data(config: NodeConfig) -> None:
    """Read the first block of the data as a starting node would; its problems are the node's own lines."""
    from p2ptrain.data.text import data_problems  # torch: only once the config itself is good

    problems = data_problems(config.task, config.state_dir() / "data-cache")
    if problems:
        raise ConfigError("; ".join(problems))
