"""The front door: ``p2ptrain <command>``.

Each command's implementation is imported only when that command runs, so ``p2ptrain top``
and ``p2ptrain config check`` never load torch or hivemind.  Handlers take the parsed
arguments and return an exit code; a :class:`ConfigError` anywhere becomes one line on
stderr and exit code 78.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from p2ptrain import __version__
from p2ptrain.errors import EX_CONFIG, ConfigError  # not p2ptrain.config: no pydantic at start-up

Handler = Callable[[argparse.Namespace], int]

#: What ``p2ptrain --help`` says the program is (the module docstring describes this module).
DESCRIPTION = ("p2ptrain: an elastic peer-to-peer training daemon for volunteer compute. Each machine runs "
               "one node; nodes find each other through a DHT, train the same model on their own data and "
               "average with whoever is online.")


def _lazy(target: str) -> Handler:
    """``"module:function"`` imported on first call."""
    module_name, _, function_name = target.partition(":")

    def handler(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module_name), function_name)(args)

    return handler


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", type=Path, metavar="PATH",
                        help="node config (TOML); default: built-in defaults + P2PTRAIN_* env")


def _duration(text: str) -> float:
    """Parse ``90``, ``90s``, ``15m``, ``2h``, ``1d`` into seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    scale = units.get(text[-1:])
    number = text[:-1] if scale else text
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 90, 30s, 15m, 2h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2ptrain", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"p2ptrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run a node in the foreground")
    _add_config_flag(run)
    run.add_argument("--join", action="append", default=[], metavar="MADDR",
                     help="multiaddr of a node to join (repeatable; adds to swarm.initial_peers)")
    run.set_defaults(handler=_lazy("p2ptrain.daemon.main:run_node"))

    demo = sub.add_parser("demo", help="a local demo swarm on 127.0.0.1 with churn and a live table")
    demo.add_argument("--peers", type=int, default=3, help="nodes to start (default 3)")
    demo.add_argument("--duration", type=_duration, default=90.0, help="seconds to run (default 90)")
    demo.add_argument("--workdir", type=Path, help="where the nodes keep state (default: a temp dir)")
    demo.set_defaults(handler=_lazy("p2ptrain.demo:run_demo"))

    config = sub.add_parser("config", help="write or validate a node config")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    init = config_sub.add_parser("init", help="write a commented config template")
    init.add_argument("path", nargs="?", type=Path, help="where to write it (default: stdout)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(handler=_lazy("p2ptrain.config_template:init_command"))
    check = config_sub.add_parser("check", help="validate a config file (exit 78 if it is bad)")
    check.add_argument("path", type=Path)
    check.set_defaults(handler=_lazy("p2ptrain.config_template:check_command"))

    top = sub.add_parser("top", help="watch a running node and its swarm in a terminal UI")
    top.add_argument("--url", metavar="URL", help="node API URL (default: <state_dir>/api.url, "
                     "else http://127.0.0.1:41480)")
    top.add_argument("--token-file", type=Path, metavar="PATH",
                     help="control token file (default: <state_dir>/api.token)")
    _add_config_flag(top)
    top.set_defaults(handler=_lazy("p2ptrain.tui.app:main"))

    service = sub.add_parser("service", help="run the node as a systemd service")
    service_sub = service.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    install = service_sub.add_parser("install", help="write the systemd unit (and a config if none exists)")
    install.add_argument("--user", action="store_true", help="a user service (systemctl --user) instead")
    install.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    install.add_argument("--instance", metavar="NAME",
                         help="install p2ptrain@.service and a config for instance NAME")
    install.add_argument("--root", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # tests, image builds
    install.set_defaults(handler=_lazy("p2ptrain.daemon.service_install:main"))

    for name, help_text, handler in (
        ("pause", "pause training (the node stays in the swarm and serves state)", "pause"),
        ("resume", "resume training after a manual pause", "resume"),
        ("leave", "leave the swarm gracefully and stop the node", "leave"),
    ):
        control = sub.add_parser(name, help=help_text)
        if name == "pause":
            control.add_argument("--for", dest="duration", type=_duration, metavar="DURATION",
                                 help="resume automatically after this long (90s, 15m, 2h); "
                                 "default: until resumed")
        control.add_argument("--url", metavar="URL", help="node API URL (default: <state_dir>/api.url, "
                             "else http://127.0.0.1:41480)")
        control.add_argument("--token-file", type=Path, metavar="PATH",
                             help="control token file (default: <state_dir>/api.token)")
        _add_config_flag(control)
        control.set_defaults(handler=_lazy(f"p2ptrain.daemon.nodectl:{handler}"))

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ConfigError as error:
        print(f"p2ptrain: config error: {error}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
