"""``p2ptrain export``, ``sample`` and ``eval`` against a real checkpoint of the bytelm task."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest
import torch

from p2ptrain.cli import main as cli
from p2ptrain.cli.tryit import measured_card
from p2ptrain.config.schema import load_config
from p2ptrain.daemon.builder import TrainingParts
from p2ptrain.daemon.checkpointer import Checkpointer
from p2ptrain.daemon.control import ControlQueue
from p2ptrain.daemon.cpushare import CpuShare
from p2ptrain.daemon.hooks import NodeHooks
from p2ptrain.daemon.loop import TrainingLoop
from p2ptrain.daemon.snapshot import NodeIdentity, RunFigures, StatusBoard
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.model.export import CardInfo, ExportError, write_export
from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.model.load import ModelError, from_export, resolve
from p2ptrain.optim.protocol import GlobalProgress, GuardTargets
from p2ptrain.optim.rollback import NonFiniteRollback
from p2ptrain.optim.round_stats import RoundSummary
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.optim.trainer import Trainer
from p2ptrain.status import LatestSnapshot, PeerRecord, SwarmView
from p2ptrain.tasks import SampleRequest, build_task
from p2ptrain.tasks.generate import prompt_bytes, sample_bytes

torch.set_num_threads(1)


def _write_config(root: Path, corpus: Path) -> Path:
    path = root / "node.toml"
    path.write_text(
        f'[node]\nstate_dir = "{root / "state"}"\n[swarm]\nrun_id = "unit-run"\n'
        f'[task]\ndata_path = "{corpus}"\nseq_len = 24\nd_model = 32\nn_layers = 1\nn_heads = 2\n'
        "validation_batches = 3\nvalidation_fraction = 0.2\n[training]\nbatch_size = 4\nseed = 3\n"
        "target_batch_size = 12\nmax_epochs = 4\n"
    )
    return path


class _OneRoundPerEpoch:
    """The swarm optimizer's part, without a swarm: AdamW, an epoch per ``target_batch_size`` samples,
    and each epoch's round reported as averaged with two peers (what GradientOptimizer reports)."""

    def __init__(self, model: torch.nn.Module, target: int, stats: SwarmStats) -> None:
        self.stats, self._target = stats, target
        self._adam = torch.optim.AdamW(model.parameters(), lr=3e-3)
        self._params = list(model.parameters())
        self.local_epoch = self._samples = 0

    def step(self, batch_size: int) -> None:
        self._adam.step()
        self._samples += batch_size
        if self._samples >= self._target:
            self.stats.epoch_closed(self._samples, round_started=True, alone=False)
            self.stats.record_round(RoundSummary(ok=True, duration=0.1, group_size=3, peers_online=3,
                                                received_fraction=1.0), 0)
            self.local_epoch, self._samples = self.local_epoch + 1, 0

    def zero_grad(self) -> None:
        self._adam.zero_grad()

    def global_progress(self) -> GlobalProgress:
        return GlobalProgress(self.local_epoch, self._samples, 3, True)

    def checkpoint_state(self) -> dict[str, object]:
        return {"optimizer": self._adam.state_dict(), "epoch": self.local_epoch}

    def guard_targets(self) -> GuardTargets:
        return GuardTargets(tensors=self._params, optimizers=[self._adam])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A node config and two checkpoints (epochs 4 and 5) written by the node's own loop and checkpointer:
    model, data position, credit and the run facts of the model card come from the code a node runs."""
    root = tmp_path_factory.mktemp("run")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"f{i:02d}.py").write_text("".join(f"def function_{i}_{j}(x):\n    return x + {j}\n"
                                                     for j in range(40)))
    config_path = _write_config(root, corpus)
    config = load_config(config_path, environ={})
    task = build_task(config.task, config.training, peer_seed=1)
    fingerprint = model_fingerprint(task.model, task.shape_config)
    stats = SwarmStats()
    optimizer = _OneRoundPerEpoch(task.model, config.training.target_batch_size, stats)
    trainer = Trainer(task, optimizer, config.training.batch_size)  # type: ignore[arg-type]
    checkpointer = Checkpointer(CheckpointStore(config.checkpoint_dir(), keep=3), fingerprint,
                                wall_clock=lambda: 1_700_000_000.0, long_operation=lambda seconds: None)
    parts = TrainingParts(task, optimizer, trainer, NonFiniteRollback(optimizer.guard_targets()),  # type: ignore[arg-type]
                          checkpointer, fingerprint)
    board = StatusBoard(LatestSnapshot(), config.training.target_batch_size, clock=time.monotonic,
                        wall_clock=time.time)
    board.identity = NodeIdentity("unit-run", "peer-self", fingerprint=fingerprint)
    board.run = lambda: RunFigures(run_ref="unit-run@abc")  # an owned run: the card names its reference
    board.credit, board.note_contributors = stats.credit.figures, stats.credit.note_contributors
    # The peers' records, as the DHT would hand them: two others with credit, one with none yet.
    peers = tuple(PeerRecord(peer_id=name, state="training", epoch=4, samples_contributed=credit)
                  for name, credit in (("peer-self", 48), ("peer-a", 40), ("peer-b", 52), ("peer-new", 0)))
    board.view = lambda: SwarmView(peers=peers, global_epoch=4)
    loop = TrainingLoop(config, parts, board, NodeHooks(), Stopper(), ControlQueue(), clock=time.monotonic,
                        cpu_share=CpuShare(0.0, cpu_seconds=lambda: 0.0, wait=lambda seconds: False),
                        rounds=stats.rounds, refresh_fingerprint=lambda: None, set_threads=lambda threads: None)
    loop.run()  # to training.max_epochs = 4, then as a node does when it stops
    loop.validate()
    assert loop.checkpoint()
    loop.config = config.model_copy(update={"training": config.training.model_copy(update={"max_epochs": 5})})
    loop.stopper = Stopper()
    loop.run()
    assert loop.checkpoint()
    store = checkpointer.store
    return {"root": root, "config": config_path, "task": task, "newest": store.paths()[0], "store": store,
            "val_loss": board.val_loss}


def test_a_checkpoint_says_which_epoch_its_validation_loss_is_of(run) -> None:
    """The loop validated at epoch 4 only: both checkpoints carry that figure, and say it is epoch 4's."""
    newest, older = (torch.load(path, weights_only=True) for path in run["store"].paths()[:2])  # type: ignore[attr-defined]
    assert (older["epoch"], older["val_epoch"], older["val_params"]) == (4, 4, "model")
    assert (newest["epoch"], newest["val_epoch"], newest["val_loss"]) == (5, 4, run["val_loss"])


@pytest.mark.parametrize(("mode", "params"), [("gradient", "model"), ("diloco", "local")])
def test_the_loop_records_what_each_validation_was_measured_on(run, mode: str, params: str) -> None:
    config = load_config(run["config"], environ={})
    config = config.model_copy(update={"training": config.training.model_copy(update={"mode": mode})})
    saved: list[dict[str, object]] = []
    trainer = type("T", (), {"epoch": 7, "validation_loss": lambda self: 2.5})()
    parts = type("P", (), {"trainer": trainer, "save_checkpoint": lambda self, **extra: saved.append(extra) or True})()
    board = StatusBoard(LatestSnapshot(), 12, clock=time.monotonic, wall_clock=time.time)
    board.identity = NodeIdentity("unit-run", "peer-self")
    loop = TrainingLoop(config, parts, board, NodeHooks(), Stopper(), ControlQueue(), clock=time.monotonic,  # type: ignore[arg-type]
                        cpu_share=CpuShare(0.0, cpu_seconds=lambda: 0.0, wait=lambda seconds: False),
                        rounds=SwarmStats().rounds, refresh_fingerprint=lambda: None, set_threads=lambda threads: None)
    loop.checkpoint()
    loop.validate()
    trainer.epoch = 9  # type: ignore[attr-defined]
    loop.checkpoint()
    assert saved == [{"run_ref": "unit-run"},
                     {"run_ref": "unit-run", "val_loss": 2.5, "val_epoch": 7, "val_params": params}]


def _glob_config(run, tmp_path: Path) -> Path:
    """The run's config with a data_path whose held-out split is not here (a glob that matches nothing)."""
    config = tmp_path / "node.toml"
    text = Path(run["config"]).read_text()
    corpus = text.split('data_path = "')[1].split('"')[0]
    config.write_text(text.replace(corpus, str(tmp_path / "nothing" / "*.txt")))
    return config


def test_without_the_held_out_split_the_card_labels_the_nodes_figure(run, tmp_path: Path, capsys) -> None:
    out = tmp_path / "m"
    assert _main("export", "-c", _glob_config(run, tmp_path), out) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "validation loss not measured on this model: the held-out split is not readable" in err[0]
    assert f"the model card gives the node's last validation loss ({run['val_loss']:.4f}, epoch 4)" in err[0]
    card = (out / "README.md").read_text()
    assert (f"| validation loss | {run['val_loss']:.4f} nats/byte ({run['val_loss'] / math.log(2):.3f} bits per "
            "byte) at epoch 4, the node's last measurement, on its training parameters then; not this export's own "
            "figure (`p2ptrain eval m` measures that) |") in card
    assert from_export(out).card.val_epoch == 4


def test_a_diloco_checkpoint_says_its_loss_is_of_the_local_model(run, tmp_path: Path, capsys) -> None:
    """DiLoCo: the export holds the outer parameters, the node validated its local model."""
    state = torch.load(run["newest"], weights_only=True)
    names = [name for name, p in run["task"].model.named_parameters() if p.requires_grad]  # type: ignore[attr-defined]
    outer = [state["model"][name] + 0.01 for name in names]
    state.update(optimizer={"outer_params": outer}, val_params="local", val_epoch=5)
    checkpoint = tmp_path / "ckpt-diloco.pt"
    torch.save(state, checkpoint)
    config = _glob_config(run, tmp_path)
    assert _main("export", "-c", config, "--checkpoint", checkpoint, tmp_path / "m") == 0
    card = (tmp_path / "m" / "README.md").read_text()
    assert ("at epoch 5, the node's last measurement, on its local DiLoCo model, not the swarm's outer parameters "
            "exported here; not this export's own figure") in card
    # With the held-out split here, export scores the outer parameters it writes.
    assert _main("export", "-c", run["config"], "--checkpoint", checkpoint, tmp_path / "m2") == 0
    loaded = from_export(tmp_path / "m2")
    assert torch.equal(dict(loaded.model.named_parameters())[names[0]], outer[0])
    own = Trainer(dataclasses.replace(run["task"], model=loaded.model), optimizer=None,  # type: ignore[arg-type]
                  batch_size=4).validation_loss()
    assert loaded.card.val_of == "export" and loaded.card.val_epoch == 5
    assert abs(loaded.card.val_loss - own) < 1e-6  # type: ignore[operator]


def test_export_downloads_nothing_to_score_the_model(run, tmp_path: Path, capsys) -> None:
    """Shards at URLs not in the cache: the card keeps the node's figure; no download is tried."""
    loaded = resolve(run["config"], None, print)  # type: ignore[arg-type]
    remote = loaded.task.model_copy(update={"data_path": "http://127.0.0.1:9/SHA256SUMS"})
    lines: list[str] = []
    card = measured_card(dataclasses.replace(loaded, task=remote, cache_dir=tmp_path / "cache"), lines.append)
    assert card == loaded.card
    assert len(lines) == 1 and "SHA256SUMS is not downloaded in" in lines[0]
    assert not (tmp_path / "cache").exists()


def _main(*argv: object) -> int:
    return cli.main([str(arg) for arg in argv])


def test_export_reloads_bit_for_bit_with_the_documented_three_lines(run, tmp_path: Path, capsys,
                                                                   monkeypatch) -> None:
    out = tmp_path / "my-model"
    assert _main("export", "-c", run["config"], "--torch", out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.pt", "model.safetensors",
                                                     "tokenizer.json", "tokenizer_config.json"]
    assert f"to {out}" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # the card's lines use the directory's name, as a user would after exporting here
    card = (out / "README.md").read_text()
    lines = card.split("```python\n")[1].split("```")[0]
    assert len(lines.strip().splitlines()) == 3
    scope: dict[str, object] = {}
    exec(lines, scope)  # noqa: S102 - the card's own snippet, exactly as a user would paste it
    model, tokenizer = scope["model"], scope["tokenizer"]  # transformers' GPT-2, a byte tokenizer
    ids = tokenizer("def f(x):\n", return_tensors="pt")["input_ids"]  # type: ignore[operator]
    ours = run["task"].model.eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, ours(ids), atol=1e-5, rtol=0)  # type: ignore[operator]
    original = ours.state_dict()
    plain = torch.load(out / "model.pt", weights_only=True)
    assert all(torch.equal(original[name], value) for name, value in plain.items())
    # The validation loss is the exported model's own (what `p2ptrain eval` of it reports), at the export's
    # epoch; not the node's last validation, which was of epoch 4's parameters.
    own = Trainer(run["task"], optimizer=None, batch_size=4).validation_loss()  # type: ignore[arg-type]
    assert f"{run['val_loss']:.4f}" != f"{own:.4f}"
    for expected in ("| run | unit-run@abc |", "| optimizer epochs | 5 |", "| samples (this node's count) | 60 |",
                     "| samples this node contributed (its own count) | 60 |",
                     f"| validation loss | {own:.4f} nats/byte ({own / math.log(2):.3f} bits per byte) at epoch 5: "
                     "this model on the run's held-out split |",
                     "| contributing peers (seen by this node, vouched for) | 3 |", "2023-11-14"):
        assert expected in card
    assert f"{run['val_loss']:.4f}" not in card
    config = json.loads((out / "config.json").read_text())
    assert config["task"]["seq_len"] == 24 and config["model_args"]["d_model"] == 32
    assert config["training"] == {"batch_size": 4, "seed": 3}


def test_export_then_eval_gives_the_nodes_validation_loss(run, tmp_path: Path, capsys) -> None:
    out = tmp_path / "model"
    assert _main("export", "-c", run["config"], out) == 0
    node_loss = Trainer(run["task"], optimizer=None, batch_size=4).validation_loss()  # type: ignore[arg-type]
    loaded = from_export(out)
    capsys.readouterr()
    assert _main("eval", out) == 0
    report = capsys.readouterr().out
    shown = float(report.split("validation loss")[1].split()[0])
    assert abs(shown - node_loss) < 5e-5
    bits = float(report.split("bits per byte")[1].split()[0])
    assert abs(bits - node_loss / math.log(2)) < 1e-3
    assert loaded.fingerprint == model_fingerprint(run["task"].model, run["task"].shape_config)  # type: ignore[attr-defined]
    # --data scores a given file instead; the node config and a checkpoint file work as MODEL too.
    text = tmp_path / "other.txt"
    text.write_text("def other(y):\n    return y * 2\n" * 50)
    assert _main("eval", out, "--data", text) == 0
    assert f"on {text}" in capsys.readouterr().out
    assert _main("eval", run["config"]) == 0
    assert _main("eval", run["newest"], "-c", run["config"]) == 0
    outputs = capsys.readouterr().out
    assert outputs.count(f"validation loss  {shown:.4f}") == 2


def test_sample_is_deterministic_for_a_seed_and_makes_text(run, tmp_path: Path, capsys) -> None:
    out = tmp_path / "model"
    _main("export", "-c", run["config"], out)
    capsys.readouterr()
    texts = []
    for seed in (1, 1, 2):
        assert _main("sample", out, "--prompt", "def ", "--tokens", 60, "--seed", seed) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] != texts[2]
    assert texts[0].startswith("def ") and len(texts[0]) > 20
    model = from_export(out).model
    greedy = [sample_bytes(model, SampleRequest("def ", 30, temperature=0.0, seed=s)) for s in (1, 2)]
    assert greedy[0] == greedy[1]
    rng_before = torch.get_rng_state()
    sample_bytes(model, SampleRequest("x", 5, top_k=3, seed=4))
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_corrupt_newest_checkpoint_falls_back_and_says_which(run, tmp_path: Path, capsys) -> None:
    store: CheckpointStore = run["store"]  # type: ignore[assignment]
    good = store.paths()[0]
    broken = store.save(torch.load(good, weights_only=True))
    broken.write_bytes(b"not a checkpoint")
    try:
        assert _main("export", "-c", run["config"], tmp_path / "m") == 0
        err = capsys.readouterr().err.strip()
        assert err == (f"p2ptrain export: checkpoint {broken.name} does not load ("
                       + err.split(" does not load (")[1].split(");")[0]
                       + f"); using the previous one, {good.name}")
        assert broken.exists()  # read-only: nothing renamed next to a running node
    finally:
        broken.unlink()


@pytest.mark.parametrize("cut", [1, 30, None], ids=["last-byte", "tail", "garbage"])
def test_a_truncated_checkpoint_is_named_as_such(run, tmp_path: Path, capsys, cut: int | None) -> None:
    data = Path(run["newest"]).read_bytes()
    broken = tmp_path / "ckpt-broken.pt"
    broken.write_bytes(data[:-cut] if cut else b"not a checkpoint")
    assert _main("export", "-c", run["config"], "--checkpoint", broken, tmp_path / "m") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"p2ptrain export: checkpoint {broken} does not load (truncated or corrupt: "), err
    assert len(err.splitlines()) == 1


def test_an_export_under_a_file_says_which_path_is_not_a_directory(run, tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("notes")
    assert _main("export", "-c", run["config"], afile / "sub") == 1
    assert capsys.readouterr().err == f"p2ptrain export: cannot write {afile / 'sub'}: {afile} is not a directory\n"
    assert afile.read_text() == "notes"


def test_an_existing_export_dir_is_refused_unless_forced(run, tmp_path: Path, capsys) -> None:
    out = tmp_path / "m"
    assert _main("export", "-c", run["config"], out) == 0
    # Marked, so that a replacement shows (the same model exported twice in a second is the same bytes).
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "marked": True}))
    (out / "left-behind.txt").write_text("an older export's file")
    assert _main("export", "-c", run["config"], out) == 1
    assert capsys.readouterr().err.strip().endswith(f"{out} already exists (use --force to replace it)")
    assert "marked" in json.loads((out / "config.json").read_text())
    assert _main("export", "-c", run["config"], out, "--force") == 0
    assert "marked" not in json.loads((out / "config.json").read_text())
    assert not (out / "left-behind.txt").exists()  # the whole directory was replaced, not written over
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    assert _main("export", "-c", run["config"], precious, "--force") == 1
    assert "is not a p2ptrain export; not replacing it, even with --force" in capsys.readouterr().err
    assert (precious / "thesis.tex").exists()


def test_a_failed_export_leaves_nothing_half_written(run, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "m"
    loaded = resolve(run["config"], None, print)  # type: ignore[arg-type]
    write_export(loaded.model, loaded.task, loaded.fingerprint, loaded.card, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("p2ptrain.model.export.save_model", full_disk)
    monkeypatch.setattr("p2ptrain.model.export.save_file", full_disk)  # bytelm: GPT-2's names
    with pytest.raises(ExportError, match="No space left on device"):
        write_export(loaded.model, loaded.task, loaded.fingerprint, loaded.card, out, force=True)
    with pytest.raises(ExportError):
        write_export(loaded.model, loaded.task, loaded.fingerprint, loaded.card, tmp_path / "new")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp or half directories


def test_card_info_tolerates_missing_and_odd_keys() -> None:
    card = CardInfo.from_state({"epoch": 3, "val_loss": float("nan"), "contributors": 4, "samples_processed": True},
                               "run-x")
    assert card == CardInfo("run-x", epoch=3, contributors=4)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["sample", "{out}", "--tokens", "abc"], 2, "--tokens must be a whole number, got 'abc'"),
        (["sample", "{out}", "--tokens", "0"], 2, "--tokens must be between 1 and 100000, got 0"),
        (["sample", "{out}", "--temperature", "-1"], 2, "--temperature must be between 0 and 100, got -1"),
        (["sample", "{out}", "--temperature", "nan"], 2, "--temperature must be between 0 and 100, got nan"),
        (["sample", "{out}", "--top-k", "-3"], 2, "--top-k must be between 0 and 1000000, got -3"),
        (["sample", "{out}", "--seed", "x"], 2, "--seed must be a whole number, got 'x'"),
        (["sample", "{tmp}/missing"], 1, "{tmp}/missing does not exist"),
        (["sample", "{tmp}"], 1, "{tmp} is not a p2ptrain export (no config.json)"),
        (["eval", "{out}", "--data", "{tmp}/none.txt"], 1, "--data: {tmp}/none.txt does not exist"),
        (["eval", "{tmp}/garbage.pt"], 1, "checkpoint {tmp}/garbage.pt does not load ("),
        (["export", "--checkpoint", "{tmp}/none.pt", "{tmp}/x"], 1, "checkpoint {tmp}/none.pt does not exist"),
        (["export", "-c", "{tmp}/empty.toml", "{tmp}/x"], 1, "no checkpoint that loads in"),
    ],
    ids=["tokens-text", "tokens-zero", "temperature-negative", "temperature-nan", "top-k", "seed",
         "missing", "not-an-export", "data-missing", "garbage-checkpoint", "checkpoint-missing", "no-checkpoints"],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(run, tmp_path: Path, capsys, argv, code, message) -> None:
    out = tmp_path / "model"
    _main("export", "-c", run["config"], out)
    (tmp_path / "garbage.pt").write_bytes(b"junk")
    (tmp_path / "empty.toml").write_text(f'[node]\nstate_dir = "{tmp_path / "nostate"}"\n')
    capsys.readouterr()
    fill = {"out": out, "tmp": tmp_path}
    assert _main(*[arg.format(**fill) for arg in argv]) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message.format(**fill) in err, err


def test_a_checkpoint_of_another_model_is_refused(run, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other.toml"
    other.write_text(Path(run["config"]).read_text().replace("d_model = 32", "d_model = 16"))
    assert _main("sample", run["newest"], "-c", other) == 1
    assert "but this config builds" in capsys.readouterr().err


EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
#: A variant of the example task for the failure cases: no hooks, or hooks that fail in given ways.
VARIANT = """
import dataclasses
import user_task

def build(context):
    task = user_task.build(context)
    how = context.options.get("variant")
    if how == "no-hooks":
        return dataclasses.replace(task, sample=None, evaluate=None)
    if how == "raising":
        def broken(model, arg):
            raise RuntimeError("the hook's own bug\\nsecond line")
        return dataclasses.replace(task, sample=broken, evaluate=broken)
    return dataclasses.replace(task, sample=lambda model, request: 42,
                               evaluate=lambda model, data: {"loss": "low", "rmse": float("nan")})
"""


def _user_model(tmp_path: Path, monkeypatch, entrypoint: str, variant: str = "") -> Path:
    """A node config of a user task and a checkpoint of its (untrained) model; returns the config."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "variant_task.py").write_text(VARIANT)
    config_path = tmp_path / "user.toml"
    options = f'\n[task.options]\nvariant = "{variant}"\n' if variant else "\n"
    config_path.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[task]\nentrypoint = "{entrypoint}"{options}')
    config = load_config(config_path, environ={})
    task = build_task(config.task, config.training, peer_seed=0)
    CheckpointStore(config.checkpoint_dir(), keep=1).save(
        {"model": task.model.state_dict(), "epoch": 1, "fingerprint": model_fingerprint(task.model, task.shape_config)})
    return config_path


def test_a_user_tasks_hooks_sample_and_evaluate_its_model(tmp_path: Path, capsys, monkeypatch) -> None:
    config_path = _user_model(tmp_path, monkeypatch, "user_task:build")
    assert _main("export", "-c", config_path, tmp_path / "m") == 0
    assert from_export(tmp_path / "m", trust_task_code=True).task.entrypoint == "user_task:build"
    capsys.readouterr()
    # An export's task code is someone else's until the user says otherwise (or it is the -c config's own).
    assert _main("sample", tmp_path / "m", "--prompt", "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8") == 65
    assert "pass --trust-task-code if you trust it" in capsys.readouterr().err
    assert _main("sample", tmp_path / "m", "-c", config_path, "--prompt", "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8") == 0
    assert capsys.readouterr().out.startswith("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8 -> ")
    assert _main("sample", tmp_path / "m", "--trust-task-code", "--prompt", "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8") == 0
    out = capsys.readouterr().out
    assert out.startswith("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8 -> ") and "(target " in out
    assert _main("eval", config_path) == 0
    report = capsys.readouterr().out
    loss = float(report.split("loss")[1].split()[0])
    rmse = float(report.split("rmse")[1].split()[0])
    assert loss > 0 and abs(rmse - math.sqrt(loss)) < 1e-4
    # The hook's own refusal of bad input is one line, exit 1.
    assert _main("sample", tmp_path / "m", "--trust-task-code", "--prompt", "def ") == 1
    err = capsys.readouterr().err
    assert err == "p2ptrain sample: the task's sample hook failed: ValueError: --prompt must be 8 comma-separated " \
                  "numbers, got 'def '\n"


def test_a_user_task_without_hooks_says_so(tmp_path: Path, capsys, monkeypatch) -> None:
    config_path = _user_model(tmp_path, monkeypatch, "variant_task:build", "no-hooks")
    assert _main("export", "-c", config_path, tmp_path / "m") == 0
    assert _main("sample", tmp_path / "m", "--trust-task-code") == 1
    assert "has no sample hook (Task.sample)" in capsys.readouterr().err
    assert _main("eval", config_path) == 1
    assert "has no evaluate hook (Task.evaluate)" in capsys.readouterr().err


@pytest.mark.parametrize("variant, sample_error, eval_error", [
    ("raising", "the task's sample hook failed: RuntimeError: the hook's own bug",
     "the task's evaluate hook failed: RuntimeError: the hook's own bug"),
    ("wrong-types", "the task's sample hook returned a int, not text",
     "the task's evaluate hook returned 'loss': 'low', not a number"),
])
def test_a_failing_user_hook_is_one_line(tmp_path: Path, capsys, monkeypatch, variant: str, sample_error: str,
                                         eval_error: str) -> None:
    config_path = _user_model(tmp_path, monkeypatch, "variant_task:build", variant)
    capsys.readouterr()
    assert _main("sample", config_path) == 1
    assert _main("eval", config_path) == 1
    captured = capsys.readouterr()
    assert captured.err == f"p2ptrain sample: {sample_error}\np2ptrain eval: {eval_error}\n"
    assert captured.out == ""


@pytest.mark.parametrize("content", [b"abc", b"x" * 24])
def test_eval_on_too_little_text_is_one_line(run, tmp_path: Path, capsys, content: bytes) -> None:
    data = tmp_path / "short.txt"
    data.write_bytes(content)
    assert _main("eval", run["config"], "--data", data) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"p2ptrain eval: --data {data} holds {len(content):,} bytes of text: too little to score "
                            "(the model needs more than task.seq_len = 24 bytes)\n")


LINES = [f"def line_{i}(x):  # a record of its own" for i in range(120)]


def _scored(report: str) -> tuple[float, int]:
    """(validation loss, bytes scored) of an eval report."""
    return float(report.split("validation loss")[1].split()[0]), int(report.split("(")[1].split()[0].replace(",", ""))


@pytest.mark.parametrize("layout", ["jsonl", "parquet", "directory", "glob"])
def test_eval_data_is_read_as_task_data_path_is(run, tmp_path: Path, capsys, layout: str) -> None:
    """--data goes through the task's readers: JSONL's text field and Parquet's text column are scored,
    not the file's bytes, and directories and globs work; each gives what the same plain text gives."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = tmp_path / "plain.txt"
    plain.write_text("".join(line + "\n" for line in LINES))
    assert _main("eval", run["config"], "--data", plain) == 0
    expected = _scored(capsys.readouterr().out)
    if layout == "jsonl":
        data = tmp_path / "records.jsonl"
        data.write_text("".join(json.dumps({"id": i, "text": line}) + "\n" for i, line in enumerate(LINES)))
    elif layout == "parquet":
        data = tmp_path / "records.parquet"
        pq.write_table(pa.table({"id": list(range(len(LINES))), "text": LINES}), data, row_group_size=40)
    else:
        folder = tmp_path / "parts"
        folder.mkdir()
        for i in range(3):  # whole lines per file, so the concatenation is the plain text
            (folder / f"part-{i}.txt").write_text("".join(line + "\n" for line in LINES[40 * i : 40 * i + 40]))
        data = folder if layout == "directory" else folder / "part-*.txt"
    assert _main("eval", run["config"], "--data", data) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    loss, scored = _scored(captured.out)
    assert scored == expected[1] and abs(loss - expected[0]) < 1e-4


def test_eval_data_problems_are_one_line_each(run, tmp_path: Path, capsys) -> None:
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"body": line}) + "\n" for line in LINES))
    assert _main("eval", run["config"], "--data", records) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["p2ptrain eval: --data: records.jsonl#00000000: no 'text' field in the record at byte 0 "
                   "(its fields: body) (the model's task.text_field)"]
    # A record that does not decode is skipped with one line; the rest is scored.
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in LINES))
    (folder / "b.jsonl").write_text("{not json\n")
    assert _main("eval", run["config"], "--data", folder) == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "p2ptrain eval: --data: 1 record(s) skipped, they do not decode: b.jsonl: the line at byte 0 is not "
        "valid JSON (Expecting property name enclosed in double quotes)"]
    assert f"on {folder}" in captured.out
    assert _main("eval", run["config"], "--data", tmp_path / "none" / "*.txt") == 1
    assert capsys.readouterr().err.strip() == (
        f"p2ptrain eval: --data: no files match the glob '{tmp_path / 'none' / '*.txt'}'")


def test_eval_data_reads_a_bounded_prefix(run, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("p2ptrain.data.text.SCORE_MAX_BYTES", 2_000)
    big = tmp_path / "big.txt"
    big.write_text("".join(line + "\n" for line in LINES * 20))
    assert _main("eval", run["config"], "--data", big) == 0
    captured = capsys.readouterr()
    assert _scored(captured.out)[1] <= 2_000
    assert captured.err == "p2ptrain eval: --data: scoring the first 2,000 bytes of its text\n"


def test_export_of_a_checkpoint_directory_says_what_to_pass(run, tmp_path: Path, capsys) -> None:
    directory = Path(run["newest"]).parent
    assert _main("export", "-c", run["config"], "--checkpoint", directory, tmp_path / "m") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--checkpoint {directory} is a directory: name a checkpoint file" in err
    assert not (tmp_path / "m").exists()


def test_a_damaged_export_is_one_model_error(run, tmp_path: Path) -> None:
    out = tmp_path / "m"
    _main("export", "-c", run["config"], out)
    (out / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ModelError, match="model.safetensors does not load"):
        from_export(out)
    (out / "config.json").write_text("{broken")
    with pytest.raises(ModelError, match="config.json is not readable JSON"):
        from_export(out)


def test_the_demo_ends_by_exporting_and_sampling(run, tmp_path: Path) -> None:
    import io

    from p2ptrain.cli.demo import DemoRun, export_and_sample
    from p2ptrain.local.swarm import LocalNode

    empty = LocalNode("node2", tmp_path / "node2", "unit-run")
    empty.workdir.mkdir()
    empty.config_path.write_text(f'[node]\nstate_dir = "{tmp_path / "node2" / "state"}"\n')
    trained = LocalNode("node1", tmp_path / "node1", "unit-run")
    trained.workdir.mkdir()
    trained.config_path.write_text(Path(run["config"]).read_text())
    out = io.StringIO()
    assert export_and_sample(DemoRun(tmp_path, nodes=[empty]), out) is None
    assert "nothing to export" in out.getvalue()
    out = io.StringIO()
    target = export_and_sample(DemoRun(tmp_path, nodes=[empty, trained]), out)
    assert target == tmp_path / "model" and from_export(target).card.epoch == 5
    assert from_export(target).card.val_of == "export"  # the card gives the exported model's own loss
    text = out.getvalue()
    assert "=== the demo's model ===" in text and "    | def " in text and f"p2ptrain sample {target}" in text


def test_eval_with_a_glob_that_matches_nothing_exits_78_naming_the_field(run, tmp_path: Path, capsys) -> None:
    config = tmp_path / "node.toml"
    text = Path(run["config"]).read_text()
    corpus = text.split('data_path = "')[1].split('"')[0]
    config.write_text(text.replace(corpus, str(tmp_path / "nothing" / "*.jsonl")))
    assert _main("eval", config) == 78
    err = capsys.readouterr().err.strip()
    assert err.startswith("p2ptrain: config error: task.data_path: no files match the glob")
    assert err.endswith("(the held-out split needs the run's data here; or pass --data PATH)")
    assert len(err.splitlines()) == 1


def _damage(out: Path, change) -> None:
    path = out / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(("change", "field"), [
    (lambda c: c.update(training=5), "training: Input should be a valid dictionary"),
    (lambda c: c.update(task=5), "task: Input should be a valid dictionary"),
    (lambda c: c.update(task=[1, 2]), "task: Input should be a valid dictionary"),
    (lambda c: c.pop("task"), "task: required"),
    (lambda c: c.pop("training"), "training: required"),
    (lambda c: c["training"].update(batch_size=0), "training.batch_size: Input should be greater than 0 (got 0)"),
    (lambda c: c["training"].update(batch_size="8"), "training.batch_size: Input should be a valid integer"),
    (lambda c: c["training"].update(seed=None), "training.seed: Input should be a valid integer"),
    (lambda c: c["task"].update(seq_len="x"), "task.seq_len: Input should be a valid integer"),
    (lambda c: c["task"].update(n_heads=5), "task: n_heads (5) must divide d_model (32)"),
    (lambda c: c["task"].update(surprise=1), "task.surprise: unknown key"),
    (lambda c: c.pop("fingerprint"), "fingerprint: required"),
    (lambda c: c.update(fingerprint=7), "fingerprint: must be text"),
    (lambda c: c.update(run=5), "run: must be an object, got int"),
    (lambda c: c["run"].update(epoch="five"), "run.epoch: expected int, got 'five'"),
    (lambda c: c["run"].update(val_loss=[1]), "run.val_loss: expected float, got [1]"),
], ids=["training-int", "task-int", "task-list", "task-missing", "training-missing", "batch-size-zero",
        "batch-size-text", "seed-null", "seq-len-text", "heads", "extra-key", "fingerprint-missing",
        "fingerprint-int", "run-int", "run-epoch", "run-val-loss"])
def test_a_malformed_export_config_is_one_line_naming_the_field(run, tmp_path: Path, capsys, change,
                                                                 field: str) -> None:
    out = tmp_path / "m"
    assert _main("export", "-c", run["config"], out) == 0
    _damage(out, change)
    capsys.readouterr()
    assert _main("sample", out, "--tokens", 5) == 1
    assert _main("eval", out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    for command, line in zip(("sample", "eval"), err, strict=True):
        assert line.startswith(f"p2ptrain {command}: {out / 'config.json'}: {field}"), line


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "{broken", "\ufffe\x00", "[" * 100_000, " " * 2_000_000],
                         ids=["list", "string", "not-json", "binary", "deep", "huge"])
def test_an_export_config_that_is_not_an_object_is_one_line(run, tmp_path: Path, capsys, content: str) -> None:
    out = tmp_path / "m"
    assert _main("export", "-c", run["config"], out) == 0
    (out / "config.json").write_text(content)
    capsys.readouterr()
    assert _main("sample", out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (f"{out / 'config.json'}" in err[0] or f"{out} is not a p2ptrain export" in err[0]), err


def test_sampling_at_any_accepted_temperature_is_safe(run, tmp_path: Path, capsys) -> None:
    """A temperature so small that logits / T overflows still samples: the likeliest byte, as greedy does."""
    out = tmp_path / "m"
    _main("export", "-c", run["config"], out)
    capsys.readouterr()
    texts = []
    for temperature in ("0", "1e-40", "5e-324", "100"):
        assert _main("sample", out, "--tokens", 40, "--temperature", temperature, "--top-k", 0) == 0, temperature
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] == texts[2] != texts[3]


def test_a_prompt_of_any_bytes_is_the_models_context(run, tmp_path: Path, capsys) -> None:
    """A shell can pass bytes that are not UTF-8 (--prompt $'\\xff'); Python holds them as lone surrogates."""
    out = tmp_path / "m"
    _main("export", "-c", run["config"], out)
    capsys.readouterr()
    assert _main("sample", out, "--prompt", "def \udcff", "--tokens", 20, "--seed", 3) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("def \ufffd")
    model = from_export(out).model
    request = SampleRequest("def \udcff", 20, temperature=0.8, top_k=40, seed=3)  # the command's defaults
    assert prompt_bytes(request.prompt) == b"def \xff"
    assert captured.out == "def \ufffd" + sample_bytes(model, request) + "\n"
    # A lone surrogate that no command line could have made is still a prompt, not a crash.
    assert prompt_bytes("\ud800x") == b"?x"


def test_eval_adds_the_data_hint_only_to_errors_about_the_data(run, tmp_path: Path, capsys) -> None:
    config = tmp_path / "node.toml"
    text = Path(run["config"]).read_text()
    config.write_text(text.replace("validation_batches = 3", "buffer_mb = 0\nvalidation_batches = 3"))
    assert _main("eval", config) == 78
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"p2ptrain: config error: {config}: task.buffer_mb: ") and len(err.splitlines()) == 1
    assert "held-out split" not in err and "--data" not in err
