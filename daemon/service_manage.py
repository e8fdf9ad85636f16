"""``p2ptrain service uninstall`` and ``service status``: undo an install, and show a service's state.

Both find the unit where ``service install`` puts it (the same plan, :func:`plan_install`).  systemctl
is reached only through a :data:`Systemctl` runner (argv -> exit code and output), so tests hand in
a fake and never need a running systemd.  ``uninstall`` stops and disables the service, removes the
unit file and reloads systemd; the node's config, the sysusers file and its state directory
(identity, checkpoints) are kept, and it says so.  ``status`` shows the unit's properties
(``systemctl show``) and, when its API answers, the node's own status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2ptrain.daemon.service_install import INSTANCE_NAME, file_error_line, plan_install
from p2ptrain.errors import EX_CANTCREAT, EX_OK, EX_UNAVAILABLE, EX_USAGE

#: ``systemctl`` with these arguments -> (exit code, stdout and stderr).
Systemctl = Callable[[Sequence[str]], tuple[int, str]]

#: What ``service status`` asks systemd about the unit (``systemctl show --property=...``).
SHOWN_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "Result", "MainPID", "NRestarts",
                    "ExecMainStartTimestamp", "StatusText", "FragmentPath")
#: A systemctl call that does not return in this long is a systemd that does not answer.
SYSTEMCTL_TIMEOUT = 60.0
#: ``service status --json``: bump when a field's meaning changes (fields are only added).
JSON_SCHEMA_VERSION = 1


def run_systemctl(argv: Sequence[str]) -> tuple[int, str]:
    """The real runner: ``systemctl ARGV``; a missing systemctl or one that hangs is a failure, not a traceback."""
    try:
        done = subprocess.run(["systemctl", *argv], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT,
                              check=False)
    except FileNotFoundError:
        return 127, "systemctl not found (is this a systemd machine?)"
    except subprocess.TimeoutExpired:
        return 124, f"systemctl did not answer within {SYSTEMCTL_TIMEOUT:.0f}s"
    return done.returncode, (done.stdout + done.stderr).strip()


@dataclass(frozen=True)
class Installed:
    """Where ``service install`` put a service's files, and how systemctl names it."""

    unit_file: Path
    config: Path
    service: str
    scope: tuple[str, ...]  # ("--user",) for a user service
    state_dir: str

    def systemctl(self, *argv: str) -> list[str]:
        return [*self.scope, *argv]


def locate(args: argparse.Namespace, environ: Mapping[str, str]) -> Installed:
    instance: str | None = args.instance
    plan = plan_install(user=args.user, instance=instance, exec_prefix=[sys.executable], environ=environ,
                        root=args.root)
    unit_file, config = plan.files[0].path, plan.files[-1].path
    service = f"p2ptrain@{instance}.service" if instance else "p2ptrain.service"
    state = f"p2ptrain/{instance}" if instance else "p2ptrain"
    if args.user:
        state_home = environ.get("XDG_STATE_HOME") or f"{environ.get('HOME') or Path.home()}/.local/state"
        state_dir = f"{state_home}/{state}"
    else:
        state_dir = f"/var/lib/{state}"
    return Installed(unit_file, config, service, ("--user",) if args.user else (), state_dir)


def _check_instance(args: argparse.Namespace) -> int:
    if args.instance is not None and not INSTANCE_NAME.fullmatch(args.instance):
        print(f"p2ptrain: --instance {args.instance!r}: use 1-64 letters, digits, '_', '.', '-'", file=sys.stderr)
        return EX_USAGE
    return EX_OK


def _other_instances(installed: Installed) -> list[str]:
    """Configs of other instances beside this one's: the template unit is theirs too."""
    try:
        return sorted(p.stem for p in installed.config.parent.glob("*.toml")
                      if p != installed.config and p.name != "node.toml")
    except OSError:
        return []


def uninstall(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
              systemctl: Systemctl = run_systemctl) -> int:
    if code := _check_instance(args):
        return code
    installed = locate(args, os.environ if environ is None else environ)
    if not installed.unit_file.exists():
        print(f"p2ptrain: nothing to uninstall: no unit at {installed.unit_file} (p2ptrain service install "
              "writes it; --user or --instance NAME for those)", file=sys.stderr)
        return EX_USAGE
    code, output = systemctl(installed.systemctl("disable", "--now", installed.service))
    if code == 0:
        print(f"stopped and disabled {installed.service}")
    else:  # not loaded, or no systemd here: the file still goes, systemd forgets it at the reload
        print(f"p2ptrain: warning: systemctl disable --now {installed.service}: {_one_line(output)}", file=sys.stderr)
    others = _other_instances(installed) if args.instance else []
    if others:
        print(f"kept     {installed.unit_file} (the template of other instances: {', '.join(others)})")
    else:
        try:
            installed.unit_file.unlink()
        except OSError as exc:
            print(file_error_line("remove", installed.unit_file, exc, user=args.user), file=sys.stderr)
            return EX_CANTCREAT
        print(f"removed  {installed.unit_file}")
        code, output = systemctl(installed.systemctl("daemon-reload"))
        if code != 0:
            print(f"p2ptrain: warning: systemctl daemon-reload: {_one_line(output)}", file=sys.stderr)
    print(f"kept     {installed.config} (the node's config) and the state directory {installed.state_dir} "
          "(identity, checkpoints, API token): remove them yourself if the node will not come back")
    return EX_OK


def parse_show(output: str) -> dict[str, str]:
    """``systemctl show``'s ``Key=Value`` lines as a mapping."""
    properties = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            properties[key.strip()] = value.strip()
    return properties


def _node_status(args: argparse.Namespace, installed: Installed) -> tuple[dict[str, Any] | None, str]:
    """The node's own status over its API, or (None, why not)."""
    from p2ptrain.client.discovery import DiscoveryError, TokenUnavailable, discover_node, read_token
    from p2ptrain.client.http import NodeClient, NodeError

    config = args.config if args.config is not None else (installed.config if installed.config.is_file() else None)
    try:
        url, token_path = discover_node(args.url, args.token_file, config)
    except DiscoveryError as error:
        return None, f"cannot read config: {error}"
    try:
        token: str | None = read_token(token_path)
    except TokenUnavailable:
        token = None  # reads need no token unless the node asks for one
    try:
        status = NodeClient(url, token, timeout=5.0).status()
    except NodeError as error:
        return None, f"no answer at {url} ({error})"
    return {"url": url, **status.to_dict()}, ""


def status(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
           systemctl: Systemctl = run_systemctl,
           node_status: Callable[[argparse.Namespace, Installed], tuple[dict[str, Any] | None, str]] = _node_status,
           ) -> int:
    """Exit 0 when the unit is active, 69 (EX_UNAVAILABLE) when it is not installed, not running or unknown."""
    if code := _check_instance(args):
        return code
    installed = locate(args, os.environ if environ is None else environ)
    code, output = systemctl(installed.systemctl("show", installed.service,
                                                 f"--property={','.join(SHOWN_PROPERTIES)}"))
    unit = parse_show(output) if code == 0 else {}
    systemd_error = "" if code == 0 else _one_line(output)
    node, node_error = node_status(args, installed) if unit.get("ActiveState") == "active" else (None, "not running")
    active = unit.get("ActiveState") == "active"
    if args.json:
        print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, "service": installed.service,
                          "unit_file": str(installed.unit_file), "installed": installed.unit_file.exists(),
                          "unit": unit, "systemd_error": systemd_error or None, "node": node,
                          "node_error": node_error or None}, sort_keys=True))
    else:
        for line in _status_lines(installed, unit, systemd_error, node, node_error):
            print(line)
    if systemd_error:
        print(f"p2ptrain: systemctl show {installed.service}: {systemd_error}", file=sys.stderr)
    return EX_OK if active else EX_UNAVAILABLE


def _status_lines(installed: Installed, unit: Mapping[str, str], systemd_error: str, node: Mapping[str, Any] | None,
                  node_error: str) -> list[str]:
    where = installed.unit_file if installed.unit_file.exists() else f"not installed ({installed.unit_file} is absent)"
    lines = [f"service   {installed.service}", f"unit file {where}"]
    if unit:
        state = f"{unit.get('ActiveState', '?')} ({unit.get('SubState', '?')})"
        lines += [f"systemd   {unit.get('LoadState', '?')}, {state}, {unit.get('UnitFileState') or 'no unit file'}",
                  f"main pid  {unit.get('MainPID', '?')}, restarts {unit.get('NRestarts', '?')}, "
                  f"result {unit.get('Result', '?')}, since {unit.get('ExecMainStartTimestamp') or '-'}"]
        if unit.get("StatusText"):
            lines.append(f"says      {unit['StatusText']}")
    elif systemd_error:
        lines.append(f"systemd   unknown ({systemd_error})")
    if node is not None:
        reason = f" ({node['pause_reason']})" if node.get("pause_reason") else ""
        lines.append(f"node      {node.get('state')}{reason}, epoch {node.get('local_epoch')}, "
                     f"{node.get('peers_online')} peers online, run {node.get('run_ref') or node.get('run_id')} "
                     f"at {node['url']}")
    else:
        lines.append(f"node      {node_error}")
    lines.append(f"state dir {installed.state_dir} (kept by service uninstall)")
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "failed"
