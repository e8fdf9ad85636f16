"""``p2ptrain service install [--user] [--dry-run] [--instance NAME]``: write unit, config, sysusers file.

The unit's ``ExecStart`` runs the Python this command runs under (``sys.executable -m
p2ptrain.cli``), so a venv install needs no activation.  An existing unit is replaced (that is
how upgrades pick up a moved venv); an existing config is never touched.  Nothing is started:
the ``systemctl`` commands are printed for the operator to run.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from p2ptrain.config.template import render_template
from p2ptrain.daemon.units import SYSUSERS, render_unit
from p2ptrain.errors import EX_CANTCREAT, EX_OK, EX_USAGE

INSTANCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# The system unit's sandbox hides these from the service user (ProtectHome=yes).
_HIDDEN_PREFIXES = ("/home/", "/root/", "/run/user/")


@dataclass(frozen=True)
class PlannedFile:
    path: Path
    text: str
    mode: int
    replace: bool  # False: keep an existing file (configs belong to the operator)


@dataclass(frozen=True)
class Plan:
    files: tuple[PlannedFile, ...]
    commands: tuple[str, ...]
    warnings: tuple[str, ...]


def _under(root: Path | None, path: Path) -> Path:
    return root / path.relative_to("/") if root is not None else path


def _user_dir(environ: Mapping[str, str], variable: str, fallback: str) -> Path:
    value = environ.get(variable)
    return Path(value) if value else Path(environ.get("HOME") or Path.home()) / fallback


def plan_install(*, user: bool, instance: str | None, exec_prefix: Sequence[str],
                 environ: Mapping[str, str], root: Path | None = None, gpu: bool = False) -> Plan:
    """Everything ``install`` would write and print; pure apart from reading ``environ``."""
    if user:
        unit_dir = _user_dir(environ, "XDG_CONFIG_HOME", ".config") / "systemd" / "user"
        config_dir = _user_dir(environ, "XDG_CONFIG_HOME", ".config") / "p2ptrain"
    else:
        unit_dir, config_dir = Path("/etc/systemd/system"), Path("/etc/p2ptrain")
    unit_name = "p2ptrain@.service" if instance else "p2ptrain.service"
    service = f"p2ptrain@{instance}.service" if instance else "p2ptrain.service"
    config_path = config_dir / (f"{instance}.toml" if instance else "node.toml")

    files = [PlannedFile(_under(root, unit_dir / unit_name),
                         render_unit(exec_prefix, instance=bool(instance), user=user, gpu=gpu), 0o644, True)]
    if not user:
        files.append(PlannedFile(_under(root, Path("/etc/sysusers.d/p2ptrain.conf")), SYSUSERS, 0o644, True))
    # World-readable like most of /etc: it holds no secrets (the API token lives in the state dir),
    # and the service user must be able to read it.
    files.append(PlannedFile(_under(root, config_path), render_template(), 0o644, False))

    systemctl = "systemctl --user" if user else "systemctl"
    commands = [] if user else ["systemd-sysusers /etc/sysusers.d/p2ptrain.conf"]
    commands += [f"{systemctl} daemon-reload", f"{systemctl} enable --now {service}",
                 f"{systemctl} status {service}",
                 f"journalctl {'--user ' if user else ''}-u {service} -f"]
    if instance:
        commands.insert(0, f"# first edit {config_path}: every instance needs its own "
                           "swarm.listen_addrs port, api.port and (on GPUs) CUDA_VISIBLE_DEVICES "
                           "via `systemctl edit`")
    if user:
        linger = f"loginctl enable-linger {environ.get('USER', '$USER')}"
        commands.append(f"{linger}  # keep it running after logout")

    warnings = []
    executable = str(exec_prefix[0])
    if not user and executable.startswith(_HIDDEN_PREFIXES):
        warnings.append(f"{executable} is under a home directory, which the system service cannot see "
                        "(ProtectHome=yes, user p2ptrain): install p2ptrain into /opt/p2ptrain/venv, "
                        "or use --user")
    return Plan(tuple(files), tuple(commands), tuple(warnings))


def file_error_line(verb: str, path: Path, exc: OSError, *, user: bool) -> str:
    """One line for a unit or config file that could not be written or removed; a system install's
    permission error says how to get the right one."""
    if isinstance(exc, PermissionError):
        hint = "" if user else " (run with sudo, or use --user)"
        return f"p2ptrain: cannot {verb} {path}: permission denied{hint}"
    return f"p2ptrain: cannot {verb} {path}: {exc.strerror or exc}"


def _write(planned: PlannedFile) -> str:
    existed = planned.path.exists()
    if existed and not planned.replace:
        return f"kept     {planned.path} (already exists)"
    planned.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = planned.path.with_name(f".{planned.path.name}.tmp")
    tmp.write_text(planned.text, encoding="utf-8")
    os.chmod(tmp, planned.mode)
    os.replace(tmp, planned.path)
    return f"{'updated' if existed else 'wrote':<8} {planned.path}"


def main(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    instance: str | None = args.instance
    if instance is not None and not INSTANCE_NAME.fullmatch(instance):
        print(f"p2ptrain: --instance {instance!r}: use 1-64 letters, digits, '_', '.', '-'", file=sys.stderr)
        return EX_USAGE
    plan = plan_install(user=args.user, instance=instance, exec_prefix=[sys.executable, "-m", "p2ptrain.cli"],
                        environ=environ, root=args.root, gpu=bool(getattr(args, "gpu", False)))
    for warning in plan.warnings:
        print(f"p2ptrain: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        for planned in plan.files:
            action = "keep (exists)" if planned.path.exists() and not planned.replace else "write"
            print(f"# --- {action}: {planned.path} (mode {planned.mode:o})")
            if action == "write":
                print(planned.text, end="" if planned.text.endswith("\n") else "\n")
        print("# --- then run:")
        print("\n".join(plan.commands))
        return EX_OK
    for planned in plan.files:
        try:
            print(_write(planned))
        except OSError as exc:
            print(file_error_line("write", planned.path, exc, user=args.user), file=sys.stderr)
            return EX_CANTCREAT
    print("Now run:")
    print("\n".join(f"  {command}" for command in plan.commands))
    return EX_OK
