"""Swarm join logic without a network: identity lock, bootstrap retries, fingerprint claims."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hivemind.dht.node
import pytest
from hivemind.p2p import P2PDaemonError, PeerID

from p2ptrain.config.schema import SwarmSection
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.dhtkeys import averaging_prefix, progress_key
from p2ptrain.swarm.dht import (
    FingerprintMismatch,
    IdentityInUse,
    IdentityLock,
    PeersRefused,
    SwarmError,
    claim_fingerprint,
    dht_kwargs,
    start_dht,
)
from p2ptrain.waiting import wait_until
from tests.support.clock import ManualClock

PEER = "/ip4/127.0.0.1/tcp/41400/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"


def test_identity_lock_refuses_a_second_process(tmp_path: Path) -> None:
    lock = IdentityLock(tmp_path)
    lock.acquire()
    try:
        code = ("import sys; from pathlib import Path; from p2ptrain.swarm.dht import IdentityLock, IdentityInUse\n"
                "try:\n    IdentityLock(Path(sys.argv[1])).acquire()\nexcept IdentityInUse as e:\n"
                "    print(e); sys.exit(3)\n")
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                               timeout=60)
        assert other.returncode == 3
        assert f"pid {__import__('os').getpid()}" in other.stdout and str(tmp_path) in other.stdout
    finally:
        lock.release()
    again = IdentityLock(tmp_path)
    again.acquire()  # released locks can be taken again
    again.release()


def test_identity_lock_is_exclusive_within_a_process_too(tmp_path: Path) -> None:
    first = IdentityLock(tmp_path)
    first.acquire()
    with pytest.raises(IdentityInUse):
        IdentityLock(tmp_path).acquire()
    first.release()


def test_dht_kwargs_carry_loopback_safety_switches(tmp_path: Path) -> None:
    cfg = SwarmSection(listen_addrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False,
                       announce_addrs=["/ip4/127.0.0.1/tcp/5000"])
    kwargs = dht_kwargs(cfg, tmp_path / "identity.key", [PEER])
    assert kwargs["nat_port_map"] is False and kwargs["auto_nat"] is False
    assert kwargs["host_maddrs"] == ["/ip4/127.0.0.1/tcp/0"]
    assert kwargs["announce_maddrs"] == ["/ip4/127.0.0.1/tcp/5000"]
    assert kwargs["identity_path"] == str(tmp_path / "identity.key")
    assert kwargs["initial_peers"] == [PEER]
    assert "trusted_relays" not in kwargs and kwargs["use_auto_relay"] is True


def test_a_search_of_k_nodes_reaches_every_replica_of_a_value(tmp_path: Path) -> None:
    # The DHT's k (bucket_size) bounds how many nodes a search visits; values live on hivemind's
    # num_replicas nearest nodes, which a search must still reach, at any swarm size.
    replicas = inspect.signature(hivemind.dht.node.DHTNode.create).parameters["num_replicas"].default
    kwargs = dht_kwargs(SwarmSection(), tmp_path / "identity.key", [PEER])
    assert replicas <= kwargs["bucket_size"] < 20  # below hivemind's 20: a search's cost no longer grows with the swarm


def test_auto_relay_follows_the_relay_switch_and_relays_are_trusted(tmp_path: Path) -> None:
    # p2pd refuses to start with auto relay on and the relay transport off
    off = dht_kwargs(SwarmSection(use_relay=False), tmp_path / "identity.key", [PEER])
    assert (off["use_relay"], off["use_auto_relay"]) == (False, False)
    named = dht_kwargs(SwarmSection(relays=[PEER]), tmp_path / "identity.key", [])
    assert named["trusted_relays"] == [PEER] and named["use_auto_relay"] is True




class _ClockStopper:
    """A stop event whose waits advance a fake clock instead of sleeping."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        self.clock.now += timeout or 0.0
        return False


def test_bootstrap_retries_with_backoff_then_gives_up(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    stop = _ClockStopper(clock)
    attempts: list[dict[str, Any]] = []

    def failing_dht(**kwargs: Any) -> Any:
        attempts.append(kwargs)
        raise P2PDaemonError("Daemon failed to start: failed to connect to bootstrap peers")

    cfg = SwarmSection(bootstrap_timeout=40)
    with pytest.raises(SwarmError, match=r"no initial peer answered after \d+ attempts in 40s"):
        start_dht(cfg, tmp_path, [PEER], [], stop, dht_factory=failing_dht, clock=clock)
    assert stop.waits[:6] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]  # exponential, capped (p2ptrain.waiting.BACKOFF)
    assert sum(stop.waits) == pytest.approx(40.0)


def test_bootstrap_succeeds_after_transient_failures(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    calls = {"n": 0}

    def flaky_dht(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] < 3:
            raise P2PDaemonError("failed to connect to bootstrap peers")
        return SimpleNamespace(kind="dht")

    dht = start_dht(SwarmSection(), tmp_path, [PEER], [], _ClockStopper(clock), dht_factory=flaky_dht, clock=clock)
    assert dht.kind == "dht" and calls["n"] == 3


def test_peers_that_refuse_every_request_are_retried_then_named(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    seen: list[dict[str, Any]] = []

    def refusing_dht(**kwargs: Any) -> Any:
        seen.append(kwargs)
        raise RuntimeError("DHTNode bootstrap failed: none of the initial_peers responded to a ping.")

    with pytest.raises(PeersRefused, match=r"^no initial peer answered our DHT requests after \d+ attempts in 8s"):
        start_dht(SwarmSection(bootstrap_timeout=8), tmp_path, [PEER], [], _ClockStopper(clock),
                  dht_factory=refusing_dht, clock=clock, authorizer="the run's authorizer")
    assert len(seen) > 1 and all(kwargs["authorizer"] == "the run's authorizer" for kwargs in seen)


def test_other_runtime_errors_are_not_swarm_weather(tmp_path: Path) -> None:
    def broken_dht(**kwargs: Any) -> Any:
        raise RuntimeError("something else broke")

    with pytest.raises(RuntimeError, match="something else broke"):
        start_dht(SwarmSection(), tmp_path, [PEER], [], Stopper(), dht_factory=broken_dht)


def test_bootstrap_stops_when_asked(tmp_path: Path) -> None:
    stopper = Stopper()
    threading.Timer(0.2, stopper.request, args=("test",)).start()

    def failing_dht(**kwargs: Any) -> Any:
        raise P2PDaemonError("failed to connect to bootstrap peers")

    with pytest.raises(SwarmError, match="stopped while joining"):
        start_dht(SwarmSection(bootstrap_timeout=600), tmp_path, [PEER], [], stopper, dht_factory=failing_dht)


def test_first_node_with_a_broken_listen_address_fails_at_once(tmp_path: Path) -> None:
    def failing_dht(**kwargs: Any) -> Any:
        raise P2PDaemonError("address already in use")

    with pytest.raises(SwarmError, match="cannot start the p2p daemon"):
        start_dht(SwarmSection(), tmp_path, [], [], Stopper(), dht_factory=failing_dht)


class _FakeDHT:
    """Just enough of hivemind.DHT's get/store for fingerprint claims; ``records`` stands for what the
    identity-bound peer records say (peer ID -> fingerprint), ``progress`` for hivemind's entries."""

    def __init__(self) -> None:
        self.entries: dict[str, float] = {}
        self.records: dict[str, str] = {}
        self.progress: dict[str, dict[bytes, Any]] = {}
        self.peer_id = PeerID(b"\x12\x20" + b"\x01" * 32)

    def get(self, key: str, latest: bool = False) -> Any:
        if key.endswith("_peers"):
            return self
        values = self.entries if key.endswith("_model_fingerprint") else self.progress.get(key, {})
        if not values:
            return None
        return SimpleNamespace(value={k: SimpleNamespace(value=v) for k, v in values.items()})

    def store(self, key: str, subkey: str, value: float, **kwargs: Any) -> None:
        self.entries[subkey] = value

    def trains(self, fingerprint: str, peer: str) -> None:
        """A live peer whose identity-bound record names ``fingerprint``."""
        self.records[peer] = fingerprint

    def progress_entry(self, fingerprint: str, peer: bytes) -> None:
        """A hivemind progress entry under ``fingerprint``'s keys: self-declared, anyone can write it."""
        entry = {"peer_id": peer, "epoch": 3, "samples_accumulated": 8, "samples_per_second": 1.0, "time": 1.0,
                 "client_mode": False}
        key = progress_key(averaging_prefix("run", fingerprint))
        self.progress.setdefault(key, {})[b"[owner:" + peer + b"]"] = entry


@pytest.fixture(autouse=True)
def _records_of_the_fake_dht(monkeypatch: pytest.MonkeyPatch) -> None:
    import p2ptrain.swarm.records

    monkeypatch.setattr(p2ptrain.swarm.records, "bound_fingerprints",
                        lambda found, run_id, now: dict(found.records) if isinstance(found, _FakeDHT) else {})


def test_fingerprint_first_claim_wins_and_a_node_whose_peers_train_another_model_is_refused() -> None:
    dht = _FakeDHT()
    assert claim_fingerprint(dht, "run", "aaaa", first_seen=100.0) == 100.0
    assert claim_fingerprint(dht, "run", "aaaa", first_seen=200.0) == 100.0  # keeps the original time
    dht.trains("aaaa", "peer-a")
    dht.trains("aaaa", "peer-b")
    with pytest.raises(FingerprintMismatch, match=r"model fingerprint bbbb differs from run 'run'.s model aaaa "
                                                  r"\(2 peer\(s\) this node joined through or averaged with"):
        claim_fingerprint(dht, "run", "bbbb", first_seen=300.0, trusted=("peer-a", "peer-b"))
    assert "bbbb" not in dht.entries  # a refused node never advertises its model


def test_a_foreign_fingerprint_entry_alone_never_stops_a_node(caplog: pytest.LogCaptureFixture) -> None:
    """Anyone can write the entry: with nobody seen training it, it is ignored (one warning)."""
    dht = _FakeDHT()
    dht.entries["ffff"] = 1.0  # a stranger's entry, older than anything honest
    dht.trains("ffff", str(dht.peer_id))  # only our own record: not evidence
    with caplog.at_level(logging.WARNING, logger="p2ptrain.swarm.dht"):
        assert claim_fingerprint(dht, "run-x", "aaaa", first_seen=100.0) == 100.0
        assert claim_fingerprint(dht, "run-x", "aaaa", first_seen=100.0) == 100.0
    assert "aaaa" in dht.entries
    warnings = [m for m in caplog.messages if "ignoring model fingerprint ffff" in m]
    assert warnings == ["ignoring model fingerprint ffff published under run 'run-x': no live peer is seen training it"]


def test_sybil_records_cannot_lock_a_node_out(caplog: pytest.LogCaptureFixture) -> None:
    """A stranger writes the entry, progress entries in many names under its keys, and the bound records of
    two identities of its own (identities are free): the first node of a run, or a node alone at a
    refresh, is not stopped; it warns once and keeps publishing its own model.  Only a witness (a peer it
    joined through or averaged with) saying so would stop it."""
    dht = _FakeDHT()
    dht.entries["ffff"] = 1.0
    for n in range(20):
        dht.progress_entry("ffff", bytes([n]) * 34)
    dht.trains("ffff", "sybil-1")
    dht.trains("ffff", "sybil-2")
    with caplog.at_level(logging.WARNING, logger="p2ptrain.swarm.dht"):
        for _ in range(3):  # refresh after refresh
            assert claim_fingerprint(dht, "run-y", "aaaa", first_seen=100.0) == 100.0
            assert claim_fingerprint(dht, "run-y", "aaaa", first_seen=100.0, trusted=("QmHonest",)) == 100.0
    assert "aaaa" in dht.entries
    warnings = [m for m in caplog.messages if "ignoring model fingerprint ffff" in m]
    assert warnings == ["ignoring model fingerprint ffff published under run 'run-y': 2 peer(s) name it in their "
                        "records, none of them a peer this node joined through or averaged with"]
    with pytest.raises(FingerprintMismatch, match=r"\(1 peer\(s\) this node joined through or averaged with"):
        claim_fingerprint(dht, "run-y", "aaaa", first_seen=100.0, trusted=("sybil-2",))


def test_the_record_of_the_peer_we_joined_through_is_enough_to_refuse() -> None:
    """A user who points a misconfigured node at a one-node swarm is told at once: the peer it was told to
    join is trusted, and its identity-bound record cannot be forged."""
    dht = _FakeDHT()
    dht.entries["aaaa"] = 1.0
    dht.trains("aaaa", "QmFirst")
    assert claim_fingerprint(dht, "run-z", "bbbb", first_seen=5.0) == 5.0  # a stranger's word alone: warned
    with pytest.raises(FingerprintMismatch, match=r"differs from run 'run-z'.s model aaaa \(1 peer\(s\)"):
        claim_fingerprint(dht, "run-z", "bbbb", first_seen=5.0, trusted=("QmFirst",))


def test_a_running_node_counts_the_peers_it_averaged_with_as_witnesses() -> None:
    from p2ptrain.daemon.builder import JoinedSwarm

    dht = _FakeDHT()
    dht.entries["aaaa"] = 1.0
    dht.trains("aaaa", "QmPartner")
    swarm = JoinedSwarm(dht, "QmMe", [], Path("."), first_seen=5.0, trusted=("QmFirst",))
    swarm.refresh_fingerprint("run-w", "bbbb")  # QmPartner is a stranger to it: warned, going on
    with pytest.raises(FingerprintMismatch):
        swarm.refresh_fingerprint("run-w", "bbbb", met={"QmPartner"})


def test_peers_training_our_model_outweigh_a_foreign_entry_and_its_trainers(caplog: pytest.LogCaptureFixture) -> None:
    dht = _FakeDHT()
    dht.entries["ffff"] = 1.0
    dht.trains("ffff", "stranger")
    dht.trains("ffff", "stranger-2")
    dht.trains("aaaa", "honest")
    with caplog.at_level(logging.WARNING, logger="p2ptrain.swarm.dht"):
        assert claim_fingerprint(dht, "run", "aaaa", first_seen=100.0) == 100.0
    assert "1 peer(s) train ours (aaaa)" in caplog.text


def test_stale_daemons_of_this_identity_are_stopped_and_no_others(tmp_path: Path) -> None:
    from p2ptrain.swarm.dht import stop_stale_daemons
    from p2ptrain.swarm.identity import identity_path

    ours, other = identity_path(tmp_path / "a"), identity_path(tmp_path / "b")
    sleeper = "import time; time.sleep(60)"
    stale = subprocess.Popen([sys.executable, "-c", sleeper, "p2pd", f"-id={ours}"])
    foreign = subprocess.Popen([sys.executable, "-c", sleeper, "p2pd", f"-id={other}"])
    try:
        for proc, path in ((stale, ours), (foreign, other)):  # until exec() has replaced the command line
            wait_until(lambda proc=proc, path=path: f"-id={path}" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                       .decode(errors="replace"), 10, "the command line after exec()", interval=0.02)
        assert stop_stale_daemons(ours, grace=5.0) == 1
        assert stale.wait(5) is not None
        assert foreign.poll() is None
        assert stop_stale_daemons(ours) == 0
    finally:
        for proc in (stale, foreign):
            proc.kill()
            proc.wait()


def test_the_loop_s_address_refresh_gives_up_on_a_dht_that_does_not_answer():
    """hivemind's own call waits for ever; the loop asks every minute and must not wait with it."""
    import concurrent.futures

    from p2ptrain.swarm.dht import visible_maddrs

    class SilentDHT:
        def __init__(self) -> None:
            self.future: concurrent.futures.Future[list[str]] = concurrent.futures.Future()

        def run_coroutine(self, coroutine, return_future: bool = False):
            assert return_future
            return self.future

    dht = SilentDHT()
    with pytest.raises(TimeoutError, match="did not say this node's addresses within 0 s"):
        visible_maddrs(dht, latest=True, timeout=0)  # type: ignore[arg-type]
    assert dht.future.cancelled()
    answered = SilentDHT()
    answered.future.set_result(["/ip4/127.0.0.1/tcp/1"])
    assert visible_maddrs(answered, timeout=0) == ["/ip4/127.0.0.1/tcp/1"]  # type: ignore[arg-type]
