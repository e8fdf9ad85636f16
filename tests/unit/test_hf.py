"""The Hugging Face side: the ``hf_causal_lm`` task, ByteLM as GPT-2, exports ``transformers`` loads, the hub push."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from p2ptrain.cli import main as cli  # noqa: E402
from p2ptrain.config.schema import ConfigError, NodeConfig  # noqa: E402
from p2ptrain.model.export import CardInfo, write_export  # noqa: E402
from p2ptrain.model.fingerprint import model_fingerprint  # noqa: E402
from p2ptrain.model.hfexport import bytelm_to_gpt2, gpt2_to_bytelm, push_to_hub  # noqa: E402
from p2ptrain.model.limits import ModelRefused, check_model_config  # noqa: E402
from p2ptrain.model.load import from_export  # noqa: E402
from p2ptrain.tasks import build_task  # noqa: E402
from p2ptrain.tasks.bytelm import ByteLM, shape_config  # noqa: E402
from tests.support.hfmodel import corpus_text, make_model_dir  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    model_dir = make_model_dir(root / "tiny-gpt2", [corpus_text(i) for i in range(200)])
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"f{i}.py").write_text("".join(corpus_text(i * 50 + j) for j in range(50)))
    return {"root": root, "model": model_dir, "corpus": corpus}


def _config(setup: dict[str, Path], **task: object) -> NodeConfig:
    return NodeConfig.model_validate({
        "task": {"kind": "hf_causal_lm", "model_config": str(setup["model"]), "data_path": str(setup["corpus"]),
                 "seq_len": 16, "validation_batches": 2, "validation_fraction": 0.2, **task},
        "training": {"batch_size": 4, "seed": 5}})


def _tokens(vocab: int, length: int = 12) -> torch.Tensor:
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(0))


def test_bytelm_weights_map_to_gpt2_and_back_exactly() -> None:
    model = ByteLM(16, 32, 2, 4, seed=1)
    mapped = bytelm_to_gpt2(model.state_dict())
    assert mapped["transformer.h.1.attn.c_attn.weight"].shape == (32, 96)  # Conv1D: (in, out)
    assert "lm_head.weight" not in mapped  # tied to the embedding, stored once
    back = gpt2_to_bytelm(mapped)
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[name], value) for name, value in model.state_dict().items())


def test_a_bytelm_export_loads_with_transformers_and_gives_the_same_logits(tmp_path: Path) -> None:
    config = NodeConfig.model_validate({"task": {"seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 4}})
    model = ByteLM(16, 32, 2, 4, seed=3)
    with torch.no_grad():  # biases and norms off their init, so a wrong mapping of them shows
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.05)
    fingerprint = model_fingerprint(model, shape_config(16, 32, 2, 4))
    out = write_export(model, config.task, fingerprint, CardInfo("run@x", epoch=3, val_loss=2.0), tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = "héllo, wörld\n"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == list(text.encode())  # token i is byte i
    assert tokenizer.decode(ids[0]) == text
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model.eval()(ids), atol=1e-5, rtol=0)
    own = from_export(out).model  # p2ptrain reads its GPT-2 weights back into a ByteLM
    assert all(torch.equal(own.state_dict()[n], v) for n, v in model.state_dict().items())
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: transformers" in card and "| optimizer epochs | 3 |" in card


def test_the_hf_task_trains_and_its_export_loads_with_transformers(setup: dict[str, Path], tmp_path: Path) -> None:
    config = _config(setup)
    task = build_task(config.task, config.training, peer_seed=0)
    batch = task.train_batches.next()
    assert batch.input_ids.shape == (4, 16) and batch.labels.shape == (4, 16)
    assert torch.equal(batch.input_ids[:, 1:], batch.labels[:, :-1])  # labels are the next tokens
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-2)
    first = float(task.loss_fn(task.model, next(iter(task.validation_batches()))).detach())
    for _ in range(8):
        task.loss_fn(task.model, task.train_batches.next()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert float(task.loss_fn(task.model, next(iter(task.validation_batches()))).detach()) < first
    fingerprint = model_fingerprint(task.model, task.shape_config)
    out = write_export(task.model, config.task, fingerprint, CardInfo("run@y", epoch=1), tmp_path / "hf-model",
                       shape_config=task.shape_config, training={"batch_size": 4, "seed": 5})
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer("def function_3(value):", return_tensors="pt")["input_ids"]
    task.model.eval()
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, task.model(input_ids=ids).logits, atol=1e-5, rtol=0)
    again = from_export(out)  # and p2ptrain's own loader: same fingerprint, same weights
    assert again.fingerprint == fingerprint
    assert all(torch.equal(again.model.state_dict()[n], v) for n, v in task.model.state_dict().items())
    assert json.loads((out / "config.json").read_text())["task"]["model_config"] == str(setup["model"])


def test_the_task_starts_from_the_directorys_safetensors_weights(setup: dict[str, Path], tmp_path: Path) -> None:
    config = _config(setup)
    first = build_task(config.task, config.training, peer_seed=0).model
    start = tmp_path / "start"
    first.save_pretrained(str(start))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (start / name).write_bytes((setup["model"] / name).read_bytes())
    other = _config(setup, model_config=str(start))
    other = NodeConfig.model_validate({**other.model_dump(by_alias=True), "training": {"batch_size": 4, "seed": 9}})
    model = build_task(other.task, other.training, peer_seed=0).model
    assert all(torch.equal(model.state_dict()[n], v) for n, v in first.state_dict().items())


@pytest.mark.parametrize(("change", "says"), [
    ({"auto_map": {"AutoModelForCausalLM": "evil.Model"}}, "auto_map"),
    ({"model_type": "vit", "architectures": ["ViTModel"]}, "not a causal LM"),
    ({"architectures": ["GPT2Model"]}, "is not gpt2's causal LM class"),
    ({"n_embd": 4096, "n_layer": 200, "n_head": 32}, "over --max-params"),
])
def test_a_hostile_model_dir_is_refused_in_one_line_before_anything_is_built(
        setup: dict[str, Path], tmp_path: Path, change: dict[str, object], says: str) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    raw = json.loads((setup["model"] / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**raw, **change}))
    task = _config(setup, model_config=str(bad)).task
    with pytest.raises(ModelRefused, match=says) as refused:
        check_model_config(task, "export", max_params=10_000_000)
    assert "\n" not in str(refused.value)
    if says != "over --max-params":  # the node's own build says the same in one ConfigError line
        with pytest.raises(ConfigError, match=says):
            build_task(task, _config(setup).training, peer_seed=0)


def test_config_check_knows_the_new_keys(setup: dict[str, Path], tmp_path: Path, capsys) -> None:
    with pytest.raises(ValueError, match="needs task.model_config"):
        NodeConfig.model_validate({"task": {"kind": "hf_causal_lm"}})
    # A volunteer of an owned run names its copy of the model; the kind comes from the run's manifest.
    assert NodeConfig.model_validate({"task": {"model_config": "/models/m"}}).task.model_path == "/models/m"
    path = tmp_path / "node.toml"
    path.write_text(f'[task]\nkind = "hf_causal_lm"\nmodel_config = "{setup["model"]}"\n'
                    f'data_path = "{setup["corpus"]}"\nseq_len = 16\n')
    assert cli.main(["config", "check", "-c", str(path)]) == 0, capsys.readouterr()


def test_push_to_hub_uploads_the_export_folder(tmp_path: Path) -> None:
    calls: list[dict[str, object]] = []
    push_to_hub(tmp_path, "me/my-model", "hf_token", upload=lambda **kw: calls.append(kw))
    assert calls == [{"folder_path": str(tmp_path), "repo_id": "me/my-model", "repo_type": "model",
                      "commit_message": "Upload a model trained by a p2ptrain swarm"}]


def test_export_push_to_hub_says_what_happened_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from p2ptrain.cli.tryit import push_command

    lines: list[str] = []
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login either
    assert push_command(tmp_path, "me/m", lines.append, upload=lambda **kw: None) == 1
    assert "no Hugging Face token" in lines[-1]
    calls: list[dict[str, object]] = []
    assert push_command(tmp_path, "me/m", lines.append, upload=lambda **kw: calls.append(kw), token="t") == 0
    assert calls[0]["repo_id"] == "me/m" and "uploaded" in capsys.readouterr().out

    def refused(**kw: object) -> None:
        raise PermissionError("401 Unauthorized\nmore detail")

    assert push_command(tmp_path, "me/m", lines.append, upload=refused, token="t") == 1
    assert lines[-1] == ("--push-to-hub me/m: upload failed (PermissionError: 401 Unauthorized); "
                         f"the export is in {tmp_path}")


def test_eval_scores_an_hf_export_a_token_at_a_time(setup: dict[str, Path], tmp_path: Path, capsys) -> None:
    """p2ptrain eval on a Hugging Face export: the held-out split tokenised as the nodes tokenise it, or
    --data; the trained model scores better than its initialisation, and the figure is token_metrics'."""
    from p2ptrain.data.text import build_text_data
    from p2ptrain.tasks.hf import byte_config, load_tokenizer, token_metrics

    config = _config(setup)
    task = build_task(config.task, config.training, peer_seed=0)
    initial = {name: value.clone() for name, value in task.model.state_dict().items()}
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-2)
    for _ in range(8):
        task.loss_fn(task.model, task.train_batches.next()).backward()
        optimizer.step()
        optimizer.zero_grad()
    fingerprint = model_fingerprint(task.model, task.shape_config)
    out = write_export(task.model, config.task, fingerprint, CardInfo("run@z", epoch=1), tmp_path / "hf-model",
                       shape_config=task.shape_config, training={"batch_size": 4, "seed": 5})
    assert cli.main(["eval", str(out)]) == 0
    printed = capsys.readouterr().out
    loss = float(printed.split("validation loss")[1].split()[0])
    assert "tokens scored" in printed and "nats/token" in printed and "perplexity" in printed
    held_out = build_text_data(byte_config(config.task), batch_size=4, peer_seed=0, peer_id="eval",
                               live_peers=lambda: ["eval"]).validation
    tokenizer = load_tokenizer(config.task)
    assert loss == pytest.approx(token_metrics(task.model, tokenizer, 16, held_out)["loss"], abs=1e-4)
    task.model.load_state_dict(initial)
    assert token_metrics(task.model, tokenizer, 16, held_out)["loss"] > loss  # training lowered it

    text = tmp_path / "other.txt"
    text.write_text("".join(corpus_text(900 + i) for i in range(40)))
    assert cli.main(["eval", str(out), "--data", str(text)]) == 0
    assert f"on {text} (" in capsys.readouterr().out
    (tmp_path / "tiny.txt").write_text("x")
    assert cli.main(["eval", str(out), "--data", str(tmp_path / "tiny.txt")]) == 1
    assert "too little to score" in capsys.readouterr().err
