"""Trying the byte-level LM: sampling text from it, and its loss, bits per byte and perplexity.

Sampling draws from a private ``torch.Generator`` seeded by the request, so the same model,
prompt and seed give the same text (and the caller's global RNG is left alone).  The prompt is
bytes to a byte-level model: whatever the shell passed, undecodable bytes included.  Evaluation
averages the per-batch loss exactly as the node's ``Trainer.validation_loss`` does, so the
numbers compare with the validation loss a node reports.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from p2ptrain.tasks.base import SampleRequest

VOCAB_SIZE = 256


@torch.no_grad()
def sample_bytes(model: nn.Module, request: SampleRequest) -> str:
    """``request.tokens`` bytes generated after ``request.prompt`` (UTF-8; undecodable bytes shown as U+FFFD)."""
    seq_len = int(cast(Any, model).seq_len)  # a plain attribute of the byte models, not a Module's tensor
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(request.seed)
    context = list(prompt_bytes(request.prompt)) or [ord("\n")]
    generated: list[int] = []
    try:
        for _ in range(request.tokens):
            window = torch.tensor([context[-seq_len:]], dtype=torch.long)
            logits = model(window)[0, -1].float()
            generated.append(_pick(logits, request, generator))
            context.append(generated[-1])
    finally:
        model.train(was_training)
    return bytes(generated).decode("utf-8", errors="replace")


def prompt_bytes(prompt: str) -> bytes:
    """The bytes of ``prompt`` as the user typed them: a command line's undecodable bytes (which Python
    holds as lone surrogates) come back as they were; a lone surrogate from code becomes U+FFFD."""
    try:
        return os.fsencode(prompt)
    except UnicodeEncodeError:
        return prompt.encode("utf-8", "replace")


def _pick(logits: torch.Tensor, request: SampleRequest, generator: torch.Generator) -> int:
    if request.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.double()
    if 0 < request.top_k < logits.numel():
        cutoff = torch.topk(logits, request.top_k).values[-1]
        logits = logits.masked_fill(logits < cutoff, -math.inf)
    # Shifted so the best byte is at 0 before dividing: every other byte is <= 0 and a tiny temperature
    # drives it to -inf, never to +inf or nan (which softmax would turn into an invalid distribution).
    scaled = (logits - logits.max()) / request.temperature
    probabilities = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


@torch.no_grad()
def lm_metrics(model: nn.Module, batches: Iterable[torch.Tensor]) -> dict[str, float]:
    """Mean next-byte loss over ``batches`` (nats), bits per byte, perplexity, and the bytes scored."""
    was_training = model.training
    model.eval()
    total, count, scored = 0.0, 0, 0
    try:
        for batch in batches:
            logits = model(batch[:, :-1])
            total += float(F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1)))
            count += 1
            scored += batch[:, 1:].numel()
    finally:
        model.train(was_training)
    loss = total / count if count else math.nan
    return {"loss": loss, "bits_per_byte": loss / math.log(2), "perplexity": math.exp(loss) if count else math.nan,
            "bytes": float(scored)}
