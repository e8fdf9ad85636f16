"""The node as a service: wires the loop's hooks to the HTTP API, peer records, systemd and the
volunteer policy.  Each piece keeps its own job; this module only connects them.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2ptrain.config import ConfigError, NodeConfig, load_config
from p2ptrain.daemon.api import ApiServer
from p2ptrain.daemon.auth import load_or_create_token
from p2ptrain.daemon.hooks import NodeHooks
from p2ptrain.daemon.logsetup import set_log_level
from p2ptrain.daemon.recordloop import RecordExchange
from p2ptrain.daemon.reload import reloadable_changes
from p2ptrain.daemon.systemd import SystemdNotifier
from p2ptrain.metrics import build_registry
from p2ptrain.records import RecordBook, record_validators
from p2ptrain.status import PauseReason, PeerRecord, SwarmView
from p2ptrain.volunteer import VolunteerPolicy, os_load_source, own_rss_bytes

if TYPE_CHECKING:
    from p2ptrain.daemon.node import Node

logger = logging.getLogger(__name__)

STATUS_EVERY = 5.0
#: Reading /proc is cheap, but the loop asks between every step; memory does not jump that fast.
MEMORY_CHECK_EVERY = 2.0


class ServiceHooks(NodeHooks):
    """Hooks of a real node: API + metrics, signed records, sd_notify, volunteer controls, SIGHUP reload."""

    def __init__(self, config: NodeConfig, config_path: Path | None, notifier: SystemdNotifier) -> None:
        self.config = config
        self.config_path = config_path
        self.notifier = notifier
        self.watchdog = notifier.watchdog_pacer(time.monotonic)
        self.policy = VolunteerPolicy(config.volunteer, load=os_load_source())
        self.api: ApiServer | None = None
        self.records: RecordExchange | None = None
        self._validators: list[Any] = []
        self._next_status = 0.0
        self._next_memory_check = 0.0
        self._over_memory = False

    def starting(self, node: Node) -> None:
        if not self.config.api.enabled:
            return
        state_dir = self.config.state_dir()
        self.api = ApiServer(host=self.config.api.host, port=self.config.api.port, latest=node.latest,
                             logs=node.logs, control=node.control, registry=build_registry(node.latest),
                             token=load_or_create_token(state_dir))
        self.api.start()
        url_file = state_dir / "api.url"
        tmp = url_file.with_suffix(".tmp")
        tmp.write_text(self.api.url + "\n", encoding="utf-8")
        os.replace(tmp, url_file)

    def record_validators(self, run_id: str) -> list[Any]:
        self._validators = record_validators(run_id)
        return self._validators

    def ready(self, node: Node) -> None:
        self.records = RecordExchange(RecordBook(node.dht, node.config.swarm.run_id, self._validators),
                                      node.latest)
        self.records.start()
        self.notifier.ready(self._status_line(node))

    def progress(self, node: Node) -> None:
        self._alive(node)

    def idle(self, node: Node) -> None:
        # A deliberate pause is not a hang: keep feeding the watchdog (a stuck step never gets here).
        self._alive(node)

    def _alive(self, node: Node) -> None:
        self.watchdog.progress()
        now = time.monotonic()
        if now >= self._next_status:
            self.notifier.status(self._status_line(node))
            self._next_status = now + STATUS_EVERY

    def long_operation(self, node: Node, seconds: float) -> None:
        self.notifier.extend_timeout(seconds)
        self.watchdog.expect_delay(seconds)

    def policy_pause_reason(self, node: Node) -> PauseReason:
        reason = self.policy.pause_reason()
        if reason is PauseReason.NONE and self._memory_exceeded():
            return PauseReason.MEMORY
        return reason

    def _memory_exceeded(self) -> bool:
        """volunteer.max_memory_mb against this process's RSS, re-read every few seconds."""
        now = time.monotonic()
        if now < self._next_memory_check:
            return self._over_memory
        self._next_memory_check = now + MEMORY_CHECK_EVERY
        rss = own_rss_bytes()
        over = rss is not None and self.policy.over_memory(rss)
        if over and not self._over_memory:
            logger.warning("resident memory %.0f MiB is over volunteer.max_memory_mb=%d: pausing training",
                           (rss or 0) / 2**20, self.policy.config.max_memory_mb)
        elif self._over_memory and not over:
            logger.info("resident memory is back under volunteer.max_memory_mb")
        self._over_memory = over
        return over

    def exchange_records(self, node: Node, own: PeerRecord) -> SwarmView:
        # Records go out on their own thread (daemon/recordloop.py); the loop just takes the view.
        return self.records.view if self.records is not None else node.swarm_view

    def reload(self, node: Node) -> None:
        try:
            new = load_config(self.config_path)
        except ConfigError as error:
            logger.error("reload refused, keeping the running config: %s", error)
            return
        applied, needs_restart = reloadable_changes(self.config, new)
        set_log_level(new.node.log_level)
        self.policy.update(new.volunteer)
        if new.training.threads != self.config.training.threads:
            import torch

            torch.set_num_threads(new.training.threads or os.cpu_count() or 1)
        node.initial_peers = list(dict.fromkeys([*new.swarm.initial_peers, *node.initial_peers]))
        node.max_epochs = new.training.max_epochs
        self.config = new
        logger.info("reloaded %s: applied %s%s", self.config_path or "config", ", ".join(applied) or "nothing",
                    f"; needs a restart: {', '.join(needs_restart)}" if needs_restart else "")

    def stopping(self, node: Node) -> None:
        self.notifier.stopping("leaving the swarm")
        if self.records is not None:
            self.records.stop()
            self.records = None
        if self.api is not None:
            self.api.stop()
            self.api = None

    @staticmethod
    def _status_line(node: Node) -> str:
        status = node.latest.status()
        state = f"{status.state} ({status.pause_reason})" if status.pause_reason else status.state
        return (f"{state} epoch={status.local_epoch} peers={status.peers_online} "
                f"{status.local_samples_per_second:.1f} samples/s")
