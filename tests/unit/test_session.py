"""The swarm session a node and ``p2ptrain fetch`` share: its steps in order, against a fake builder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from p2ptrain.config.schema import parse_config
from p2ptrain.daemon.hooks import NodeHooks, SwarmPresence
from p2ptrain.daemon.session import SwarmSession
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.swarm.dht import IdentityInUse

PEER = "/ip4/127.0.0.1/tcp/4001/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"


class Log(list[str]):
    def closer(self, name: str) -> Any:
        return SimpleNamespace(close=lambda: self.append(f"close {name}"))


class Builder:
    """Each builder method the session calls, logged; an owned run's plan when ``owned``."""

    def __init__(self, log: Log, config: Any, *, owned: bool) -> None:
        self.log, self.owned = log, owned
        self.local = config
        self.planned = config.model_copy(update={"swarm": config.swarm.model_copy(update={"run_id": "planned"})})
        self.merged = config.model_copy(update={"swarm": config.swarm.model_copy(update={"run_id": "manifest"})})

    def prepare(self, config: Any, state_dir: Path) -> Any:
        self.log.append("prepare")
        return SimpleNamespace(config=self.planned, manifest=None) if self.owned else None

    def fetch_manifest(self, plan: Any, peers: list[str], stopper: Any) -> Any:
        self.log.append(f"fetch manifest via {len(peers)} peer(s)")
        return SimpleNamespace(config=self.merged, manifest="v1")

    def join(self, config: Any, state_dir: Path, initial_peers: Any, validators: list[Any], stopper: Any,
             wall_clock: Any, plan: Any = None) -> Any:
        assert (state_dir / "node.lock").exists(), "joined before the state directory was locked"
        self.log.append(f"join {config.swarm.run_id} with {validators}")
        swarm = self.log.closer("swarm")
        swarm.dht, swarm.peer_id, swarm.trusted = "dht", "QmSelf", ("QmPeer",)
        return swarm

    def follow_run(self, plan: Any, swarm: Any) -> Any:
        self.log.append("follow run")
        return SimpleNamespace(join=lambda stopper, timeout: self.merged)


class Hooks(NodeHooks):
    def __init__(self, log: Log) -> None:
        self.log = log
        self.presence: SwarmPresence | None = None

    def record_validators(self, run_id: str) -> list[Any]:
        return [f"records of {run_id}"]

    def joined(self, presence: SwarmPresence) -> bool:
        self.presence = presence
        self.log.append(f"records of {presence.run_id} from {presence.peer_id}")
        return True

    def stopping(self) -> None:
        self.log.append("close hooks")


def _session(tmp_path: Path, *, owned: bool) -> tuple[SwarmSession, Log, Hooks]:
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")}, "api": {"enabled": False},
                           "swarm": {"run_id": "local", "initial_peers": [PEER], "peer_checks": True}}, "n.toml")
    log = Log()
    hooks = Hooks(log)
    session = SwarmSession(config, builder=Builder(log, config, owned=owned), hooks=hooks, stopper=Stopper(),
                           initial_peers=lambda: [PEER], wall_clock=lambda: 1.7e9)
    return session, log, hooks


@pytest.mark.parametrize("fetch_first", [True, False])
def test_an_owned_run_goes_plan_lock_join_manifest_records_build_leave(tmp_path: Path, fetch_first: bool) -> None:
    session, log, hooks = _session(tmp_path, owned=True)
    assert session.prepare(fetch_manifest=fetch_first).swarm.run_id == ("manifest" if fetch_first else "planned")
    assert not session.state_dir.exists()  # nothing written before the plan held
    session.open()
    assert session.defences is not None
    session.join()
    assert session.follow_run(timeout=5.0).swarm.run_id == "manifest"
    assert session.read_records() is True
    assert hooks.presence is not None and hooks.presence.evidence is not None
    assert hooks.presence.evidence.trusted_peers() == {"QmPeer"}  # the peer it joined through
    made: dict[str, Any] = {}

    def make(config: Any, swarm: Any, **run: Any) -> Any:
        made.update(run_id=config.swarm.run_id, run=run)
        return log.closer("parts")

    session.build(make)
    assert made["run_id"] == "manifest" and made["run"]["run"] is session.keeper
    assert made["run"]["defences"] is session.defences
    session.leave(lambda: 0)
    joined_as = "manifest" if fetch_first else "planned"
    assert log == ["prepare", *(["fetch manifest via 1 peer(s)"] if fetch_first else []),
                   f"join {joined_as} with ['records of {joined_as}']", "follow run",
                   "records of manifest from QmSelf", "close hooks", "close parts", "close swarm"]
    again, _, _ = _session(tmp_path, owned=True)
    again.open()  # the lock was released on leaving
    again.leave(lambda: 0)


def test_a_plain_run_has_no_plan_and_a_held_state_directory_is_refused(tmp_path: Path) -> None:
    session, log, _ = _session(tmp_path, owned=False)
    assert session.prepare(fetch_manifest=True).swarm.run_id == "local"
    session.open()
    other, _, _ = _session(tmp_path, owned=False)
    with pytest.raises(IdentityInUse):
        other.open()
    session.join()
    assert session.follow_run(timeout=5.0).swarm.run_id == "local" and session.keeper is None
    session.leave(lambda: 0)  # nothing built: the hooks and the swarm are closed
    assert log == ["prepare", "join local with ['records of local']", "close hooks", "close swarm"]
