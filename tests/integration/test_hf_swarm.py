"""A Hugging Face causal LM trained by a real two-node swarm on a gzip and zstd corpus, exported, and loaded
back with ``transformers``."""

from __future__ import annotations

import gzip
import signal
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
zstandard = pytest.importorskip("zstandard")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from p2ptrain.cli import main as cli  # noqa: E402
from p2ptrain.config.schema import NodeConfig, load_config  # noqa: E402
from p2ptrain.model.checkpoint import CheckpointStore  # noqa: E402
from p2ptrain.model.load import resolve  # noqa: E402
from p2ptrain.tasks import hf  # noqa: E402
from tests.support.hfmodel import corpus_text, make_model_dir  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def a_seed(node) -> int:
    return load_config(node.config_path).training.seed


def test_two_nodes_train_an_hf_model_whose_export_transformers_loads(make_node, tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "tiny-gpt2", [corpus_text(i) for i in range(200)])
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):  # the corpus as it is often kept: compressed, half gzip and half zstd
        text = "".join(corpus_text(i * 40 + j) for j in range(40)).encode()
        if i % 2:
            (corpus / f"f{i}.py.gz").write_bytes(gzip.compress(text))
        else:
            (corpus / f"f{i}.py.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    task = {"kind": "hf_causal_lm", "model_config": str(model_dir), "data_path": str(corpus), "seq_len": 16,
            "validation_batches": 2}
    training = {"matchmaking_time": 0.5, "averaging_timeout": 10.0}
    a, b = make_node("a", task=task, training=training), make_node("b", task=task, training=training)
    a.start()
    b.start(join=a.join_addrs()[:1])
    for node in (a, b):
        node.wait_for(lambda s: s.averaging_rounds_ok_total >= 1 and s.last_round_group_size == 2, 90,
                      "a round averaged by both nodes")
    # A clean stop (SIGTERM): each node writes its final checkpoint.  Not a common max_epochs: a node
    # still catching up when its peer stops would have to reach that epoch alone, an averaging timeout
    # an epoch (the exact-epoch stop is tests/integration/test_node_swarm.py's business).
    for node in (a, b):
        node.signal(signal.SIGTERM)
    for node in (a, b):
        assert node.wait(60) == 0, node.report()
        # Each node read its shards through decompressed copies (as text: tests/unit/test_compressed_data.py).
        assert list((node.state_dir / "data-cache").rglob("plain-*")), node.report()
    states = [CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest() for node in (a, b)]
    assert all(s is not None and s.state["epoch"] >= 1 for s in states), f"{a.report(40)}\n---\n{b.report(40)}"
    out = tmp_path / "export"
    assert cli.main(["export", "-c", str(a.config_path), str(out)]) == 0
    ours = resolve(a.config_path, None, print).model.eval()  # the node's checkpoint, as p2ptrain loads it
    theirs = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer(corpus_text(7), return_tensors="pt")["input_ids"][:, :16]
    with torch.no_grad():
        assert torch.allclose(theirs(ids).logits, ours(input_ids=ids).logits, atol=1e-5, rtol=0)
    config = NodeConfig.model_validate({"task": task})
    initial = hf.build_model(config.task, a_seed(a))
    assert any(not torch.equal(initial.state_dict()[n], v) for n, v in theirs.state_dict().items()
               if n in initial.state_dict())  # the export is the trained model, not its initialisation
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and f"| optimizer epochs | {states[0].state['epoch']} |" in card
    assert "nats/token" in card and "this model on the run's held-out split" in card  # measured on the export
