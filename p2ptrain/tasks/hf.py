"""The built-in ``hf_causal_lm`` task: a Hugging Face ``transformers`` causal LM trained on the text shards.

The model comes from ``task.model_config`` (a local directory with ``config.json``, optionally with
``model.safetensors`` to start from, else initialised from scratch from ``training.seed``), the
tokenizer from ``task.tokenizer`` (a fast tokenizer's directory).  The data is the same shard stream
as ``bytelm``'s, read in windows of ``BYTES_PER_TOKEN x seq_len`` bytes and tokenised on the fly, a
batch at a time; a window that yields fewer than ``seq_len + 1`` tokens is padded and the padding is
left out of the loss.

A model directory is data written by someone else: no ``trust_remote_code``, no ``auto_map``, only
the causal-LM classes ``transformers`` itself ships, and the parameter count is computed on torch's
``meta`` device (nothing allocated) before the model is built.  ``transformers`` is imported only
here and only when this task is used, so ``bytelm`` needs none of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from p2ptrain.config.schema import ConfigError
from p2ptrain.data.text import build_text_data
from p2ptrain.tasks.base import SampleFn, SampleRequest, Task, TaskContext

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection

BYTES_PER_TOKEN = 4
"""Bytes of text read per token wanted: enough that a window almost always fills ``seq_len + 1`` tokens."""
MAX_CONFIG_BYTES = 1024 * 1024
WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "config.json"
IGNORE = -100
"""The label ``transformers`` and ``F.cross_entropy`` leave out of the loss (padding)."""


class ModelDirRefused(ValueError):
    """The model directory is unusable or asks for what a data file may not ask; one line."""


def config_path(task: TaskSection) -> Path:
    """``task.model_config`` as the path of its config.json."""
    path = Path(task.model_path or "").expanduser()
    return path / CONFIG_FILE if path.is_dir() else path


def read_config(task: TaskSection) -> Any:
    """The ``transformers`` config of ``task.model_config``, refused unless it is a known causal LM."""
    path = config_path(task)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ModelDirRefused(f"{path}: over {MAX_CONFIG_BYTES:,} bytes, not a model config")
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelDirRefused(f"task.model_config: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ModelDirRefused(f"task.model_config: {path} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelDirRefused(f"task.model_config: {path} is not a JSON object")
    try:
        from transformers import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        raise ConfigError('task.kind = "hf_causal_lm" needs transformers: pip install "p2ptrain[hf]"') from None
    if "auto_map" in raw:
        raise ModelDirRefused(f"{path} names its own model code (auto_map); p2ptrain never runs code from a "
                              "model directory (no trust_remote_code)")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelDirRefused(f"{path}: model_type {model_type!r} is not a causal LM architecture transformers ships")
    known = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    for name in raw.get("architectures") or []:
        if name != known:
            raise ModelDirRefused(f"{path}: architecture {name!r} is not {model_type}'s causal LM class {known!r}")
    try:
        return CONFIG_MAPPING[model_type].from_dict(raw)
    except Exception as exc:
        raise ModelDirRefused(f"{path}: not a valid {model_type} config: {type(exc).__name__}: {exc}") from None


def _model_class(config: Any) -> Any:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])


def parameter_count(task: TaskSection) -> int:
    """The parameters the model of ``task.model_config`` has, counted on the meta device (no memory used)."""
    config = read_config(task)
    with torch.device("meta"):
        model = _model_class(config)(config)
    return sum(p.numel() for p in model.parameters())


def build_model(task: TaskSection, seed: int) -> nn.Module:
    """The model: the directory's safetensors weights if it has them, else initialised from ``seed``."""
    config = read_config(task)
    weights = config_path(task).parent / WEIGHTS_FILE
    with torch.random.fork_rng(devices=[]):  # the same init on every node, the caller's RNG untouched
        torch.manual_seed(seed)
        model = _model_class(config)(config)
    if weights.is_file():
        from safetensors.torch import load_model

        try:
            load_model(model, str(weights), strict=False)
        except Exception as exc:
            raise ModelDirRefused(f"{weights}: does not fit the config: {type(exc).__name__}: {exc}") from None
    return model


def load_tokenizer(task: TaskSection) -> Any:
    """The fast tokenizer of ``task.tokenizer`` (default: the model's directory)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    where = Path(task.tokenizer).expanduser() if task.tokenizer else config_path(task).parent
    if not (where / "tokenizer.json").is_file():
        raise ModelDirRefused(f"task.tokenizer: {where} has no tokenizer.json (a fast tokenizer)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), trust_remote_code=False, local_files_only=True)
    except Exception as exc:
        raise ModelDirRefused(f"task.tokenizer: {where}: {type(exc).__name__}: {exc}") from None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ModelDirRefused(f"task.tokenizer: {where} is not a fast tokenizer")
    return tokenizer


@dataclass
class TokenBatch:
    """``input_ids[B, T]`` and ``labels[B, T]`` (next tokens; ``IGNORE`` where padded)."""

    input_ids: torch.Tensor
    labels: torch.Tensor


def tokenise(tokenizer: Any, windows: torch.Tensor, seq_len: int) -> TokenBatch:
    """Byte windows ``[B, N]`` to token batches of ``seq_len`` inputs: one batched call of the fast tokenizer."""
    texts = [bytes(row.tolist()).decode("utf-8", errors="replace") for row in windows]
    encoded = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=seq_len + 1)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(texts), seq_len + 1), pad, dtype=torch.long)
    labels = torch.full((len(texts), seq_len + 1), IGNORE, dtype=torch.long)
    for row, tokens in enumerate(encoded):
        ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        labels[row, :len(tokens)] = ids[row, :len(tokens)]
    return TokenBatch(ids[:, :-1].contiguous(), labels[:, 1:].contiguous())


class TokenStream:
    """The byte shard stream, tokenised: its position is the byte stream's (resumes exactly)."""

    def __init__(self, stream: Any, tokenizer: Any, seq_len: int) -> None:
        self._stream, self._tokenizer, self._seq_len = stream, tokenizer, seq_len

    def next(self) -> TokenBatch:
        return tokenise(self._tokenizer, self._stream.next(), self._seq_len)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._stream.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state)

    def coverage(self) -> Any:
        return self._stream.coverage()


def byte_config(task: TaskSection) -> TaskSection:
    """The ``[task]`` the byte stream is read with: windows of ``BYTES_PER_TOKEN`` bytes a token."""
    return task.model_copy(update={"seq_len": task.seq_len * BYTES_PER_TOKEN})


@torch.no_grad()
def token_metrics(model: nn.Module, tokenizer: Any, seq_len: int, windows: Iterable[torch.Tensor]) -> dict[str, float]:
    """Next-token loss (nats a token, padding left out) over byte ``windows`` tokenised as training
    tokenises them, its perplexity, and the tokens scored."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    try:
        for window in windows:
            batch = tokenise(tokenizer, window, seq_len)
            count = int((batch.labels != IGNORE).sum())
            if count:
                total += float(causal_lm_loss(model, batch)) * count
                tokens += count
    finally:
        model.train(was_training)
    loss = total / tokens if tokens else math.nan
    return {"loss": loss, "perplexity": math.exp(loss) if tokens else math.nan, "tokens": float(tokens)}


def causal_lm_loss(model: nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Next-token cross-entropy (nats per token), padding left out."""
    logits = model(input_ids=batch.input_ids).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1), ignore_index=IGNORE)


def shape_config(task: TaskSection, tokenizer: Any) -> dict[str, Any]:
    """The fingerprinted shape: the whole model config and the tokenizer's vocabulary."""
    parsed = read_config(task)
    # Only the keys the config class itself has (an export's config.json carries p2ptrain's keys too), less
    # those that say who wrote the file rather than what the model is.
    own = set(type(parsed)().to_dict()) - {"transformers_version", "_name_or_path", "torch_dtype", "dtype",
                                            "architectures"}
    config = {key: value for key, value in parsed.to_dict().items() if key in own}
    return {"task": "hf_causal_lm", "seq_len": task.seq_len, "config": config, "vocab": len(tokenizer)}


def make_sampler(tokenizer: Any, seq_len: int) -> SampleFn:
    """``p2ptrain sample`` for a causal LM: the request's tokens after its prompt, drawn from a private generator."""

    @torch.no_grad()
    def sample(model: nn.Module, request: SampleRequest) -> str:
        generator = torch.Generator().manual_seed(request.seed)
        ids = tokenizer(request.prompt or "\n", add_special_tokens=False, return_tensors="pt")["input_ids"]
        start, was_training = ids.shape[1], model.training
        model.eval()
        try:
            for _ in range(request.tokens):
                logits = model(input_ids=ids[:, -seq_len:]).logits[0, -1].float()
                if request.temperature <= 0:
                    token = int(logits.argmax())
                else:
                    if request.top_k:
                        cut = torch.topk(logits, min(request.top_k, logits.numel())).values[-1]
                        logits = logits.masked_fill(logits < cut, float("-inf"))
                    probs = torch.softmax(logits / request.temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        finally:
            model.train(was_training)
        return str(tokenizer.decode(ids[0, start:].tolist()))

    return sample


def build_hf_task(context: TaskContext) -> Task:
    """The ``hf_causal_lm`` task for ``context``; a bad model directory is one ConfigError line."""
    cfg = context.task
    try:
        read_config(cfg)  # the model directory is judged before anything else is read from it
        tokenizer = load_tokenizer(cfg)
        model = build_model(cfg, context.seed)
        shape = shape_config(cfg, tokenizer)
    except ModelDirRefused as exc:
        raise ConfigError(str(exc)) from None
    assert context.live_peers is not None  # TaskContext fills it in
    byte_cfg = byte_config(cfg)
    data = build_text_data(byte_cfg, batch_size=context.batch_size, peer_seed=context.peer_seed,
                           peer_id=context.peer_id, live_peers=context.live_peers, cache_dir=context.cache_dir)
    fixed = [tokenise(tokenizer, window, cfg.seq_len) for window in data.validation]

    return Task(
        model=model,
        loss_fn=causal_lm_loss,
        train_batches=TokenStream(data.stream, tokenizer, cfg.seq_len),
        validation_batches=lambda: iter(fixed),
        shape_config=shape,
        sample=make_sampler(tokenizer, cfg.seq_len),
    )
