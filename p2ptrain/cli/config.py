"""``p2ptrain config init`` and ``config check``: the commented template and the validator.

The template is generated from the config models themselves (defaults and field docstrings),
so it can never drift from what the node actually accepts.  ``config check`` gathers every problem
it finds into one list (each source of problems adds to it) and prints them all, one line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2ptrain.atomicfile import write_atomic
from p2ptrain.config.schema import ConfigError, NodeConfig, load_config
from p2ptrain.config.template import render_template
from p2ptrain.errors import EX_CONFIG, EX_FAILURE, EX_OK, error_line, printable

#: ``config check --json``: bump when a field's meaning changes (fields are only added).
JSON_SCHEMA_VERSION = 1


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


@dataclass
class ConfigCheck:
    """What ``config check`` found: every problem (one line each), and what the node would use."""

    path: Path
    problems: list[str] = field(default_factory=list)
    config: NodeConfig | None = None
    run: str | None = None
    run_id: str | None = None
    notes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        state_dir = str(self.config.state_dir()) if self.config is not None else None
        return {"schema_version": JSON_SCHEMA_VERSION, "path": str(self.path), "ok": not self.problems,
                "problems": self.problems, "run_id": self.run_id, "run": self.run, "state_dir": state_dir,
                "manifest": self.manifest}


def check_config(path: Path) -> ConfigCheck:
    """Check ``path`` as the node would read it; problems are collected, not raised."""
    check = ConfigCheck(path)
    try:
        check.config = load_config(path)
    except ConfigError as error:
        check.problems.extend(error.problems)
        return check
    check.run_id = check.config.swarm.run_id
    for source in (_owned_run_problems, _task_code_problems, _data_problems):  # each returns the problems it finds
        check.problems.extend(source(check))
    return check


def _owned_run_problems(check: ConfigCheck) -> list[str]:
    """An owned run: the manifest and invite as the node would check them, and what it would use."""
    config = check.config
    assert config is not None
    if config.swarm.run is None and config.swarm.manifest is None and config.swarm.invite is None:
        return []
    from p2ptrain.cli.run import manifest_json, show_lines
    from p2ptrain.swarm.identity import identity_path
    from p2ptrain.swarm.ownedrun import prepare_run  # hivemind: only for owned runs

    try:
        plan = prepare_run(config, identity_path(config.state_dir()))
    except ConfigError as error:
        return list(error.problems)
    assert plan is not None
    check.run, check.run_id = str(plan.ref), plan.config.swarm.run_id
    if plan.excluded_by is not None:
        return [f"{plan.excluded_by}; the node asks the swarm for a newer version that readmits it "
                "(p2ptrain run update --unrevoke/--unban) before it gives up"]
    if plan.manifest is None:
        check.notes.append(f"the manifest of run {plan.ref} is fetched from the swarm when the node joins; to see "
                           f"it now: p2ptrain run show {plan.ref} --join ADDR")
    else:
        check.notes.extend(show_lines(plan.manifest, plan.source))
        check.manifest = manifest_json(plan.manifest, plan.source)
    return []


def check_command(args: argparse.Namespace) -> int:
    check = check_config(args.path)
    where = printable(args.path)
    if getattr(args, "json", False):
        print(json.dumps(check.to_json(), sort_keys=True, default=str))
        if check.problems:
            count = len(check.problems)
            print(error_line(ConfigError(f"{where}: {count} problem{'s' if count > 1 else ''}")), file=sys.stderr)
            return EX_CONFIG
        return EX_OK
    if check.problems:
        for problem in check.problems:
            print(error_line(ConfigError(problem)), file=sys.stderr)
        return EX_CONFIG
    config = check.config
    assert config is not None
    run = f"run {check.run}, " if check.run else ""
    print(f"{where}: ok ({run}run_id={check.run_id}, state_dir={printable(config.state_dir())})")
    if check.notes:
        print("\n".join(check.notes))
    return EX_OK


def _task_code_problems(check: ConfigCheck) -> list[str]:
    """A user task: its module imports, and its code is the run's (``task.code_sha256``), as a starting
    node checks them."""
    config = check.config
    assert config is not None
    if config.task.entrypoint is None:
        return []
    from p2ptrain.tasks.loader import checked_code_digest  # torch: only for a user task

    try:
        checked_code_digest(config.task)
    except ConfigError as error:
        return list(error.problems)
    return []


def _data_problems(check: ConfigCheck) -> list[str]:
    """Read the first block of the data as a starting node would; its problems are the node's own lines
    (in an owned run, the data of the run's config)."""
    from p2ptrain.data.text import data_problems  # torch: only once the config itself is good

    config = check.config
    assert config is not None
    return data_problems(config.task, config.state_dir() / "data-cache")
