# PYTHON_ARGCOMPLETE_OK (argcomplete's marker: this entry point answers completion requests)
"""The front door: ``p2ptrain <command>``.

Each command's implementation is imported only when that command runs, so ``p2ptrain top``
and ``p2ptrain config check`` never load torch or hivemind.  Handlers take the parsed
arguments and return an exit code; a :class:`ConfigError` anywhere becomes one line on
stderr and exit code 78, and a reader that stops reading (``p2ptrain run init ... | head``)
ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from p2ptrain import __version__
from p2ptrain.errors import (  # not p2ptrain.config.schema: no pydantic at start-up
    EX_BROKEN_PIPE,
    EX_CONFIG,
    EX_INTERRUPTED,
    EX_OK,
    EX_UNAVAILABLE,
    ConfigError,
    error_line,
)

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


#: What ``p2ptrain run --log-level`` sets: the documented override of ``node.log_level``, so it also
#: holds across SIGHUP reloads (they re-read the config with the environment).
LOG_LEVEL_ENV = "P2PTRAIN_NODE__LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error")
#: What ``--log-format`` sets, the same way: the environment override of node.log_format.
LOG_FORMAT_ENV = "P2PTRAIN_NODE__LOG_FORMAT"
LOG_FORMATS = ("auto", "human", "journal", "json")


def _with_log_level(handler: Handler) -> Handler:
    """``handler`` with ``--log-level`` and ``--log-format`` applied first, as the environment overrides of
    node.log_level and node.log_format."""

    def run(args: argparse.Namespace) -> int:
        if getattr(args, "log_level", None):
            os.environ[LOG_LEVEL_ENV] = args.log_level.upper()
        if getattr(args, "log_format", None):
            os.environ[LOG_FORMAT_ENV] = args.log_format
        return handler(args)

    return run


def _add_log_format_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", type=str.lower, choices=LOG_FORMATS, metavar="FORMAT",
                        help="override node.log_format: auto, human, journal or json (one JSON object per line, "
                        "for log shippers)")


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", type=Path, metavar="PATH",
                        help="node config (TOML); default: built-in defaults + P2PTRAIN_* env")


def _add_node_flags(parser: argparse.ArgumentParser, token_help: str) -> None:
    """How a client command finds the running node on this machine: its API URL and token."""
    parser.add_argument("--url", type=_api_url, metavar="URL", help="node API URL (default: <state_dir>/api.url, "
                        "else http://127.0.0.1:41480)")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help=f"{token_help} (default: <state_dir>/api.token)")
    _add_config_flag(parser)


def _one_config_file(parser: argparse.ArgumentParser, handler: Handler) -> Handler:
    """``handler`` given the one config file in ``args.path``, named either way (``PATH`` or
    ``-c PATH``); none, or two different ones, is a usage error (exit 2)."""

    def run(args: argparse.Namespace) -> int:
        named = {path for path in (args.path, args.config) if path is not None}
        if len(named) != 1:
            parser.error("name one config file: PATH or -c PATH")
        args.path = named.pop()
        return handler(args)

    return run


def _api_url(text: str) -> str:
    """``--url``: an http(s) URL with a host; anything else is a usage error, not a node that does not answer."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(text.strip())
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a port that is not a number, an unbalanced IPv6 bracket
        parts, port_ok = None, False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise argparse.ArgumentTypeError(f"not a node API URL: {text!r} (example: http://127.0.0.1:41480)")
    return text.strip()


def _max_params(text: str) -> int:
    """``--max-params``: a positive whole number (``2_000_000_000`` and ``2,000,000,000`` read too)."""
    try:
        value = int(text.strip().replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _add_model_file_flags(parser: argparse.ArgumentParser, trust: bool = True) -> None:
    """The flags that say what a model config (an export's config.json, a run's manifest) may make us do
    (``trust``: the config may come from someone else, so its task code needs the user's word)."""
    from p2ptrain.model.limits import DEFAULT_MAX_PARAMS  # standard library only

    if trust:
        parser.add_argument("--trust-task-code", action="store_true",
                            help="run the user task code (task.entrypoint) a model's config names; without it only "
                            "built-in models are built, unless it is the entrypoint of your own node config (-c)")
    parser.add_argument("--max-params", type=_max_params, default=DEFAULT_MAX_PARAMS, metavar="N",
                        help=f"refuse (exit 65) a built-in model of more parameters (default {DEFAULT_MAX_PARAMS:,})")


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


def version_text() -> str:
    """``p2ptrain --version``: this release, the torch and hivemind it runs with, and the device it would train on."""
    from importlib import metadata

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    try:
        import torch

        device = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
        torch_line = f"torch {torch.__version__} ({build})"
    except ImportError:
        device, torch_line = "unknown (torch does not load)", f"torch {installed('torch')}"
    return "\n".join((f"p2ptrain {__version__}", torch_line, f"hivemind {installed('hivemind')}",
                      f"device {device}"))


class _VersionAction(argparse.Action):
    """``--version``: computed when asked (it loads torch), not when every command's parser is built."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


#: Commands that need an optional part of the install: (module it needs, the extra that brings it).
EXTRAS = {"top": ("textual", "tui")}


def _needs_extra(command: str, handler: Handler) -> Handler:
    """``handler``, or one line naming the extra to install when the module it needs is missing (exit 69)."""
    module, extra = EXTRAS[command]

    def run(args: argparse.Namespace) -> int:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            print(f"p2ptrain {command} needs {module}, which this install lacks: pip install 'p2ptrain[{extra}]'",
                  file=sys.stderr)
            return EX_UNAVAILABLE
        return handler(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2ptrain", description=DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show p2ptrain's, torch's and hivemind's versions and the training device, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run a node in the foreground (or: run init|show|invite|update|peer-id)",
                         epilog="run owners: p2ptrain run {init,show,invite,update,peer-id} -h")
    _add_config_flag(run)
    run.add_argument("--join", action="append", default=[], metavar="MADDR",
                     help="multiaddr of a node to join (repeatable; adds to swarm.initial_peers)")
    run.add_argument("--run", dest="run_ref", metavar="REF",
                     help="take part in the owned run REF (NAME@hash): settings come from its signed manifest "
                     "(sets swarm.run)")
    run.add_argument("--manifest", type=Path, metavar="FILE",
                     help="the run's manifest file, instead of fetching it from the swarm (sets swarm.manifest)")
    run.add_argument("--trust-task-code", action="store_true",
                     help="run the user task code (task.entrypoint) the run's manifest names; without it only "
                     "built-in tasks run, unless it is the entrypoint of this node's own config (exit 65)")
    run.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, metavar="LEVEL",
                     help="override node.log_level: debug, info, warning or error (debug also shows "
                     "hivemind's and asyncio's internals, tracebacks included)")
    _add_log_format_flag(run)
    run.set_defaults(handler=_with_log_level(_lazy("p2ptrain.daemon.main:run_node")))

    demo = sub.add_parser("demo", help="a local demo swarm on 127.0.0.1 with churn and a live table")
    demo.add_argument("--peers", type=int, default=3, help="nodes to start (default 3)")
    demo.add_argument("--duration", type=_duration, default=90.0, help="seconds to run (default 90)")
    demo.add_argument("--workdir", type=Path, help="where the nodes keep state (default: a temp dir)")
    demo.add_argument("--private", action="store_true",
                      help="an invite-only run: invited nodes train, a node without an invite is refused")
    demo.set_defaults(handler=_lazy("p2ptrain.cli.demo:run_demo"))

    export = sub.add_parser("export", help="write a checkpoint's model as model.safetensors, config.json and a card")
    _add_config_flag(export)
    export.add_argument("--checkpoint", type=Path, metavar="PATH",
                        help="checkpoint file (default: the newest that loads in the config's checkpoint dir)")
    export.add_argument("--force", action="store_true", help="replace OUT_DIR if it already holds an export")
    export.add_argument("--torch", action="store_true", help="also write model.pt (a plain torch.save state dict)")
    export.add_argument("--push-to-hub", metavar="REPO", dest="push_to_hub",
                        help="then upload the export to the Hugging Face model repo REPO (user/name; created if "
                        "missing) with the token of HF_TOKEN or `huggingface-cli login`; needs p2ptrain[hf]")
    _add_model_file_flags(export, trust=False)  # a checkpoint of the node's own config: its code is the user's
    export.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    export.set_defaults(handler=_lazy("p2ptrain.cli.tryit:export_command"))

    fetch = sub.add_parser("fetch", help="download the swarm's current model (no node needed) as an export",
                           description="Join the swarm as a client-mode peer that never trains, download the "
                           "current state through the same checks a joining node applies, write it as an export "
                           "(like p2ptrain export) and leave. Exit 69 if no peer serves a valid state in time.")
    fetch.add_argument("-c", "--config", type=Path, metavar="PATH",
                       help="a node config of the run (a plain run: its swarm.run_id and [task]); default: built-in "
                       "defaults + P2PTRAIN_* env")
    fetch.add_argument("--join", action="append", default=[], metavar="MADDR",
                       help="multiaddr of a node in the swarm (repeatable; adds to swarm.initial_peers)")
    fetch.add_argument("--run", dest="run_ref", metavar="REF",
                       help="the owned run REF (NAME@hash): its model and settings come from its signed manifest")
    fetch.add_argument("--manifest", type=Path, metavar="FILE",
                       help="the run's manifest file, instead of fetching it from the swarm")
    fetch.add_argument("--timeout", type=_duration, default=120.0, metavar="DURATION",
                       help="give up (exit 69) when no valid state has arrived after this long (default 120s)")
    fetch.add_argument("--force", action="store_true", help="replace OUT_DIR if it already holds an export")
    fetch.add_argument("--torch", action="store_true", help="also write model.pt (a plain torch.save state dict)")
    _add_model_file_flags(fetch)
    fetch.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    _add_log_format_flag(fetch)
    fetch.set_defaults(handler=_with_log_level(_lazy("p2ptrain.daemon.fetch:fetch_command")))

    model_help = "an export dir, a node config (.toml: its newest checkpoint) or a checkpoint file (with -c)"
    sample = sub.add_parser("sample", help="generate text with a trained model")
    sample.add_argument("model", metavar="MODEL", help=model_help)
    _add_config_flag(sample)
    sample.add_argument("--prompt", default="def ", help="text to continue (default: 'def ')")
    sample.add_argument("--tokens", default="200", metavar="N", help="tokens (bytes) to generate (default 200)")
    sample.add_argument("--temperature", default="0.8", metavar="T", help="0 is greedy (default 0.8)")
    sample.add_argument("--top-k", default="40", metavar="K", help="sample from the K likeliest; 0: all (default 40)")
    sample.add_argument("--seed", default="0", metavar="S", help="the same seed gives the same text (default 0)")
    _add_model_file_flags(sample)
    sample.set_defaults(handler=_lazy("p2ptrain.cli.tryit:sample_command"))

    evaluate = sub.add_parser("eval", help="validation loss and perplexity of a trained model (bits per byte too "
                                           "for the byte-level one)")
    evaluate.add_argument("model", metavar="MODEL", help=model_help)
    _add_config_flag(evaluate)
    evaluate.add_argument("--data", metavar="PATH",
                          help="score this instead of the run's held-out split: a file, directory, glob or URL, "
                          "read as task.data_path is (text, JSONL's task.text_field, Parquet); its first 4 MiB")
    _add_model_file_flags(evaluate)
    evaluate.set_defaults(handler=_lazy("p2ptrain.cli.tryit:eval_command"))

    config = sub.add_parser("config", help="write or validate a node config")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    init = config_sub.add_parser("init", help="write a commented config template")
    init.add_argument("path", nargs="?", type=Path, help="where to write it (default: stdout)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(handler=_lazy("p2ptrain.cli.config:init_command"))
    check = config_sub.add_parser("check", help="validate a config file (exit 78 if it is bad)")
    check.add_argument("path", nargs="?", type=Path, metavar="PATH", help="the config file")
    check.add_argument("-c", "--config", type=Path, metavar="PATH", help="the same, as run and the others take it")
    check.add_argument("--json", action="store_true", help="print the result as one JSON object (problems included)")
    check.set_defaults(handler=_one_config_file(check, _lazy("p2ptrain.cli.config:check_command")))

    top = sub.add_parser("top", help="watch a running node and its swarm in a terminal UI")
    _add_node_flags(top, "control token file")
    top.set_defaults(handler=_needs_extra("top", _lazy("p2ptrain.tui.app:main")))

    doctor = sub.add_parser("doctor", help="check this machine for what volunteers get wrong: versions, device, "
                            "clock, port, disk, config (exit 1 on a problem)")
    _add_config_flag(doctor)
    doctor.add_argument("--join", action="append", default=[], metavar="MADDR",
                        help="a peer of the swarm to measure the clock against and to dial this machine back "
                        "(repeatable; default: swarm.initial_peers)")
    doctor.add_argument("--timeout", type=_duration, default=10.0, metavar="DURATION",
                        help="how long to wait for the peers (default 10s)")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.set_defaults(handler=_lazy("p2ptrain.cli.doctor:doctor_command"))

    report = sub.add_parser("report", help="a running node's summary of the run: loss chart, contributors, "
                            "data coverage (or the same as JSON)")
    report.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the report as JSON to FILE ('-': print JSON instead of text)")
    _add_node_flags(report, "token file, for a node that wants it on reads")
    report.set_defaults(handler=_lazy("p2ptrain.cli.report:main"))

    service = sub.add_parser("service", help="run the node as a systemd service")
    service_sub = service.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    install = service_sub.add_parser("install", help="write the systemd unit (and a config if none exists)")
    install.add_argument("--user", action="store_true", help="a user service (systemctl --user) instead")
    install.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    install.add_argument("--gpu", action="store_true",
                         help="let the service open the GPU device nodes (NVIDIA, ROCm, DRM render nodes)")
    install.add_argument("--instance", metavar="NAME",
                         help="install p2ptrain@.service and a config for instance NAME")
    install.add_argument("--root", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # tests, image builds
    install.set_defaults(handler=_lazy("p2ptrain.daemon.service_install:main"))
    uninstall = service_sub.add_parser("uninstall", help="stop and disable the service and remove its unit file "
                                       "(the config and the state directory are kept)")
    status = service_sub.add_parser("status", help="the unit's state (systemctl show) and the node's own status")
    for action in (uninstall, status):
        action.add_argument("--user", action="store_true", help="the user service (systemctl --user)")
        action.add_argument("--instance", metavar="NAME", help="the service of instance NAME (p2ptrain@NAME)")
        action.add_argument("--root", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # tests, image builds
    status.add_argument("--json", action="store_true", help="print the unit's and the node's state as one JSON object")
    _add_node_flags(status, "token file, for a node that wants it on reads")
    uninstall.set_defaults(handler=_lazy("p2ptrain.daemon.service_manage:uninstall"))
    status.set_defaults(handler=_lazy("p2ptrain.daemon.service_manage:status"))

    for name, help_text, handler in (
        ("pause", "pause training (the node stays in the swarm and serves state)", "pause"),
        ("resume", "resume training after a manual pause", "resume"),
        ("checkpoint", "write a checkpoint now; say where and at which epoch", "checkpoint"),
        ("leave", "leave the swarm gracefully and stop the node", "leave"),
    ):
        control = sub.add_parser(name, help=help_text)
        if name == "pause":
            control.add_argument("--for", dest="duration", type=_duration, metavar="DURATION",
                                 help="resume automatically after this long (90s, 15m, 2h); "
                                 "default: until resumed")
        if name == "checkpoint":
            control.add_argument("--timeout", type=_duration, default=120.0, metavar="DURATION",
                                 help="give up (exit 1) when no checkpoint is written after this long (default 120s)")
        _add_node_flags(control, "control token file")
        control.set_defaults(handler=_lazy(f"p2ptrain.daemon.nodectl:{handler}"))

    completion = sub.add_parser("completion", help="print the line that turns on shell completion (argcomplete)")
    completion.add_argument("shell", choices=("bash", "zsh"), help="your shell")
    completion.set_defaults(handler=_lazy("p2ptrain.cli.completion:completion_command"))

    return parser


#: ``p2ptrain run ACTION``: the run owner's commands, dispatched before the node command's parser.
RUN_ACTIONS = ("init", "show", "invite", "update", "peer-id")


def build_run_parser() -> argparse.ArgumentParser:
    """``p2ptrain run init|show|invite|update|peer-id``; ``p2ptrain run [--config ...]`` stays the node."""
    parser = argparse.ArgumentParser(prog="p2ptrain run", description="create and manage an owned run")
    sub = parser.add_subparsers(dest="run_command", metavar="ACTION", required=True)

    init = sub.add_parser("init", help="create an owner key and the run's signed manifest (version 1)")
    init.add_argument("name", metavar="NAME", help="run name: 1-32 letters, digits, '_' and '-'")
    init.add_argument("--dir", type=Path, metavar="DIR",
                      help="where owner.key, manifest.toml and the first node's node.toml go (default: ./NAME)")
    init.add_argument("--private", action="store_true", help="invite-only run (default: open to everyone)")
    init.add_argument("--from-config", type=Path, metavar="NODE_TOML",
                      help="take [task] and the run-wide [training] settings from this node config (its local "
                      "settings go into DIR/node.toml, the config of the run's first node)")
    init.add_argument("--fingerprint", default="auto", metavar="auto|none|HEX",
                      help="record the model fingerprint: auto builds the model once (default), none skips it")
    init.set_defaults(handler=_lazy("p2ptrain.cli.run:init_command"))

    show = sub.add_parser("show", help="show the manifest a node would use")
    show.add_argument("target", metavar="REF|MANIFEST", help="a manifest file, or a run reference (with --join)")
    show.add_argument("--join", action="append", default=[], metavar="MADDR",
                      help="fetch the manifest of REF from the swarm through this node (open runs)")
    show.add_argument("--timeout", type=_duration, default=15.0, help="swarm lookup timeout (default 15s)")
    shown = show.add_mutually_exclusive_group()
    shown.add_argument("--toml", action="store_true", help="print the manifest file itself")
    shown.add_argument("--json", action="store_true", help="print the manifest as one JSON object")
    show.set_defaults(handler=_lazy("p2ptrain.cli.run:show_command"))

    invite = sub.add_parser("invite", help="print an invite token admitting one peer to a private run")
    invite.add_argument("target", metavar="REF|MANIFEST", help="the run (its manifest file, or its reference)")
    invite.add_argument("peer_id", metavar="PEER_ID", help="the volunteer's peer ID (p2ptrain run peer-id)")
    invite.add_argument("--days", type=float, default=30.0, help="days the invite is valid (default 30)")
    invite.add_argument("--key", type=Path, metavar="PATH",
                        help="owner key (default: owner.key beside the manifest, or ./NAME/owner.key)")
    invite.set_defaults(handler=_lazy("p2ptrain.cli.run:invite_command"))

    update = sub.add_parser("update", help="change the run's manifest: bump its version and re-sign it")
    update.add_argument("manifest", type=Path, metavar="MANIFEST")
    update.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="a task.* or run-wide training.* setting, e.g. training.lr=3e-4 (repeatable)")
    update.add_argument("--ban", action="append", default=[], metavar="PEER_ID", help="exclude a peer (repeatable)")
    update.add_argument("--unban", action="append", default=[], metavar="PEER_ID", help="lift a ban (repeatable)")
    update.add_argument("--revoke", action="append", default=[], metavar="PEER_ID",
                        help="revoke every invite of a peer (repeatable)")
    update.add_argument("--unrevoke", action="append", default=[], metavar="PEER_ID",
                        help="readmit a peer whose invites were revoked: its unexpired invites admit it again "
                        "(repeatable)")
    policy = update.add_mutually_exclusive_group()
    policy.add_argument("--private", dest="policy", action="store_const", const="invite",
                        help="make the run invite-only")
    policy.add_argument("--open", dest="policy", action="store_const", const="open", help="open the run to all")
    update.add_argument("--fingerprint", metavar="auto|none|HEX", help="record (or clear) the model fingerprint")
    update.add_argument("--key", type=Path, metavar="PATH", help="owner key (default: owner.key beside the manifest)")
    update.set_defaults(handler=_lazy("p2ptrain.cli.run:update_command"))

    peer_id = sub.add_parser("peer-id", help="print this node's peer ID (creating its identity if needed)")
    _add_config_flag(peer_id)
    peer_id.set_defaults(handler=_lazy("p2ptrain.cli.run:peer_id_command"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and "_ARGCOMPLETE" in os.environ:  # the shell asks for completions: answer and exit
        from p2ptrain.cli.completion import autocomplete

        autocomplete(build_parser, build_run_parser, RUN_ACTIONS)
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "run" and argv[1] in RUN_ACTIONS:
        args = build_run_parser().parse_args(argv[1:])
    else:
        args = build_parser().parse_args(argv)
    try:
        code = int(args.handler(args) or EX_OK)
        sys.stdout.flush()  # a reader that left (``| head``) shows here, not at interpreter exit
        return code
    except ConfigError as error:
        print(error_line(error), file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return EX_INTERRUPTED
    except BrokenPipeError:
        # SIGPIPE stays ignored (the node writes to sockets); a closed stdout is the reader's choice.
        _discard_stdout()
        return EX_BROKEN_PIPE


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so flushing it again at exit does not raise a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (tests): nothing left to flush there
        pass

