"""The node's life and loop with fakes for every collaborator: no processes, no DHT, a fake clock.

Covers pause/resume/leave, the pause timer, max_epochs, SIGHUP reload, the sync decision, the
watchdog while a step is stuck, and the exit code of every way a node can end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from p2ptrain.config.schema import ConfigError, NodeConfig, parse_config
from p2ptrain.daemon.builder import JoinedSwarm
from p2ptrain.daemon.control import Command, ControlRequest
from p2ptrain.daemon.cpushare import CpuShare
from p2ptrain.daemon.hooks import NodeHooks, NodeOutlets, SwarmPresence
from p2ptrain.daemon.node import Node
from p2ptrain.daemon.snapshot import CheckpointFigures
from p2ptrain.optim.protocol import GlobalProgress, GuardTargets
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.optim.trainer import StepStats
from p2ptrain.status import PauseReason
from p2ptrain.swarm.dht import FingerprintMismatch, IdentityInUse, IdentityLock, SwarmError
from p2ptrain.swarm.dialback import Dialback
from tests.support.clock import ManualClock

STEPS_PER_EPOCH = 4
STEP_SECONDS = 0.1
PEER = "/ip4/127.0.0.1/tcp/4001/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"




class FakeOptimizer:
    def __init__(self, swarm_epoch: int = 0) -> None:
        self.stats = SwarmStats()
        self.epoch = 0
        self.swarm_epoch = swarm_epoch
        self.downloads = self.step_asides = self.settles = self.rejoins = 0
        self.applied: list[Any] = []

    @property
    def local_epoch(self) -> int:
        return self.epoch

    def global_progress(self) -> GlobalProgress:
        return GlobalProgress(epoch=self.swarm_epoch, num_peers=2, known=True)

    def step(self, batch_size: int) -> None: ...
    def zero_grad(self) -> None: ...

    def load_state_from_peers(self) -> bool:
        self.downloads += 1
        self.epoch = self.swarm_epoch
        return True

    def checkpoint_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def restore(self, state: dict[str, Any]) -> None: ...

    def step_aside(self) -> None:
        self.step_asides += 1

    def settle(self) -> None:
        self.settles += 1

    def rejoin(self) -> None:
        self.rejoins += 1

    def guard_targets(self) -> GuardTargets:
        return GuardTargets()

    def flush(self) -> None: ...
    def shutdown(self) -> None: ...

    def apply_training(self, cfg: Any) -> None:
        self.applied.append(cfg)


class FakeTrainer:
    """Each step advances the fake clock; an epoch every STEPS_PER_EPOCH steps."""

    def __init__(self, optimizer: FakeOptimizer, clock: ManualClock, on_step: Any = None) -> None:
        self.optimizer, self.clock, self.on_step = optimizer, clock, on_step
        self.steps = self.samples_processed = self.nonfinite_skips = 0

    @property
    def epoch(self) -> int:
        return self.optimizer.epoch

    def step(self) -> StepStats:
        self.steps += 1
        self.clock.now += STEP_SECONDS
        if self.on_step is not None:
            self.on_step(self.steps)
        self.samples_processed += 8
        if self.steps % STEPS_PER_EPOCH == 0:
            self.optimizer.epoch += 1
        return StepStats(3.0, 8, STEP_SECONDS, False, self.epoch)

    def validation_loss(self) -> float:
        return 2.5


class FakeRollback:
    rollbacks = 0

    def after_step(self, epoch: int) -> bool:
        return False


@dataclass
class FakeParts:
    trainer: FakeTrainer
    optimizer: FakeOptimizer
    rollback: FakeRollback = field(default_factory=FakeRollback)
    fingerprint: str = "f" * 16
    checkpoints: int = 0
    closed: bool = False
    #: A task whose stream reports no coverage (not sharded data).
    task: Any = field(default_factory=lambda: SimpleNamespace(train_batches=object()))

    @property
    def checkpointer(self) -> Any:
        return type("C", (), {"figures": CheckpointFigures(ok=self.checkpoints)})()

    def save_checkpoint(self, **extra: Any) -> bool:
        self.checkpoints += 1
        return True

    def close(self) -> None:
        self.closed = True


class FakeSwarm(JoinedSwarm):
    #: What libp2p gives when asked for the addresses again (None: those of the start; an error: raised).
    addresses_now: list[str] | Exception | None = None
    #: Called on each look at the run's model (it may raise FingerprintMismatch, as the DHT's would).
    on_fingerprint: Callable[[], None] = staticmethod(lambda: None)

    def refresh_fingerprint(self, run_id: str, fingerprint: str, met: Any = ()) -> None:
        self.on_fingerprint()

    def current_maddrs(self) -> list[str]:
        if isinstance(self.addresses_now, Exception):
            raise self.addresses_now
        return list(self.maddrs if self.addresses_now is None else self.addresses_now)

    def close(self) -> None:
        self.closed = True


class FakeBuilder:
    """The builder's methods with fakes; an owned run's plan and keeper are whatever a test sets."""

    def __init__(self, clock: ManualClock, *, swarm_epoch: int = 0, fail_join: Exception | None = None,
                 fail_build: Exception | None = None, on_step: Any = None, dialback: Dialback | None = None,
                 on_fingerprint: Callable[[], None] | None = None) -> None:
        self.optimizer = FakeOptimizer(swarm_epoch)
        self.parts = FakeParts(FakeTrainer(self.optimizer, clock, on_step), self.optimizer)
        self.fail_join, self.fail_build = fail_join, fail_build
        self.dialback = dialback
        self.on_fingerprint = on_fingerprint
        self.swarm: FakeSwarm | None = None
        self.plan: Any = None
        self.keeper: Any = None
        self.joined_with: dict[str, Any] = {}
        self.built_with: dict[str, Any] = {}

    def prepare(self, config: NodeConfig, state_dir: Path) -> Any:
        if isinstance(self.plan, Exception):
            raise self.plan
        return self.plan

    def join(self, config: NodeConfig, state_dir: Path, initial_peers: Any, validators: Any, stopper: Any,
             wall_clock: Any, plan: Any = None) -> JoinedSwarm:
        self.joined_with = {"config": config, "plan": plan}
        if self.fail_join is not None:
            raise self.fail_join
        self.swarm = FakeSwarm(dht=None, peer_id="12D3KooWFake", maddrs=["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWFake"],
                               state_dir=state_dir, dialback=self.dialback)
        if self.on_fingerprint is not None:
            self.swarm.on_fingerprint = self.on_fingerprint
        return self.swarm

    def follow_run(self, plan: Any, swarm: JoinedSwarm) -> Any:
        return self.keeper

    def build_training(self, config: NodeConfig, swarm: JoinedSwarm, stats: SwarmStats, *, live_peers: Any,
                       wall_clock: Any, long_operation: Any, run: Any = None, defences: Any = None,
                       wait: Any = None) -> Any:
        self.built_with = {"config": config, "run": run, "defences": defences, "wait": wait}
        if self.fail_build is not None:
            raise self.fail_build
        return self.parts


class RecordingHooks(NodeHooks):
    """Records what the node told it; ``idle`` advances the fake clock like a real paused pass."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.calls: list[str] = []
        self.outlets: NodeOutlets | None = None
        self.policy = PauseReason.NONE
        self.on_idle: Any = None
        self.reloaded: NodeConfig | None = None
        self.seen_by_reload: NodeConfig | None = None

    def starting(self, outlets: NodeOutlets) -> None:
        self.outlets = outlets
        self.calls.append("starting")

    def ready(self, presence: SwarmPresence) -> None:
        self.calls.append(f"ready:{presence.peer_id}")

    def progress(self) -> None:
        self.calls.append("progress")

    def idle(self) -> None:
        self.calls.append("idle")
        self.clock.now += 0.5
        if self.on_idle is not None:
            self.on_idle(self.calls.count("idle"))

    def policy_pause_reason(self) -> PauseReason:
        return self.policy

    def reload(self, current: NodeConfig) -> NodeConfig | None:
        self.seen_by_reload = current
        return self.reloaded

    def stopping(self) -> None:
        self.calls.append("stopping")


def _config(tmp_path: Path, **training: Any) -> NodeConfig:
    return parse_config({"node": {"state_dir": str(tmp_path / "state")}, "api": {"enabled": False},
                         "training": {"validate_every": 1e6, **training}, "checkpoint": {"interval": 1e6}}, "test")


def _node(tmp_path: Path, builder_kwargs: dict[str, Any] | None = None, join: tuple[str, ...] = (), **training: Any,
          ) -> tuple[Node, FakeBuilder, RecordingHooks, list[int]]:
    """A node on fakes; ``join``: its initial peers (none: it starts the swarm, so it syncs with nobody)."""
    clock = ManualClock()
    builder = FakeBuilder(clock, **(builder_kwargs or {}))
    hooks = RecordingHooks(clock)
    threads: list[int] = []
    node = Node(_config(tmp_path, **training), extra_peers=join, hooks=hooks, builder=builder,  # type: ignore[arg-type]
                clock=clock, wall_clock=lambda: 1.7e9, set_threads=threads.append, paused_wait=0.0)
    return node, builder, hooks, threads


def _states(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().rsplit("-> ", 1)[1] for r in caplog.records if r.getMessage().startswith("state ")]


def test_trains_until_max_epochs_then_stops_cleanly_with_a_final_checkpoint(tmp_path, caplog):
    caplog.set_level("INFO")
    node, builder, hooks, _ = _node(tmp_path, max_epochs=3)
    assert node.run() == 0
    assert builder.optimizer.epoch == 3 and builder.parts.trainer.steps == 3 * STEPS_PER_EPOCH
    assert builder.parts.checkpoints == 1 and builder.parts.closed and builder.swarm.closed
    assert _states(caplog) == ["JOINING", "SYNCING", "TRAINING", "STOPPING", "STOPPED"]
    assert hooks.calls[0] == "starting" and hooks.calls[1] == "ready:12D3KooWFake" and hooks.calls[-1] == "stopping"
    assert node.stopper.reason == "max_epochs reached"
    assert node.latest.status().state == "stopped" and node.latest.status().samples_processed_total == 96


@pytest.mark.parametrize(("dialback", "reachability", "lines"), [
    (Dialback(False, "198.51.100.7", "QmPeer"), "client",
     ["reachability: client (a peer could not connect to 198.51.100.7)", "no peer that others can dial is training"]),
    (Dialback(True, "198.51.100.7:41400", "QmPeer"), "public", ["reachability: public; peers dial /ip4/198.51.100.7"]),
])
def test_what_a_peer_found_dialling_back_decides_reachability_and_the_reachable_peer_line(
        tmp_path, caplog, dialback: Dialback, reachability: str, lines: list[str]) -> None:
    """A client with nobody in its swarm view says once, at WARNING, that no reachable peer trains (after the
    watch's 10 s: 40 epochs of 0.4 s on the fake clock); a public node never speaks of reachable peers."""
    caplog.set_level("INFO")
    node, _, _, _ = _node(tmp_path, max_epochs=40, builder_kwargs={"dialback": dialback})
    assert node.run() == 0
    assert node.latest.status().reachability == reachability
    spoken = [record for record in caplog.records if "reachab" in record.getMessage()]
    assert [r.getMessage()[:len(line)] for r, line in zip(spoken, lines, strict=False)] == lines, spoken
    assert len(spoken) == len(lines) and all(r.levelno == logging.WARNING for r in spoken[1:])


def test_a_relay_slot_taken_after_the_start_shows_in_the_status_and_in_one_line(tmp_path, caplog):
    """libp2p reserves a relay slot some time after the start: the node asks for its addresses again each
    minute (fake clock: 0.1 s a step).  An observed address that changes nothing else, and a failed read,
    say nothing; the slot makes the node ``relayed`` in the status and in the start's line."""
    caplog.set_level("INFO")
    start = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWFake"
    observed = "/ip4/192.0.2.8/tcp/41400/p2p/12D3KooWFake"
    circuit = "/ip4/198.51.100.7/tcp/41400/p2p/12D3KooWRelay/p2p-circuit/p2p/12D3KooWFake"
    # (step, addresses from then on): before the checks at 60 s, 120 s and 180 s.
    changes = {500: [start, observed], 1100: RuntimeError("the DHT is busy"), 1700: [start, circuit]}
    seen: dict[int, tuple[str, ...]] = {}

    def on_step(step: int) -> None:
        if step in changes:
            builder.swarm.addresses_now = changes[step]
        if step in (1000, 1600):
            seen[step] = node.board.identity.maddrs

    node, builder, _, _ = _node(tmp_path, max_epochs=500, builder_kwargs={"on_step": on_step})
    assert node.run() == 0
    assert seen == {1000: (start, observed), 1600: (start, observed)}
    status = node.latest.status()
    assert status.reachability == "relayed" and list(status.visible_maddrs) == [start, circuit]
    spoken = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reachability:")]
    assert spoken == [f"reachability: unknown (listening on {start}); if peers cannot dial this node, forward "
                      "its port and set swarm.announce_addrs, or set swarm.client_mode",
                      f"reachability: relayed; peers dial {circuit} (through a relay on a public peer)"], spoken


def test_the_run_s_model_is_looked_at_again_soon_after_the_start_then_each_minute(tmp_path):
    """A peer's record reaches the DHT a few seconds after it starts: a node whose model differs must not
    train for a minute before it can tell (fake clock: 0.1 s a step, 200 s of training)."""
    looks: list[float] = []

    def look() -> None:
        looks.append(builder.parts.trainer.clock.now)

    node, builder, _, _ = _node(tmp_path, max_epochs=500, builder_kwargs={"on_fingerprint": look})
    start = builder.parts.trainer.clock.now
    assert node.run() == 0
    assert [round(look - start) for look in looks] == [5, 15, 35, 75, 135, 195], looks


def test_a_mismatch_found_on_a_later_look_stops_the_node_with_78(tmp_path, caplog):
    def refuse() -> None:
        raise FingerprintMismatch("model fingerprint ffff differs from run 'r''s model abcd")

    node, builder, _, _ = _node(tmp_path, max_epochs=500, builder_kwargs={"on_fingerprint": refuse})
    start = builder.parts.trainer.clock.now
    assert node.run() == 78
    assert builder.parts.trainer.clock.now - start < 6 and builder.parts.checkpoints == 1
    assert "differs from run" in node.stopper.reason


def test_pause_steps_aside_then_resume_rejoins_then_leave_stops(tmp_path):
    def on_step(step: int) -> None:
        if step == 3:
            node.control.submit(ControlRequest(Command.PAUSE, source="test"))
        if step == 6:
            node.control.submit(ControlRequest(Command.LEAVE, source="test"))

    node, builder, hooks, _ = _node(tmp_path, {"on_step": on_step})

    def on_idle(count: int) -> None:
        assert node.latest.status().state == "paused" and node.latest.status().pause_reason == "manual"
        if count == 3:
            node.control.submit(ControlRequest(Command.RESUME, source="test"))

    hooks.on_idle = on_idle
    assert node.run() == 0
    assert hooks.calls.count("idle") == 3
    assert builder.optimizer.step_asides == 1 and builder.optimizer.rejoins == 1
    assert builder.optimizer.settles == 3  # each paused pass lands what has arrived (a paused node serves state)
    assert builder.parts.trainer.steps == 6
    assert node.stopper.reason == "leave requested by test"


def test_a_timed_pause_ends_by_itself(tmp_path, caplog):
    caplog.set_level("INFO")

    def on_step(step: int) -> None:
        if step == 1:
            node.control.submit(ControlRequest(Command.PAUSE, duration=2.0, source="test"))
        if step == 3:
            node.request_stop("test over")

    node, builder, hooks, _ = _node(tmp_path, {"on_step": on_step})
    assert node.run() == 0
    # Each paused pass advances the fake clock by 0.5 s: a 2 s pause takes four passes, then training resumes.
    assert hooks.calls.count("idle") == 4
    assert "timed pause is over: resuming" in caplog.messages
    assert builder.optimizer.rejoins == 1


def test_a_control_request_cuts_a_paused_loop_s_wait_short(tmp_path):
    """Paused, the loop sleeps up to paused_wait between passes (an hour here); a control request,
    from another thread as the API sends it, ends that sleep instead of waiting it out."""
    clock = ManualClock()
    builder = FakeBuilder(clock, on_step=lambda step: on_step(step))
    hooks = RecordingHooks(clock)
    node = Node(_config(tmp_path), hooks=hooks, builder=builder, clock=clock,  # type: ignore[arg-type]
                wall_clock=lambda: 1.7e9, set_threads=lambda _: None, paused_wait=3600.0)

    def on_step(step: int) -> None:
        if step == 1:
            node.control.submit(ControlRequest(Command.PAUSE, source="test"))
        if step == 2:
            node.request_stop("test over")

    def on_idle(count: int) -> None:  # called just before the paused wait: the resume comes while it sleeps
        if count == 1:
            threading.Timer(0.05, node.control.submit, [ControlRequest(Command.RESUME, source="api")]).start()

    hooks.on_idle = on_idle
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(node.run()), daemon=True)
    runner.start()
    runner.join(30)
    slept_through = runner.is_alive()
    if slept_through:
        node.request_stop("the resume did not wake the loop")  # a stop does: end the run
        runner.join(30)
    assert not slept_through, "a resume waited out the paused loop's wait"
    # The pause's own wake-up may end the first wait at once: one more pass, never a long sleep.
    assert codes == [0] and hooks.calls.count("idle") in (1, 2) and builder.parts.trainer.steps == 2


def test_a_paused_node_re_withdraws_from_averaging_now_and_then(tmp_path):
    node, builder, hooks, _ = _node(tmp_path)
    hooks.policy = PauseReason.SCHEDULE
    hooks.on_idle = lambda count: count == 50 and node.request_stop("test over")
    assert node.run() == 0
    # 50 passes of 0.5 s = 25 s of pause: withdrawn at once, then every STEP_ASIDE_EVERY (10 s).
    assert builder.optimizer.step_asides == 3
    assert builder.parts.trainer.steps == 0


def test_sighup_reload_applies_the_new_settings_in_the_loop(tmp_path, caplog):
    def on_step(step: int) -> None:
        if step == 2:
            node.control.submit(ControlRequest(Command.RELOAD, source="SIGHUP"))

    node, builder, hooks, threads = _node(tmp_path, {"on_step": on_step}, max_epochs=100, threads=1)
    hooks.reloaded = node.config.model_copy(update={"training": node.config.training.model_copy(
        update={"max_epochs": 2, "threads": 3})})
    assert node.run() == 0
    assert hooks.seen_by_reload is node.config  # the reload hook is shown the config in force
    assert threads == [1, 3]
    assert builder.optimizer.epoch == 2  # the reloaded max_epochs ended the run
    assert node.current_config().training.max_epochs == 2


def test_a_reloaded_cpu_share_holds_the_loop_and_shows_in_the_snapshot(tmp_path):
    """volunteer.max_cpu_percent from a SIGHUP reaches the loop's duty cycle: each 0.1 s step (a
    fully busy core) is then followed by 0.1 s of idling, and status shows the new limit and use."""
    clock = ManualClock()
    builder = FakeBuilder(clock, on_step=lambda step: on_step(step))
    hooks = RecordingHooks(clock)

    def idle(seconds: float) -> bool:
        clock.now += seconds
        return node.stopper.is_set()

    share = CpuShare(0.0, cpu_seconds=lambda: builder.parts.trainer.steps * STEP_SECONDS, clock=clock, wait=idle,
                     cores=1)
    node = Node(_config(tmp_path), hooks=hooks, builder=builder, clock=clock,  # type: ignore[arg-type]
                wall_clock=lambda: 1.7e9, set_threads=lambda _: None, paused_wait=0.0, cpu_share=share)

    def on_step(step: int) -> None:
        if step == 4:
            assert share.idle_seconds_total == 0.0  # no limit yet
            node.control.submit(ControlRequest(Command.RELOAD, source="SIGHUP"))
        if step == 24:
            node.request_stop("test over")

    hooks.reloaded = node.config.model_copy(update={"volunteer": node.config.volunteer.model_copy(
        update={"max_cpu_percent": 50.0})})
    assert node.run() == 0
    assert share.limit_percent == 50.0
    assert share.idle_seconds_total == pytest.approx(20 * STEP_SECONDS, abs=STEP_SECONDS)  # 20 steps after it
    status = node.latest.status()
    assert status.cpu_limit_percent == 50.0 and status.cpu_used_percent == pytest.approx(50.0, abs=5.0)
    assert status.cpu_idle_seconds_total == pytest.approx(share.idle_seconds_total)


def test_a_refused_reload_keeps_the_running_config(tmp_path):
    def on_step(step: int) -> None:
        if step == 1:
            node.control.submit(ControlRequest(Command.RELOAD, source="SIGHUP"))

    node, builder, hooks, threads = _node(tmp_path, {"on_step": on_step}, max_epochs=1)
    hooks.reloaded = None
    assert node.run() == 0
    assert node.current_config() is node.config and threads == [0]


def test_the_optimizer_waits_through_the_node_s_stop_event(tmp_path):
    """Pauses between state-download attempts end at once on a stop (no plain sleeps)."""
    node, builder, _, _ = _node(tmp_path, max_epochs=1)
    assert node.run() == 0
    assert builder.built_with["wait"] == node.stopper.wait


def test_a_newcomer_behind_the_swarm_downloads_its_state_once(tmp_path):
    node, builder, _, _ = _node(tmp_path, {"swarm_epoch": 7}, join=(PEER,), max_epochs=8)
    assert node.run() == 0
    assert builder.optimizer.downloads == 1 and builder.parts.trainer.steps == STEPS_PER_EPOCH


def test_the_node_that_started_the_swarm_never_waits_to_sync(tmp_path):
    node, builder, _, _ = _node(tmp_path, {"swarm_epoch": 7}, max_epochs=1)
    assert node.run() == 0
    assert builder.optimizer.downloads == 0 and builder.parts.trainer.steps == STEPS_PER_EPOCH


def test_a_node_in_step_with_the_swarm_does_not_download(tmp_path):
    node, builder, _, _ = _node(tmp_path, max_epochs=1)
    assert node.run() == 0
    assert builder.optimizer.downloads == 0


def test_a_stop_while_syncing_skips_training_but_still_checkpoints(tmp_path, caplog):
    caplog.set_level("INFO")
    node, builder, hooks, _ = _node(tmp_path, {"swarm_epoch": 5}, join=(PEER,))
    builder.optimizer.load_state_from_peers = lambda: node.request_stop("SIGTERM") or False  # type: ignore
    assert node.run() == 0
    assert "TRAINING" not in _states(caplog) and builder.parts.checkpoints == 1
    assert not any(call.startswith("ready") for call in hooks.calls)


@pytest.mark.parametrize(("where", "error", "code"), [
    ("fail_build", ConfigError("task.entrypoint: nope"), 78),
    ("fail_build", FingerprintMismatch("model fingerprint a differs from run's model b"), 78),
    ("fail_join", SwarmError("could not reach any initial peer"), 1),
    ("fail_join", IdentityInUse("another p2ptrain node is running"), 75),
    ("fail_join", OSError("[Errno 98] Address already in use"), 1),
])
def test_exit_codes(tmp_path, capsys, where, error, code):
    node, builder, hooks, _ = _node(tmp_path, {where: error})
    assert node.run() == code
    label = "config error: " if isinstance(error, ConfigError) else ""  # the CLI's prefix, too
    assert capsys.readouterr().err == f"p2ptrain: {label}{error}\n"
    assert hooks.calls[-1] == "stopping"  # whatever happened, the services were stopped


def test_an_api_host_this_machine_does_not_have_exits_78_before_joining(tmp_path, capsys):
    from p2ptrain.daemon.service import ServiceHooks
    from p2ptrain.daemon.systemd import SystemdNotifier

    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "api": {"host": "nonexistent.invalid"}},
                          "test")  # passes config check: the name is well formed
    builder = FakeBuilder(ManualClock())
    node = Node(config, hooks=ServiceHooks(config, None, SystemdNotifier(None)), builder=builder,  # type: ignore
                set_threads=lambda _: None)
    assert node.run() == 78
    assert capsys.readouterr().err.startswith(
        "p2ptrain: config error: api.host: cannot listen on 'nonexistent.invalid'")
    assert builder.swarm is None  # failed before joining anything


def test_a_stop_while_joining_is_a_clean_exit(tmp_path, capsys):
    node, _, _, _ = _node(tmp_path, {"fail_join": SwarmError("gave up joining")})
    node.request_stop("SIGTERM")
    assert node.run() == 0
    assert capsys.readouterr().err == ""


def test_a_second_node_on_the_same_state_dir_exits_75(tmp_path, capsys):
    node, _, _, _ = _node(tmp_path)
    state_dir = node.config.state_dir()
    state_dir.mkdir(parents=True)
    holder = IdentityLock(state_dir)
    holder.acquire()
    try:
        assert node.run() == 75
    finally:
        holder.release()
    assert "another p2ptrain node" in capsys.readouterr().err


def test_no_watchdog_progress_while_a_step_is_stuck(tmp_path):
    """A hung step must starve the watchdog (systemd then restarts the node); it resumes after."""
    release = threading.Event()
    stuck = threading.Event()

    def on_step(step: int) -> None:
        if step == 5:
            stuck.set()
            release.wait(10)
        if step == 10:
            node.request_stop("test over")

    node, _, hooks, _ = _node(tmp_path, {"on_step": on_step})
    runner = threading.Thread(target=node.run)
    runner.start()
    assert stuck.wait(10)
    # Held in its fifth step: the four before it fed the watchdog, this one has not (the loop's own
    # thread is the only one that feeds it, and it is the one held).
    assert hooks.calls.count("progress") == 4
    release.set()
    runner.join(10)
    assert not runner.is_alive() and hooks.calls.count("progress") == 10
