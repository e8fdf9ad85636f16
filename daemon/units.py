"""The systemd unit files, rendered from one place.

``configs/systemd/*.service`` are these renderings with the default ``ExecStart`` (a test keeps them
identical), and ``p2ptrain service install`` writes the same text with the ``ExecStart`` of the
installation it runs from.  Keeping the text here means an installed wheel needs no data files.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Where packagers are expected to put the venv; only the checked-in unit files use it.
DEFAULT_EXEC = ("/opt/p2ptrain/venv/bin/python", "-m", "p2ptrain.cli")
SERVICE_USER = "p2ptrain"

_HEADER = """\
# {title}
# Written by `p2ptrain service install`. Local changes belong in a drop-in
# (`systemctl {scope}edit {name}`), which survives reinstalls and upgrades.
"""

_UNIT = """\
[Unit]
Description={description}
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=30min
StartLimitBurst=5

[Service]
# READY=1 comes once the node has joined the swarm and synced its state; the node extends
# the start timeout itself (EXTEND_TIMEOUT_USEC) while a large state download runs.
Type=notify
NotifyAccess=main
ExecStart={exec_start}
ExecReload=/bin/kill -HUP $MAINPID
TimeoutStartSec=10min
# WATCHDOG=1 is sent only after completed training steps (or while deliberately paused).
WatchdogSec=5min
# SIGTERM goes to the node only: it leaves the swarm and writes a final checkpoint, then its
# helper processes get SIGKILL if anything is left after TimeoutStopSec.
KillMode=mixed
TimeoutStopSec=3min
Restart=on-failure
RestartSec=30s
# 78 = EX_CONFIG: a bad config will not fix itself by restarting.
RestartPreventExitStatus=78
{identity}StateDirectory={state}
StateDirectoryMode=0750
CacheDirectory={state}
CacheDirectoryMode=0750
ConfigurationDirectory=p2ptrain
WorkingDirectory={workdir}
Environment=XDG_CACHE_HOME={cachedir}
UMask=0027
{limits}# Volunteer machines: the owner's work comes first.
Nice=10
IOSchedulingClass=idle
CPUSchedulingPolicy=batch
{hardening}
[Install]
WantedBy={wanted_by}
"""

_SYSTEM_IDENTITY = f"""\
# A dedicated user from sysusers.d/p2ptrain.conf (a static user, unlike DynamicUser=, so the
# state directory keeps one owner that operators can recognise and back up).
User={SERVICE_USER}
Group={SERVICE_USER}
"""

_SYSTEM_HARDENING = """\
# Sandboxing that still lets the node use GPUs and open TCP connections both ways. No
# PrivateUsers=: it would hide the render/video group memberships GPU access relies on.
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateIPC=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @mount @swap @reboot @raw-io @module @obsolete @cpu-emulation @debug
SystemCallErrorNumber=EPERM
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
# No PrivateDevices= (it would hide GPUs from an install with --gpu) and no MemoryDenyWriteExecute=
# (CUDA and Triton generate code at run time). Device nodes: only the pseudo-devices systemd always
# allows, unless the unit was installed with --gpu.
DevicePolicy=closed
{devices}"""

# `service install --gpu`: NVIDIA (/dev/nvidia*: the devices, nvidiactl, nvidia-uvm), AMD ROCm
# (/dev/kfd) and DRM render nodes.
_GPU_DEVICES = """DeviceAllow=char-nvidia* rw
DeviceAllow=char-kfd rw
DeviceAllow=char-drm rw
"""

# The per-user manager cannot apply most sandboxing without unprivileged user namespaces,
# and cannot raise hard limits; user units keep what is always allowed.
_USER_HARDENING = """\
NoNewPrivileges=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
"""


def quote_exec(argv: Sequence[str]) -> str:
    """An ExecStart command line: specifiers (%) and variables ($) escaped, spaces quoted."""
    parts = []
    for arg in argv:
        escaped = arg.replace("\\", "\\\\").replace("%", "%%").replace("$", "$$").replace('"', '\\"')
        parts.append(f'"{escaped}"' if any(c.isspace() for c in arg) or not arg else escaped)
    return " ".join(parts)


def render_unit(exec_prefix: Sequence[str] = DEFAULT_EXEC, *, instance: bool = False,
                user: bool = False, gpu: bool = False) -> str:
    """The text of ``p2ptrain.service`` (``instance=True``: ``p2ptrain@.service``), system or user.

    ``exec_prefix`` is the command that runs the CLI, e.g. ``[sys.executable, "-m", "p2ptrain.cli"]``;
    ``gpu`` lets a system unit open the GPU device nodes (a user unit opens what its user may).
    """
    state = "p2ptrain/%i" if instance else "p2ptrain"
    config = "%E/p2ptrain/%i.toml" if instance else "%E/p2ptrain/node.toml"
    name = "p2ptrain@.service" if instance else "p2ptrain.service"
    title = ("p2ptrain node, one per instance: p2ptrain@NAME reads %E/p2ptrain/NAME.toml"
             if instance else "p2ptrain node")
    header = _HEADER.format(title=title, scope="--user " if user else "", name=name.replace("@.", "@NAME."))
    body = _UNIT.format(
        description="p2ptrain training node %i" if instance else "p2ptrain training node",
        exec_start=quote_exec([*exec_prefix, "run", "--config"]) + " " + config,
        identity="" if user else _SYSTEM_IDENTITY,
        state=state,
        workdir=f"%S/{state}",
        cachedir=f"%C/{state}",
        limits="" if user else "LimitNOFILE=65536\n",
        hardening=_USER_HARDENING if user else _SYSTEM_HARDENING.format(devices=_GPU_DEVICES if gpu else ""),
        wanted_by="default.target" if user else "multi-user.target",
    )
    return header + body


SYSUSERS = f"""\
# The user p2ptrain.service runs as (systemd-sysusers). Members of the render and video groups
# may open GPU render nodes on AMD and Intel machines; NVIDIA device nodes are world-accessible.
u {SERVICE_USER} - "p2ptrain training node" /var/lib/p2ptrain
m {SERVICE_USER} render
m {SERVICE_USER} video
"""
