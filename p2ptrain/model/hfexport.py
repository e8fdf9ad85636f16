"""The Hugging Face layout of an export: ByteLM as GPT-2 (config, weights, byte tokenizer), and the hub upload.

ByteLM is GPT-2's architecture with a byte vocabulary, checked piece by piece: pre-norm blocks
(``ln_1`` before attention, ``ln_2`` before the MLP, ``ln_f`` at the end), LayerNorm eps 1e-5, learned
positional embeddings, fused q/k/v split in that order, attention scaled by ``1/sqrt(head_dim)``, biases
on every linear, an MLP of width ``4 x d_model``, and the head tied to the token embedding.  Two
differences, matched here: ByteLM's GELU is the exact (erf) one, so the config says
``activation_function = "gelu"`` (not GPT-2's default tanh ``gelu_new``); and GPT-2's ``Conv1D`` keeps
weights as ``(in, out)``, the transpose of ``nn.Linear``'s.  Token ``i`` is byte ``i``: the tokenizer is
byte-level BPE with the 256 bytes as its vocabulary and no merges.

Pure torch and JSON here; ``tokenizers`` and ``huggingface_hub`` are imported only when used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

GPT2_ARCH = "GPT2LMHeadModel"
_LINEARS = {"qkv": "attn.c_attn", "proj": "attn.c_proj", "fc": "mlp.c_fc", "out": "mlp.c_proj"}
_NORMS = {"ln1": "ln_1", "ln2": "ln_2"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(\w+)\.(weight|bias)")
_HF_BLOCK = re.compile(r"transformer\.h\.(\d+)\.(\w+(?:\.\w+)?)\.(weight|bias)")


def gpt2_config(model_args: Mapping[str, int]) -> dict[str, Any]:
    """The GPT-2 config of a ByteLM with these ``model_args`` (seq_len, d_model, n_layers, n_heads)."""
    width = model_args["d_model"]
    return {
        "architectures": [GPT2_ARCH], "model_type": "gpt2", "vocab_size": 256,
        "n_positions": model_args["seq_len"], "n_embd": width, "n_layer": model_args["n_layers"],
        "n_head": model_args["n_heads"], "n_inner": 4 * width, "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "scale_attn_weights": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": None, "use_cache": True, "torch_dtype": "float32",
    }


def bytelm_to_gpt2(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ByteLM's state dict under GPT-2's names (the tied head is the embedding: not stored twice)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        match = _BLOCK.fullmatch(name)
        if name in ("tok_emb.weight", "pos_emb.weight"):
            target, value = "transformer." + ("wte" if name.startswith("tok") else "wpe") + ".weight", value
        elif name.startswith("ln_f."):
            target = "transformer." + name
        elif match and match[2] in _NORMS:
            target = f"transformer.h.{match[1]}.{_NORMS[match[2]]}.{match[3]}"
        elif match and match[2] in _LINEARS:
            target = f"transformer.h.{match[1]}.{_LINEARS[match[2]]}.{match[3]}"
            value = value.t() if match[3] == "weight" else value
        else:
            raise ValueError(f"ByteLM parameter {name!r} has no GPT-2 counterpart")
        out[target] = value.detach().contiguous().clone()
    return out


def gpt2_to_bytelm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`bytelm_to_gpt2` (``lm_head.weight``, the tied copy, is dropped)."""
    norms = {v: k for k, v in _NORMS.items()}
    linears = {v: k for k, v in _LINEARS.items()}
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        match = _HF_BLOCK.fullmatch(name)
        if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if name in ("transformer.wte.weight", "transformer.wpe.weight"):
            target = ("tok_emb" if ".wte." in name else "pos_emb") + ".weight"
        elif name.startswith("transformer.ln_f."):
            target = name.removeprefix("transformer.")
        elif match and match[2] in norms:
            target = f"blocks.{match[1]}.{norms[match[2]]}.{match[3]}"
        elif match and match[2] in linears:
            target = f"blocks.{match[1]}.{linears[match[2]]}.{match[3]}"
            value = value.t() if match[3] == "weight" else value
        else:
            raise ValueError(f"GPT-2 weight {name!r} has no ByteLM counterpart")
        out[target] = value.contiguous()
    return out


def is_gpt2_state(names: Any) -> bool:
    return any(str(name).startswith("transformer.") for name in names)


def write_byte_tokenizer(directory: Path) -> bool:
    """A fast byte-level tokenizer (token ``i`` = byte ``i``) in ``directory``; False without ``tokenizers``."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from tokenizers.pre_tokenizers import ByteLevel
    except ImportError:
        return False
    alphabet = ByteLevel.alphabet()  # GPT-2's printable stand-in for each byte
    table = _bytes_to_unicode()
    vocab = {table[byte]: byte for byte in range(256)}
    assert set(vocab) == set(alphabet)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1000000000000000019884624838656,'
        ' "clean_up_tokenization_spaces": false}\n', encoding="utf-8")
    return True


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (as ``tokenizers``' ByteLevel uses it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


Upload = Callable[..., Any]


def push_to_hub(directory: Path, repo: str, token: str, *, upload: Upload | None = None) -> Any:
    """Upload the export ``directory`` to the hub model repo ``repo`` (created if missing)."""
    if upload is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo, repo_type="model", exist_ok=True)
        upload = api.upload_folder
    return upload(folder_path=str(directory), repo_id=repo, repo_type="model",
                  commit_message="Upload a model trained by a p2ptrain swarm")
