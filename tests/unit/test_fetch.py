"""``p2ptrain fetch`` without a swarm: the fetcher's decisions against a fake builder, and bad input."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from p2ptrain.cli import main as cli
from p2ptrain.config.schema import TaskSection, TrainingSection, load_config, parse_config
from p2ptrain.daemon.builder import ClientParts, NodeBuilder
from p2ptrain.daemon.fetch import ModelFetcher, client_state_dir, fetch_config
from p2ptrain.errors import EX_UNAVAILABLE
from p2ptrain.model.export import CARD_FILE, CONFIG_FILE
from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.model.load import from_export
from p2ptrain.optim.protocol import GlobalProgress
from p2ptrain.run.manifest import new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.status import PeerRecord, SwarmView
from p2ptrain.swarm.dht import FingerprintMismatch, SwarmError
from p2ptrain.tasks import build_task

torch.set_num_threads(1)

PEER = "/ip4/127.0.0.1/tcp/41400/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"
DONOR = "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(10):
        (root / f"f{i}.py").write_text("".join(f"def f_{i}_{j}(x):\n    return x * {j}\n" for j in range(30)))
    return root


def _config(tmp_path: Path, corpus: Path, **swarm: Any) -> Any:
    return parse_config({
        "node": {"state_dir": str(tmp_path / "state")},
        "swarm": {"run_id": "unit-fetch", "initial_peers": [PEER], **swarm},
        "task": {"data_path": str(corpus), "seq_len": 16, "d_model": 16, "n_layers": 1, "n_heads": 2,
                 "validation_batches": 2, "validation_fraction": 0.2},
        "training": {"batch_size": 4, "seed": 5},
    }, "node.toml")


class FakeOptimizer:
    """Adopts ``donor_weights`` on call number ``adopt_on`` (never, if 0), as the hardened averager would."""

    def __init__(self, model: torch.nn.Module, donor_weights: dict[str, torch.Tensor], adopt_on: int) -> None:
        self.model, self.donor_weights, self.adopt_on = model, donor_weights, adopt_on
        self.state_averager = SimpleNamespace(last_download_source=None)
        self.calls = 0
        self.local_epoch = 0
        self.shut_down = False

    def global_progress(self) -> GlobalProgress:
        return GlobalProgress(epoch=7, num_peers=2, known=True)

    def load_state_from_peers(self) -> bool:
        self.calls += 1
        self.state_averager.last_download_source = None
        if self.calls != self.adopt_on:
            return False
        self.model.load_state_dict(self.donor_weights)
        self.state_averager.last_download_source = (DONOR, {"epoch": 7})
        self.local_epoch = 8  # hivemind may catch up one epoch past the donor's: the card says the donor's
        return True

    def shutdown(self) -> None:
        self.shut_down = True


class FakeBuilder:
    """NodeBuilder's prepare (real: manifests and run references are checked for real), a fake swarm."""

    def __init__(self, *, join_error: Exception | None = None, build_error: Exception | None = None,
                 adopt_on: int = 1) -> None:
        self.join_error, self.build_error, self.adopt_on = join_error, build_error, adopt_on
        self.joined = self.built = self.left = False
        self.optimizer: FakeOptimizer | None = None
        self.donor_weights: dict[str, torch.Tensor] = {}

    def prepare(self, config: Any, state_dir: Path) -> Any:
        return NodeBuilder().prepare(config, state_dir)

    def join(self, config: Any, state_dir: Path, initial_peers: Any, validators: Any, stopper: Any,
             wall_clock: Any, plan: Any = None) -> Any:
        assert config.swarm.client_mode and initial_peers() == [PEER]
        if self.join_error is not None:
            raise self.join_error
        self.joined = True
        return SimpleNamespace(dht=None, peer_id="QmFetcher", trusted=("QmPeerA",),
                               close=lambda: setattr(self, "left", True))

    def build_client(self, config: Any, swarm: Any, stats: Any, *, run: Any = None, defences: Any = None) -> Any:
        assert defences is not None, "a fetch always checks what it downloads"
        if self.build_error is not None:
            raise self.build_error
        self.built = True
        task = build_task(config.task, config.training, peer_seed=0)
        donor = build_task(config.task, config.training.model_copy(update={"seed": 99}), peer_seed=0)
        self.donor_weights = {k: v.detach().clone() for k, v in donor.model.state_dict().items()}
        self.optimizer = FakeOptimizer(task.model, self.donor_weights, self.adopt_on)
        return ClientParts(task, self.optimizer, model_fingerprint(task.model, task.shape_config))


#: The run's peer records as the fetcher reads them: claims of samples contributed, one of them absurd.
CLAIMS = (("QmPeerA", 1_000), ("QmPeerB", 2_000), ("QmLiar", 10**12), ("QmNewcomer", 0), ("QmHelper", 10**12))
#: What each record vouches for from its node's averaging rounds.  The fetcher joins through QmPeerA;
#: the liar and its helper vouch for each other (and, the helper, for the liar at an absurd figure).
VOUCHED = {"QmPeerA": (("QmPeerB", 1_500),), "QmPeerB": (("QmPeerA", 900), ("QmLiar", 10**6)),
           "QmLiar": (("QmHelper", 10**12),), "QmHelper": (("QmLiar", 10**12),)}


class FakeRecords:
    def __init__(self, peers: int = 2, claims: tuple[tuple[str, int], ...] = CLAIMS) -> None:
        self.count = peers
        self.claims = claims

    def view(self) -> SwarmView:
        # The liar and its helper claim an epoch far ahead: they agree, so the records' majority is theirs.
        return SwarmView(peers=tuple(PeerRecord(peer_id=peer, state="training", samples_contributed=claim,
                                                epoch=9_007 if claim == 10**12 else 7, vouched=VOUCHED.get(peer, ()))
                                     for peer, claim in self.claims), global_epoch=9_007)

    def record_validators(self, run_id: str) -> list[Any]:
        return []

    def joined(self, presence: Any) -> bool:
        presence.evidence.records_seen.set()
        return True

    def peers(self) -> int:
        return self.count

    def stopping(self) -> None:
        pass


def _fetcher(config: Any, builder: FakeBuilder, timeout: float = 30.0, records: Any = None) -> ModelFetcher:
    """A fetcher as ``p2ptrain fetch`` makes one, from the run's config."""
    client = fetch_config(config, [], config.state_dir(), timeout)
    return ModelFetcher(client, timeout=timeout, builder=builder, records=records or FakeRecords())


def test_an_adopted_state_is_written_with_its_donor_and_epoch(tmp_path, corpus, capsys) -> None:
    builder, out = FakeBuilder(adopt_on=2), tmp_path / "model"
    assert _fetcher(_config(tmp_path, corpus), builder).run(out) == 0
    loaded = from_export(out)
    for name, value in loaded.model.state_dict().items():
        assert torch.equal(value, builder.donor_weights[name]), name
    run = json.loads((out / CONFIG_FILE).read_text())["run"]
    assert (run["run_ref"], run["epoch"], run["fetched_from"]) == ("unit-fetch", 7, DONOR)
    assert run["val_loss"] is not None and run["val_loss"] > 0  # measured here, on the run's held-out split
    card = (out / CARD_FILE).read_text()
    assert f"| downloaded | from the swarm (`p2ptrain fetch`), peer {DONOR}," in card
    assert "| optimizer epochs | 7 |" in card
    assert f"fetched epoch 7 of run unit-fetch from peer {DONOR}" in capsys.readouterr().out
    # The samples and contributors are what the peer it joined through vouches for from its rounds, and
    # that peer's own figure: the liar and its helper, vouching for each other, get nothing.  The claims
    # are given apart, each clipped at what a peer can have contributed by one epoch past the optimizer's
    # epoch 7 (9 epochs of at most 2 x (256 + 4) samples), not by the liars' epoch 9,007.
    assert (run["samples"], run["contributors"], run["reported_by"], run["vouched_by"]) == (1_000 + 1_500, 2, 5, 1)
    assert run["samples_claimed"] == 1_000 + 2_000 + 2 * 9 * 520
    by = "as 1 peer this download joined through vouches for them: their own figures and the samples each peer " \
         "carried into their averaging rounds"
    assert f"| samples contributed (vouched for) | 2,500, {by} |" in card
    assert f"| contributing peers (vouched for) | 2, {by} |" in card
    assert "| samples claimed (not vouched for) | 12,360, what 5 peer records claim for their own peers, each " \
           "clipped at the run's pace |" in card
    assert "not recorded" not in card
    assert f"| validation loss | {run['val_loss']:.4f} nats/byte" in card and "at epoch 7: this model on the" in card
    assert builder.optimizer is not None and builder.optimizer.shut_down and builder.left


def test_without_peer_records_the_card_says_why_it_has_no_credit(tmp_path, corpus, capsys) -> None:
    out = tmp_path / "model"
    assert _fetcher(_config(tmp_path, corpus), FakeBuilder(), records=FakeRecords(claims=())).run(out) == 0
    card = (out / CARD_FILE).read_text()
    missing = "not recorded (no peer record of the run was read before the download)"
    assert f"| samples contributed | {missing} |" in card and f"| contributing peers | {missing} |" in card


def test_no_peer_answering_is_exit_69_and_nothing_written(tmp_path, corpus, capsys) -> None:
    builder, out = FakeBuilder(join_error=SwarmError("no initial peer answered")), tmp_path / "model"
    assert _fetcher(_config(tmp_path, corpus), builder, timeout=5).run(out) == EX_UNAVAILABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"p2ptrain fetch: no peer answered within 5s (--timeout); tried {PEER}; nothing written"]
    assert not out.exists() and not builder.built


def test_no_valid_state_within_the_timeout_is_exit_69(tmp_path, corpus, capsys) -> None:
    builder, out = FakeBuilder(adopt_on=0), tmp_path / "model"
    started = time.monotonic()
    assert _fetcher(_config(tmp_path, corpus), builder, timeout=1.0).run(out) == EX_UNAVAILABLE
    assert time.monotonic() - started < 6.0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["p2ptrain fetch: no peer served a state that passed the checks within 1s (--timeout); "
                   "2 peer(s) in the run's records, 2 reporting progress, swarm at epoch 7; nothing written"]
    assert not out.exists()
    assert builder.optimizer is not None and builder.optimizer.calls >= 1
    assert builder.optimizer.shut_down and builder.left  # it leaves cleanly all the same


def test_an_empty_run_says_a_plain_run_needs_its_config(tmp_path, corpus, capsys, monkeypatch) -> None:
    builder = FakeBuilder(adopt_on=0)
    monkeypatch.setattr(FakeOptimizer, "global_progress", lambda self: GlobalProgress(known=True))
    fetcher = _fetcher(_config(tmp_path, corpus), builder, timeout=0.5, records=FakeRecords(peers=0))
    assert fetcher.run(tmp_path / "model") == EX_UNAVAILABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(nobody reports under run 'unit-fetch': a plain run is named by its node config, " \
        "pass it with -c); nothing written" in err[0]


def test_a_model_that_is_not_the_runs_is_exit_78(tmp_path, corpus, capsys) -> None:
    builder = FakeBuilder(build_error=FingerprintMismatch("model fingerprint abc differs from run 'x''s model def"))
    assert _fetcher(_config(tmp_path, corpus), builder).run(tmp_path / "model") == 78
    assert capsys.readouterr().err.strip().splitlines() == [
        "p2ptrain fetch: model fingerprint abc differs from run 'x''s model def"]
    assert builder.left and not (tmp_path / "model").exists()


def test_a_manifest_of_another_run_is_exit_78_before_joining(tmp_path, corpus, capsys) -> None:
    key = OwnerKey.generate()
    ours, theirs = (new_manifest(key, name, TaskSection(), TrainingSection()) for name in ("ours", "theirs"))
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(theirs.to_toml())
    builder = FakeBuilder()
    config = _config(tmp_path, corpus, run=str(ours.ref), manifest=str(manifest))
    assert _fetcher(config, builder).run(tmp_path / "model") == 78
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"p2ptrain: config error: manifest {manifest}: is the")
    assert f"not {ours.ref}" in err[0]
    assert not builder.joined and not (tmp_path / "model").exists()


@pytest.mark.parametrize("task, trusted, message", [
    (TaskSection(entrypoint="builtins:print"), False,
     "the run's manifest names task code 'builtins:print' (task.entrypoint); a model file is data, so its code is "
     "not run: pass --trust-task-code if you trust it; nothing written"),
    (TaskSection(d_model=16_384, n_layers=1_024, n_heads=16), True,
     "the run's manifest asks for a model of 3,298,759,311,360 parameters (12.0 TiB of float32), over "
     "--max-params 2,000,000,000; nothing was built; nothing written"),
])
def test_a_manifests_task_code_or_size_is_refused_before_joining(tmp_path, corpus, capsys, task, trusted,
                                                                  message) -> None:
    """A run's manifest is someone else's: its task code runs only when trusted, its model is sized first."""
    key = OwnerKey.generate()
    manifest = new_manifest(key, "theirs", task, TrainingSection())
    path = tmp_path / "manifest.toml"
    path.write_text(manifest.to_toml())
    builder = FakeBuilder()
    config = parse_config({"node": {"state_dir": str(tmp_path / "state")},
                           "swarm": {"initial_peers": [PEER], "run": str(manifest.ref), "manifest": str(path)},
                           "task": {"data_path": str(corpus)}}, "node.toml")
    client = fetch_config(config, [], config.state_dir(), 30.0)
    fetcher = ModelFetcher(client, timeout=30.0, builder=builder, records=FakeRecords(), trust_task_code=trusted)
    assert fetcher.run(tmp_path / "model") == 65
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [f"p2ptrain fetch: {message}"]
    assert not builder.joined and not builder.built and not (tmp_path / "model").exists()


def test_the_fetch_config_is_a_quiet_client(tmp_path, corpus) -> None:
    loaded = _config(tmp_path, corpus, peer_checks=False, listen_addrs=["/ip4/0.0.0.0/tcp/41400"],
                     announce_addrs=["/ip4/203.0.113.7/tcp/41400"])
    other = "/ip4/127.0.0.1/tcp/41401/p2p/" + DONOR
    config = fetch_config(loaded, [other, PEER], tmp_path / "throwaway", timeout=40.0)
    swarm = config.swarm
    assert swarm.client_mode and swarm.peer_checks and not (swarm.nat_port_map or swarm.auto_nat)
    assert swarm.listen_addrs == ["/ip4/127.0.0.1/tcp/0"] and swarm.announce_addrs == []
    assert swarm.initial_peers == [PEER, other] and swarm.bootstrap_timeout == 40.0
    assert config.state_dir() == tmp_path / "throwaway" and config.training.load_state_timeout == 20.0
    assert config.task == loaded.task  # the run's model, as the config gives it


def _main(*argv: object) -> int:
    return cli.main([str(arg) for arg in argv])


def test_an_existing_out_dir_is_refused_without_force(tmp_path, capsys) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _main("fetch", "--join", PEER, out) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"p2ptrain fetch: {out} already exists (use --force to replace it)"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    # --force replaces exports only: a directory of something else stays as it is.
    assert _main("fetch", "--join", PEER, "--force", out) == 1
    assert "is not a p2ptrain export" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--join", "not-an-address"], "p2ptrain: config error: --join: not a valid multiaddr 'not-an-address'"),
    (["--join", "/ip4/127.0.0.1/tcp/41400"], "p2ptrain: config error: --join: multiaddr "),
    (["--join", PEER, "--run", "no-hash"], "p2ptrain: config error: --run: "),
    ([], "p2ptrain: config error: --join: give the address of a node in the swarm"),
], ids=["bad-address", "no-peer-id", "bad-run-ref", "no-address"])
def test_bad_input_is_one_line_and_exit_78(tmp_path, capsys, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("P2PTRAIN_")]:
        monkeypatch.delenv(name)
    assert _main("fetch", *argv, tmp_path / "model") == 78
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "model").exists()


def test_the_default_config_loads(tmp_path) -> None:
    """The throwaway config starts from the built-in defaults, as ``p2ptrain run`` without -c does."""
    config = fetch_config(load_config(None, environ={}), [PEER], tmp_path, timeout=120.0)
    assert config.swarm.initial_peers == [PEER] and config.swarm.bootstrap_timeout == 120.0


def test_only_an_invite_run_is_fetched_with_the_nodes_own_identity(tmp_path, corpus) -> None:
    throwaway, temporary = client_state_dir(_config(tmp_path, corpus))
    try:
        assert temporary and throwaway != tmp_path / "state" and not any(throwaway.iterdir())
    finally:
        throwaway.rmdir()
    invited = _config(tmp_path, corpus, run="x@" + "a" * 26, invite="p2ptrain-invite-v1.abc")
    assert client_state_dir(invited) == (tmp_path / "state", False)  # never deleted: it is the node's
