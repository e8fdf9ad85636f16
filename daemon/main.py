"""``p2ptrain run``: the daemon's entry point. Logging, signals, limits; the node does the rest.

Exit codes (see ``daemon.node``): 0 clean stop; 78 (EX_CONFIG) bad configuration (a bad run
manifest or invite included) or a model that does not match the run, so
``RestartPreventExitStatus=78`` ends a restart loop; 75 (EX_TEMPFAIL) another node holds the state
directory, or a new version of the run's manifest needs a restart (systemd restarts the node, which
takes the new version up); 1 the swarm could not be joined or the node failed.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import resource
import signal
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from p2ptrain.config.schema import ConfigError, NodeConfig, load_config, parse_multiaddr
from p2ptrain.daemon.children import share_tensors_by_descriptor, tie_children_to_this_process
from p2ptrain.daemon.control import Command, ControlRequest
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.daemon.logsetup import configure_logging
from p2ptrain.daemon.systemd import SystemdNotifier
from p2ptrain.swarm.ownedrun import apply_run_flags

if TYPE_CHECKING:
    from p2ptrain.daemon.node import Node

logger = logging.getLogger("p2ptrain.daemon")

def _install_signal_handlers(node: Node) -> None:
    """Handlers only record; the loop acts between steps. A second SIGINT/SIGTERM exits at once
    (the second signal: a stop the node asked for itself does not count, see ``daemon.stopper``)."""
    node.stopper.handle_stop_signals()

    def on_hup(_signum: int, _frame: FrameType | None) -> None:
        node.control.submit(ControlRequest(Command.RELOAD, source="SIGHUP"))  # a reentrant queue: no lock

    signal.signal(signal.SIGHUP, on_hup)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (before, after).

    libp2p keeps a socket per connected peer and hivemind opens pipes per helper process, so a
    node in a large swarm outgrows the common default of 1024.  The hard limit is what the
    admin (or ``LimitNOFILE=``) allows; going up to it needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # "unlimited" is refused for NOFILE (the kernel caps it at fs.nr_open): use a large finite value.
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as error:
        logger.debug("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, error)
        return soft, soft
    return soft, target


def run_node(args: argparse.Namespace) -> NoReturn:
    def run_flags(loaded: NodeConfig) -> NodeConfig:
        return apply_run_flags(loaded, args.run_ref, args.manifest)

    config = run_flags(load_config(args.config))
    for addr in args.join:
        try:
            parse_multiaddr(addr, need_peer_id=True)
        except ValueError as exc:
            raise ConfigError(f"--join: {exc}") from None
    share_tensors_by_descriptor()  # before hivemind is imported, which reads it
    # The node's modules load torch and hivemind (seconds of CPU): only once the config has passed, so
    # that a bad one is refused at once, and a restart loop on it costs nothing.
    from p2ptrain.averaging.lifecycle import report_stacks_on_timeout
    from p2ptrain.daemon.node import Node
    from p2ptrain.daemon.service import ServiceHooks
    from p2ptrain.daemon.shutdown import end_process

    log_ring = LogRing()
    configure_logging(config.node.log_level, config.node.log_format, [log_ring])
    before, after = raise_open_files_limit()
    if after != before:
        logger.debug("open files limit raised from %d to %d", before, after)
    tie_children_to_this_process()
    faulthandler.enable()  # a fatal signal (systemd's watchdog: SIGABRT) writes every thread's stack first
    report_stacks_on_timeout()  # and SIGUSR2 does at any time (docs/operations.md, "A node that seems stuck")
    hooks = ServiceHooks(config, args.config, SystemdNotifier.from_environ(os.environ), run_flags=run_flags)
    node = Node(config, extra_peers=args.join, log_ring=log_ring, hooks=hooks,
                trust_task_code=bool(getattr(args, "trust_task_code", False)))
    _install_signal_handlers(node)
    end_process(node.run())
