"""``p2ptrain doctor``: what a volunteer gets wrong, checked in one screen, one line per check.

Each check returns a :class:`Check`: its name, ``ok``, ``warn``, ``problem`` or ``skip``, what it
found and, for anything but ``ok``, the one thing to do.  Everything a check reads from the machine
(the clocks, ``statvfs``, the port, the swarm, torch) comes in through :class:`Machine`, so the tests
fake a stopped clock, a full disk or a closed port without waiting or breaking anything.  The exit
code is 1 when any check finds a problem (warnings do not count), else 0; ``--json`` prints the same
as one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from p2ptrain.errors import EX_FAILURE, EX_OK, printable

Status = Literal["ok", "warn", "problem", "skip"]
GIB = 1024**3
#: Free space under which a node cannot be expected to write its next checkpoint, and a warning's.
MIN_FREE_BYTES = 1 * GIB
LOW_FREE_BYTES = 5 * GIB
#: A wall clock before this (2026-01-01) is a machine whose clock was never set (a dead RTC battery).
EARLIEST_PLAUSIBLE_TIME = 1_767_225_600.0
#: The wall clock must advance with the monotonic one, within this share, over the checks' run.
CLOCK_RATE_TOLERANCE = 0.5
#: Monotonic seconds over which a wall clock that did not move at all counts as stopped.
MIN_CLOCK_SPAN = 0.02
PIP_CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
PIP_CUDA_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cu128"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str = ""


@dataclass(frozen=True)
class ClockReading:
    wall: float
    monotonic: float


@dataclass
class Machine:
    """What the checks read from this machine, injectable."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs
    bind: Callable[[str, int], None] = field(default=lambda host, port: _bind(host, port))
    probe: Callable[[Sequence[str], Sequence[str], float], Any] | None = None
    """``(peers, listen, timeout) -> SwarmProbe``; None: :func:`p2ptrain.swarm.probe.probe_swarm`."""
    device: Callable[[str, str], tuple[str, str, str]] | None = None
    """``(device setting, precision setting) -> (device, precision, problem)``; None: torch's view."""
    versions: Callable[[str], str | None] = field(default=lambda name: _installed(name))
    node_running: Callable[[Path], bool] = field(default=lambda state_dir: _node_running(state_dir))
    gpu: Callable[[], bool] = field(default=lambda: gpu_present())
    cuda_build: Callable[[], bool] = field(default=lambda: _torch_cuda_build())


def _torch_cuda_build() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _bind(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, port))
        sock.listen(1)


def _node_running(state_dir: Path) -> bool:
    """Whether a live node holds ``state_dir``'s lock (the node's lock file is ``node.lock``)."""
    import fcntl

    try:
        fd = os.open(state_dir / "node.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def pinned_hivemind() -> str:
    """The hivemind release p2ptrain's dependency pins (its metadata), e.g. ``1.1.12``."""
    for requirement in metadata.requires("p2ptrain") or []:
        name, _, rest = requirement.partition("==")
        if name.strip() == "hivemind" and rest:
            return rest.split(";")[0].strip()
    return "1.1.12"


def check_versions(versions: Callable[[str], str | None]) -> Check:
    torch, hivemind = versions("torch"), versions("hivemind")
    pinned = pinned_hivemind()
    found = f"torch {torch or 'missing'}, hivemind {hivemind or 'missing'} (supported: {pinned})"
    if torch is None:
        return Check("versions", "problem", found, f"install torch: {PIP_CPU_TORCH} (or a CUDA build on a GPU)")
    if hivemind != pinned:
        return Check("versions", "problem", found, f"pip install hivemind=={pinned}")
    major_minor = tuple(int(part) for part in torch.split("+")[0].split(".")[:2] if part.isdigit())
    if major_minor < (2, 10):
        return Check("versions", "problem", found, "pip install 'torch>=2.10,<3' (older ones load unsafe checkpoints)")
    return Check("versions", "ok", found)


def torch_device(wanted: str, precision: str) -> tuple[str, str, str]:
    """The device and precision a node would train with, and what is wrong with them ("" if nothing)."""
    import torch

    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if wanted == "auto" else wanted
    if device.startswith("cuda"):
        if not cuda:
            build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU build")
            return device, precision, f"training.device = {wanted!r} but torch sees no CUDA device ({build})"
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            return device, precision, f"training.device = {wanted!r} but torch sees {torch.cuda.device_count()} GPU(s)"
        device = f"{device} ({torch.cuda.get_device_name(index)})"
    elif precision == "fp16":
        return device, precision, "training.precision = 'fp16' needs a CUDA device; use 'bf16' or 'fp32' on a CPU"
    return device, precision, ""


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU whatever torch thinks (the driver's files)."""
    return Path("/proc/driver/nvidia/gpus").is_dir() or Path("/dev/nvidia0").exists()


def training_device(config: Any) -> tuple[str, str]:
    """``training.device`` and ``training.precision`` of ``config`` (``auto``/``fp32`` where the config has none)."""
    training = getattr(config, "training", None)
    return str(getattr(training, "device", "auto")), str(getattr(training, "precision", "fp32"))


def check_device(config: Any, device: Callable[[str, str], tuple[str, str, str]], gpu: Callable[[], bool],
                 cuda_build: Callable[[], bool]) -> Check:
    wanted, precision = training_device(config)
    try:
        used, precision, problem = device(wanted, precision)
    except ImportError as exc:
        return Check("device", "problem", f"torch does not load ({exc})", PIP_CPU_TORCH)
    if problem:
        return Check("device", "problem", problem,
                     f"install a CUDA build of torch ({PIP_CUDA_TORCH}) or set training.device = 'cpu'")
    if used == "cpu" and wanted == "auto" and gpu():
        return Check("device", "warn", f"cpu, {precision}: this machine has an NVIDIA GPU that torch cannot use",
                     f"install a CUDA build of torch: {PIP_CUDA_TORCH}")
    if used == "cpu" and cuda_build() and not gpu():
        return Check("device", "warn", f"cpu, {precision}: torch is a CUDA build (several GB) on a machine "
                     "without an NVIDIA GPU", f"a CPU build is a fraction of the size: {PIP_CPU_TORCH}")
    return Check("device", "ok", f"{used}, {precision}")


def check_clock(start: ClockReading, end: ClockReading, probe: Any | None) -> Check:
    """The wall clock against the monotonic one over the checks' run, its date, and its offset
    against the peers that answered the probe."""
    from p2ptrain.swarm.probe import MAX_CLOCK_OFFSET  # the DHT's limit (hivemind's constant)

    fix_ntp = "turn on time sync: timedatectl set-ntp true (or start chronyd / systemd-timesyncd)"
    span = end.monotonic - start.monotonic
    moved = end.wall - start.wall
    if span >= MIN_CLOCK_SPAN and abs(moved - span) > CLOCK_RATE_TOLERANCE * span:
        return Check("clock", "problem",
                     f"the wall clock is stopped or jumping: it moved {moved:.3f}s in {span:.3f}s", fix_ntp)
    if end.wall < EARLIEST_PLAUSIBLE_TIME:
        shown = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(end.wall))
        return Check("clock", "problem", f"the clock says {shown}: it was never set", fix_ntp)
    answered = probe.answered if probe is not None else []
    if not answered:
        why = "no peer answered" if probe is not None else "no peers to compare with (give --join ADDR)"
        return Check("clock", "skip", f"offset against peers not measured: {why}")
    worst = max(answered, key=lambda answer: abs(answer.offset))
    offset = worst.offset
    found = f"offset {offset:+.2f}s against {len(answered)} peer(s) (limit {MAX_CLOCK_OFFSET:.0f}s)"
    if abs(offset) > MAX_CLOCK_OFFSET:
        return Check("clock", "problem", f"{found}: peers refuse this node's DHT and invites look "
                     f"{'expired' if offset > 0 else 'not yet valid'}", fix_ntp)
    return Check("clock", "ok", found)


def listen_port(listen_addrs: Sequence[str]) -> tuple[str, int] | None:
    """(host, port) of the first TCP listen address, or None."""
    for addr in listen_addrs:
        parts = addr.split("/")
        if len(parts) >= 5 and parts[1] in ("ip4", "ip6") and parts[3] == "tcp" and parts[4].isdigit():
            return parts[2], int(parts[4])
    return None


def check_port(config: Any, machine: Machine, probe: Any | None, node_running: bool) -> Check:
    """Whether the node's swarm port can listen here, and, when peers were probed, whether they dialled back."""
    if config.swarm.client_mode:
        return Check("port", "ok", "client mode: the node dials out only, no port needs to be open")
    where = listen_port(config.swarm.listen_addrs)
    if where is None:
        return Check("port", "skip", f"no TCP listen address in swarm.listen_addrs ({config.swarm.listen_addrs})")
    host, port = where
    if port == 0:
        return Check("port", "warn", "swarm.listen_addrs picks a random port: nothing can be forwarded to it",
                     f"set swarm.listen_addrs = [\"/ip4/{host}/tcp/41400\"] and forward that TCP port")
    if node_running:
        local = f"TCP {port} is the running node's"
    else:
        try:
            machine.bind(host, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return Check("port", "problem", f"TCP {port} is taken by another program",
                             "stop it, or set swarm.listen_addrs to a free port (and forward that one)")
            return Check("port", "problem", f"cannot listen on {host} TCP {port}: {exc.strerror or exc}",
                         "set swarm.listen_addrs to an address of this machine and a port above 1023")
        local = f"TCP {port} is free to listen on"
    if probe is None:
        return Check("port", "ok", f"{local}; not checked from the swarm (give --join ADDR)")
    if probe.error:
        return Check("port", "warn", f"{local}; {probe.error}", "run doctor again while the node is stopped")
    if probe.dialback.dialable:
        return Check("port", "ok", f"{local}; a peer connected to it at {probe.dialback.address}")
    if probe.dialback.dialable is False:
        return Check("port", "problem", f"{local}; a peer could not connect to it at {probe.dialback.address}",
                     f"forward TCP {port} to this machine (and allow it in the firewall); until then the node "
                     "averages as a client, through peers that can be dialled")
    dialled = [answer for answer in probe.answered if answer.dialled_back]
    if dialled:
        return Check("port", "ok", f"{local}; {len(dialled)} of {len(probe.answers)} peer(s) dialled back")
    if not probe.answered:
        reasons = "; ".join(answer.error for answer in probe.answers if answer.error)[:160]
        return Check("port", "problem", f"{local}; no peer answered ({reasons or 'timeout'})",
                     "check the --join address and that this machine can reach it (outbound TCP)")
    return Check("port", "problem", f"{local}; peers answered but could not dial back",
                 f"forward TCP {port} to this machine (and allow it in the firewall), or set swarm.client_mode = true")


def check_disk(state_dir: Path, statvfs: Callable[[str], os.statvfs_result]) -> Check:
    existing = next((part for part in (state_dir, *state_dir.parents) if part.exists()), Path("/"))
    try:
        stats = statvfs(str(existing))
    except OSError as exc:
        return Check("disk", "problem", f"cannot read {printable(existing)}: {exc.strerror or exc}",
                     "set node.state_dir to a directory this user can write")
    free = stats.f_bavail * stats.f_frsize
    found = f"{free / GIB:.1f} GiB free in {printable(state_dir)}"
    fix = "free some space there, or set node.state_dir to a larger disk"
    if free < MIN_FREE_BYTES:
        return Check("disk", "problem", f"{found}: too little for a checkpoint", fix)
    if free < LOW_FREE_BYTES:
        return Check("disk", "warn", found, fix)
    return Check("disk", "ok", found)


def check_config(path: Path | None, environ: dict[str, str]) -> tuple[Check, Any]:
    """The config's every problem (one line each, the first in ``found``), and the config if it loads."""
    from p2ptrain.config.schema import config_problems, load_config

    problems = config_problems(path, environ)
    shown = printable(path) if path is not None else "built-in defaults + P2PTRAIN_* env"
    if problems:
        more = "".join(f"\n    {line}" for line in problems[1:])
        return Check("config", "problem", problems[0] + more,
                     f"fix the setting named (p2ptrain config check {shown} shows it)"), None
    return Check("config", "ok", f"{shown}: ok"), load_config(path, environ)


def run_checks(config_path: Path | None, peers: Sequence[str], machine: Machine,
               environ: dict[str, str], timeout: float) -> list[Check]:
    """Every check, in the order they are shown."""
    start = ClockReading(machine.wall(), machine.monotonic())
    checks = [check_versions(machine.versions)]
    config_check, config = check_config(config_path, environ)
    if config is None:  # the defaults still say where the state is and which port to try
        from p2ptrain.config.schema import NodeConfig

        config = NodeConfig()
    checks.append(check_device(config, machine.device or torch_device, machine.gpu, machine.cuda_build))
    state_dir = config.state_dir()
    running = machine.node_running(state_dir)
    peers = list(peers) or list(config.swarm.initial_peers)
    probe = None
    if peers:
        where = listen_port(config.swarm.listen_addrs)
        free = not running and not config.swarm.client_mode and where is not None and _can_bind(machine, where)
        listen = list(config.swarm.listen_addrs) if free else ["/ip4/0.0.0.0/tcp/0"]
        if machine.probe is None:
            import logging

            from p2ptrain.swarm.probe import probe_swarm

            # after hivemind's import, which sets its loggers up: the probe's DHT chatter is not the answer
            logging.getLogger("hivemind").setLevel(logging.CRITICAL)
            probe = probe_swarm(peers, listen, timeout=timeout)
        else:
            probe = machine.probe(peers, listen, timeout)
        if not free and probe is not None:  # the dial-back reached a port of ours, not the node's
            probe = dataclasses.replace(probe, answers=tuple(
                dataclasses.replace(answer, dialled_back=None) for answer in probe.answers))
    end = ClockReading(machine.wall(), machine.monotonic())
    checks.append(check_clock(start, end, probe))
    checks.append(check_port(config, machine, probe if not running else None, running))
    checks.append(check_disk(state_dir, machine.statvfs))
    checks.append(config_check)
    return checks


def _can_bind(machine: Machine, where: tuple[str, int]) -> bool:
    try:
        machine.bind(*where)
    except OSError:
        return False
    return True


MARKS = {"ok": "ok  ", "warn": "WARN", "problem": "FAIL", "skip": "--  "}


def render(checks: Sequence[Check]) -> str:
    lines = []
    for check in checks:
        line = f"{MARKS[check.status]} {check.name:<8} {check.found}"
        if check.fix:
            line += f"  -> {check.fix}"
        lines.append(line)
    problems = sum(check.status == "problem" for check in checks)
    lines.append(f"{problems} problem(s)" if problems else "no problems found")
    return "\n".join(lines) + "\n"


def exit_code(checks: Sequence[Check]) -> int:
    return EX_FAILURE if any(check.status == "problem" for check in checks) else EX_OK


def doctor_command(args: argparse.Namespace, machine: Machine | None = None) -> int:
    checks = run_checks(args.config, args.join, machine or Machine(), dict(os.environ), args.timeout)
    if args.json:
        payload = {"ok": exit_code(checks) == EX_OK, "checks": [dataclasses.asdict(check) for check in checks]}
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        sys.stdout.write(render(checks))
    return exit_code(checks)
