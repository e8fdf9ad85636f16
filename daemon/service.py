"""The node as a service: wires the node's hooks to the HTTP API, peer records, systemd and the
volunteer policy.  Each piece keeps its own job; this module only connects them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import ApiSection, ConfigError, NodeConfig, load_config
from p2ptrain.daemon.api import ApiServer
from p2ptrain.daemon.auth import load_or_create_token
from p2ptrain.daemon.hooks import NodeHooks, NodeOutlets, SwarmPresence
from p2ptrain.daemon.logsetup import set_log_level
from p2ptrain.daemon.record_publisher import RecordPublisher
from p2ptrain.daemon.reload import merge_reloadable, reloadable_changes
from p2ptrain.daemon.systemd import SystemdNotifier
from p2ptrain.daemon.volunteer import VolunteerPolicy, os_load_source, own_rss_bytes
from p2ptrain.metrics import build_registry
from p2ptrain.status import LatestSnapshot, PauseReason, SwarmView
from p2ptrain.swarm.ownedrun import keep_run_settings
from p2ptrain.swarm.records import record_validators

logger = logging.getLogger(__name__)

STATUS_EVERY = 5.0
#: Reading /proc is cheap, but the loop asks between every step; memory does not jump that fast.
MEMORY_CHECK_EVERY = 2.0


class ServiceHooks(NodeHooks):
    """Hooks of a real node: API + metrics, signed records, sd_notify, volunteer controls, SIGHUP reload."""

    def __init__(self, config: NodeConfig, config_path: Path | None, notifier: SystemdNotifier,
                 run_flags: Callable[[NodeConfig], NodeConfig] | None = None) -> None:
        self.config_path = config_path
        #: ``p2ptrain run --run/--manifest``, applied again to a reloaded config.
        self._run_flags = run_flags
        self.notifier = notifier
        self.watchdog = notifier.watchdog_pacer(time.monotonic)
        self.policy = VolunteerPolicy(config.volunteer, load=os_load_source())
        self._api_config: ApiSection = config.api
        self.api: ApiServer | None = None
        self.records: RecordPublisher | None = None
        self._latest: LatestSnapshot | None = None
        self._validators: list[Any] = []
        self._next_status = 0.0
        self._next_memory_check = 0.0
        self._over_memory = False

    def starting(self, outlets: NodeOutlets) -> None:
        self._latest = outlets.latest
        if not self._api_config.enabled:
            return
        self.api = ApiServer(host=self._api_config.host, port=self._api_config.port, latest=outlets.latest,
                             logs=outlets.logs, control=outlets.control, registry=build_registry(outlets.latest),
                             token=load_or_create_token(outlets.state_dir))
        self.api.start()
        url_file = outlets.state_dir / "api.url"
        tmp = url_file.with_suffix(".tmp")
        tmp.write_text(self.api.url + "\n", encoding="utf-8")
        os.replace(tmp, url_file)

    def record_validators(self, run_id: str) -> list[Any]:
        self._validators = record_validators(run_id)
        return self._validators

    def joined(self, presence: SwarmPresence) -> bool:
        # Records go out (and are read) from the moment the node is in the swarm: a newcomer checks
        # the state it downloads against what the run's peers report in them.
        if self._latest is not None and self.records is None:
            self.records = RecordPublisher.for_run(presence.dht, presence.run_id, self._validators, self._latest,
                                                   presence.evidence)
            self.records.start()
        return self.records is not None

    def ready(self, presence: SwarmPresence) -> None:
        self.joined(presence)  # no-op when it already started at join
        self.notifier.ready(self._status_line())

    def progress(self) -> None:
        self._alive()

    def idle(self) -> None:
        # A deliberate pause is not a hang: keep feeding the watchdog (a stuck step never gets here).
        self._alive()

    def _alive(self) -> None:
        self.watchdog.progress()
        now = time.monotonic()
        if now >= self._next_status:
            self.notifier.status(self._status_line())
            self._next_status = now + STATUS_EVERY

    def long_operation(self, seconds: float) -> None:
        self.notifier.extend_timeout(seconds)
        self.watchdog.expect_delay(seconds)

    def policy_pause_reason(self) -> PauseReason:
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

    def swarm_view(self) -> SwarmView | None:
        # Records go out on their own thread (daemon/record_publisher.py); the node just takes the view.
        return self.records.view if self.records is not None else None

    def reload(self, current: NodeConfig) -> NodeConfig | None:
        try:
            new = load_config(self.config_path)
            if self._run_flags is not None:
                new = self._run_flags(new)
        except ConfigError as error:
            logger.error("reload refused, keeping the running config: %s", error)
            return None
        if current.swarm.run is not None:  # an owned run: its manifest, not this file, holds the run's settings
            new = keep_run_settings(new, current)
        applied, needs_restart = reloadable_changes(current, new)
        set_log_level(new.node.log_level)
        self.policy.update(new.volunteer)
        logger.info("reloaded %s: applied %s%s", self.config_path or "config", ", ".join(applied) or "nothing",
                    f"; needs a restart: {', '.join(needs_restart)}" if needs_restart else "")
        return merge_reloadable(current, new)

    def stopping(self) -> None:
        self.notifier.stopping("leaving the swarm")
        if self.records is not None:
            self.records.stop()
            self.records = None
        if self.api is not None:
            self.api.stop()
            self.api = None

    def _status_line(self) -> str:
        if self._latest is None:
            return "starting"
        status = self._latest.status()
        state = f"{status.state} ({status.pause_reason})" if status.pause_reason else status.state
        return (f"{state} epoch={status.local_epoch} peers={status.peers_online} "
                f"{status.local_samples_per_second:.1f} samples/s")
