"""A tiny Hugging Face model directory for tests: a GPT-2 config and a BPE tokenizer trained on test text.

Nothing is downloaded: the tokenizer is trained here with ``tokenizers`` on the text given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

TINY_GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 1, "n_head": 2,
             "n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def make_model_dir(root: Path, texts: Iterable[str], *, vocab_size: int = 300, **config: object) -> Path:
    """``root`` with config.json (vocab_size = the tokenizer's) and tokenizer.json; returns ``root``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(root))
    eos = tokenizer.token_to_id("<|endoftext|>")
    settings = {**TINY_GPT2, "vocab_size": tokenizer.get_vocab_size(), "bos_token_id": eos, "eos_token_id": eos,
                **config}
    (root / "config.json").write_text(json.dumps(settings, indent=2))
    return root


def corpus_text(line: int) -> str:
    return f"def function_{line}(value):\n    return value * {line} + {line % 7}\n"
