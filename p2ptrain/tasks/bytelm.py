"""The built-in task: a small byte-level causal transformer language model.

Vocabulary 256 (raw bytes, no tokenizer), learned positional embedding, pre-norm blocks with
``scaled_dot_product_attention(is_causal=True)``, and an output head tied to the token
embedding (computed with ``F.linear`` on the embedding weight, so every parameter appears once
in ``named_parameters()`` and hivemind averages it once).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from p2ptrain.data.text import build_text_data, make_fetcher, text_batches
from p2ptrain.tasks.base import Task, TaskContext
from p2ptrain.tasks.generate import VOCAB_SIZE, lm_metrics, sample_bytes

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ByteLM(nn.Module):
    """Byte-level causal LM; ``forward(tokens[B, T]) -> logits[B, T, 256]`` for ``T <= seq_len``."""

    def __init__(self, seq_len: int, d_model: int, n_layers: int, n_heads: int, *, seed: int = 0) -> None:
        super().__init__()
        self.seq_len = seq_len
        # Building the layers draws default inits from torch's global RNG; fork it so constructing
        # a model leaves the caller's RNG state untouched, then re-initialise from a local generator.
        with torch.random.fork_rng(devices=[]):
            self.tok_emb = nn.Embedding(VOCAB_SIZE, d_model)
            self.pos_emb = nn.Embedding(seq_len, d_model)
            self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
            self.ln_f = nn.LayerNorm(d_model)
        self.reset_parameters(seed, n_layers)

    @torch.no_grad()
    def reset_parameters(self, seed: int, n_layers: int) -> None:
        """GPT-2 style init, a pure function of ``seed``: identical on every node."""
        generator = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * n_layers)
        for name, param in self.named_parameters():  # fixed registration order -> fixed draws
            if ".ln" in name or name.startswith("ln_"):
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                std = residual_std if name.endswith(("proj.weight", "out.weight")) else 0.02
                param.normal_(0.0, std, generator=generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.seq_len:
            raise ValueError(f"sequence of {length} tokens is longer than seq_len={self.seq_len}")
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(length, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok_emb.weight)


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-byte cross-entropy (nats per byte) of a ``(B, T + 1)`` batch."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1))


def shape_config(seq_len: int, d_model: int, n_layers: int, n_heads: int) -> dict[str, Any]:
    return {"task": "bytelm", "vocab": VOCAB_SIZE, "seq_len": seq_len, "d_model": d_model,
            "n_layers": n_layers, "n_heads": n_heads, "tied_head": True}


def parameter_count(seq_len: int, d_model: int, n_layers: int) -> int:
    """The parameters of a :class:`ByteLM` of this shape, computed without building it: token and
    position embeddings, per block two LayerNorms, qkv, proj, fc and out with biases, the final LayerNorm
    (the head is tied to the token embedding)."""
    per_block = 12 * d_model * d_model + 13 * d_model
    return VOCAB_SIZE * d_model + seq_len * d_model + n_layers * per_block + 2 * d_model


def model_args(cfg: TaskSection) -> dict[str, int]:
    """The arguments of :class:`ByteLM` for ``cfg`` (what an export's config.json records)."""
    return {"seq_len": cfg.seq_len, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads}


def build_model(cfg: TaskSection, seed: int) -> ByteLM:
    return ByteLM(**model_args(cfg), seed=seed)


def build_bytelm(context: TaskContext) -> Task:
    """The ``bytelm`` task for ``context`` (raises ConfigError for a bad ``task.data_path``)."""
    cfg = context.task
    assert context.live_peers is not None  # TaskContext fills it in
    data = build_text_data(cfg, batch_size=context.batch_size, peer_seed=context.peer_seed,
                           peer_id=context.peer_id, live_peers=context.live_peers, cache_dir=context.cache_dir)
    fixed = data.validation

    def evaluate(model: nn.Module, data_path: str | None) -> dict[str, float]:
        if data_path is None:
            return lm_metrics(model, fixed)
        scored = text_batches(data_path, cfg, context.batch_size, make_fetcher(cfg, context.cache_dir), label="data")
        return lm_metrics(model, scored.batches)

    return Task(
        model=build_model(cfg, context.seed),
        loss_fn=lm_loss,
        train_batches=data.stream,
        validation_batches=lambda: iter(fixed),
        shape_config=shape_config(cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads),
        sample=sample_bytes,
        evaluate=evaluate,
    )
