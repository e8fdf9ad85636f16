"""``p2ptrain export``, ``sample`` and ``eval``: the commands that get a trained model out and try it.

Arguments arrive as text and are checked here, so every bad value is one line naming the flag
and a non-zero exit code (2 for a bad flag value, 1 for a MODEL or output that cannot be used,
65 for a model config that asks for untrusted task code or too many parameters, 78 for a bad
config); never a traceback.  A model directory is data: see :mod:`p2ptrain.model.limits`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import ConfigError, load_config
from p2ptrain.data.remote import NotDownloaded
from p2ptrain.errors import EX_BAD_ARGUMENT, EX_DATAERR, EX_FAILURE, EX_OK
from p2ptrain.model.export import VAL_OF_EXPORT, CardInfo, ExportError, check_target, write_export
from p2ptrain.model.hfexport import Upload, push_to_hub
from p2ptrain.model.limits import DEFAULT_MAX_PARAMS, ModelRefused
from p2ptrain.model.load import LoadedModel, ModelError, from_checkpoint, resolve
from p2ptrain.tasks.base import SampleRequest
from p2ptrain.tasks.generate import prompt_bytes

MAX_TOKENS = 100_000


class _BadValue(Exception):
    pass


def _say(command: str) -> Any:
    return lambda line: print(f"p2ptrain {command}: {line}", file=sys.stderr)


def _int(flag: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise _BadValue(f"{flag} must be a whole number, got {text!r}") from None
    if not low <= value <= high:
        raise _BadValue(f"{flag} must be between {low} and {high}, got {value}")
    return value


def _float(flag: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise _BadValue(f"{flag} must be a number, got {text!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise _BadValue(f"{flag} must be between {low:g} and {high:g}, got {text}")
    return value


def export_command(args: argparse.Namespace) -> int:
    say = _say("export")
    try:
        config = load_config(args.config)
        loaded = from_checkpoint(config, args.checkpoint, say, max_params=_max_params(args))
        check_target(args.out_dir, args.force)  # before the validation, which takes a while
        card = measured_card(loaded, say)
        out = write_export(loaded.model, loaded.task, loaded.fingerprint, card, args.out_dir,
                           force=args.force, shape_config=loaded.shape_config, training=loaded.training,
                           torch_copy=args.torch)
    except (ModelError, ExportError) as error:
        say(str(error))
        return EX_FAILURE
    except ModelRefused as error:
        say(str(error))
        return EX_DATAERR
    epoch = "?" if card.epoch is None else card.epoch
    measured = ""
    if card.val_of == VAL_OF_EXPORT and card.val_loss is not None:
        measured = f", validation loss {card.val_loss:.4f}"
    print(f"exported {loaded.source} (epoch {epoch}{measured}, model {loaded.fingerprint}) to {out}")
    if loaded.task.entrypoint is None:
        print(f"try it: p2ptrain sample {out} --prompt 'def '")
    if getattr(args, "push_to_hub", None):
        return push_command(out, args.push_to_hub, say)
    return EX_OK


def push_command(out: Path, repo: str, say: Any, *, upload: Upload | None = None,
                 token: str | None = None) -> int:
    """Upload the export ``out`` to the hub repo ``repo``; one line and exit 1 on failure (the export stays)."""
    try:
        from huggingface_hub import get_token
    except ImportError:
        say(f'--push-to-hub needs huggingface_hub: pip install "p2ptrain[hf]" (the export is in {out})')
        return EX_FAILURE
    token = token or get_token()
    if not token:
        say(f"--push-to-hub: no Hugging Face token (set HF_TOKEN or run `huggingface-cli login`); "
            f"the export is in {out}, not uploaded")
        return EX_FAILURE
    try:
        push_to_hub(out, repo, token, upload=upload)
    except Exception as exc:  # the hub client raises many kinds (HTTP, auth, network): one line each
        first = (str(exc).strip().splitlines() or [""])[0]
        say(f"--push-to-hub {repo}: upload failed ({type(exc).__name__}: {first}); the export is in {out}")
        return EX_FAILURE
    print(f"uploaded {out} to https://huggingface.co/{repo}")
    return EX_OK


def measured_card(loaded: LoadedModel, say: Any) -> CardInfo:
    """``loaded.card`` with the validation loss of the exported weights themselves, when it is cheap to get.

    A checkpoint carries the node's last validation, which can be epochs older than the checkpoint and,
    in DiLoCo mode, is of the node's local model while an export holds the swarm's outer parameters.
    For the built-in tasks, scoring the weights costs one validation (``task.validation_batches``
    batches of the held-out text, read from local files or the download cache), so the card's figure
    is exactly what ``p2ptrain eval`` reports.  Nothing is downloaded for it and no user code is run:
    then the card keeps the node's figure, labelled as the node's measurement of its epoch.
    """
    card = loaded.card
    if loaded.task.entrypoint is not None:  # only the built-in tasks are scored here: no user code is run
        return card
    try:
        metrics = _held_out_metrics(loaded, offline=True)
    except (ConfigError, ModelError, NotDownloaded, OSError) as error:
        kept = ("no validation loss" if card.val_loss is None else
                f"the node's last validation loss ({card.val_loss:.4f}, "
                f"{'epoch ?' if card.val_epoch is None else f'epoch {card.val_epoch}'}), labelled as the node's")
        say(f"validation loss not measured on this model: the held-out split is not readable here "
            f"({_one_line(error)}); the model card gives {kept}")
        return card
    if not math.isfinite(metrics["loss"]):  # a diverged model: the figure would say nothing true
        return card
    return dataclasses.replace(card, val_loss=metrics["loss"], val_epoch=card.epoch, val_of=VAL_OF_EXPORT)


def _load(command: str, args: argparse.Namespace) -> LoadedModel:
    trusted = bool(getattr(args, "trust_task_code", False))
    return resolve(Path(args.model), args.config, _say(command), trust_task_code=trusted, max_params=_max_params(args))


def _max_params(args: argparse.Namespace) -> int:
    return int(getattr(args, "max_params", None) or DEFAULT_MAX_PARAMS)


def sample_command(args: argparse.Namespace) -> int:
    say = _say("sample")
    try:
        request = SampleRequest(
            prompt=args.prompt,
            tokens=_int("--tokens", args.tokens, 1, MAX_TOKENS),
            temperature=_float("--temperature", args.temperature, 0.0, 100.0),
            top_k=_int("--top-k", args.top_k, 0, 1_000_000),
            seed=_int("--seed", args.seed, 0, 2**63 - 1),
        )
        loaded = _load("sample", args)
        hook = _sample_hook(loaded)
    except _BadValue as error:
        say(str(error))
        return EX_BAD_ARGUMENT
    except ModelError as error:
        say(str(error))
        return EX_FAILURE
    except ModelRefused as error:
        say(str(error))
        return EX_DATAERR
    if hook is None:
        say(f"the task {loaded.task.entrypoint} has no sample hook (Task.sample); nothing to generate")
        return EX_FAILURE
    try:
        text = hook(loaded.model, request)
    except Exception as error:  # a user task's code: its failure is one line, not a traceback
        say(f"the task's sample hook failed: {_one_line(error)}")
        return EX_FAILURE
    if not isinstance(text, str):
        say(f"the task's sample hook returned a {type(text).__name__}, not text")
        return EX_FAILURE
    # The prompt as text: bytes that are not UTF-8 show as U+FFFD, as in the generated text.
    shown = prompt_bytes(request.prompt).decode("utf-8", "replace") + text
    _write(shown + ("" if shown.endswith("\n") else "\n"))
    return EX_OK


def _write(text: str) -> None:
    """``text`` on stdout; what its encoding cannot hold (a hook's lone surrogate) shown as a replacement."""
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        encoding = sys.stdout.encoding or "utf-8"
        sys.stdout.write(text.encode(encoding, "replace").decode(encoding))


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _check_metrics(metrics: object) -> dict[str, float]:
    """What an evaluate hook returned, as named finite numbers; ModelError naming what is wrong."""
    if not isinstance(metrics, Mapping) or not metrics:
        raise ModelError(f"the task's evaluate hook returned {type(metrics).__name__}, not named numbers")
    checked = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelError(f"the task's evaluate hook returned {name!r}: {value!r}, not a number")
        if not math.isfinite(value):
            raise ModelError(f"the task's evaluate hook returned {name} = {value} (no data scored?)")
        checked[name] = float(value)
    return checked


def eval_command(args: argparse.Namespace) -> int:
    say = _say("eval")
    try:
        loaded = _load("eval", args)
        hook = _evaluate_hook(loaded, say)
        if hook is None:
            say(f"the task {loaded.task.entrypoint} has no evaluate hook (Task.evaluate); nothing to report")
            return EX_FAILURE
        try:
            metrics = _check_metrics(hook(loaded.model, None if args.data is None else str(args.data)))
        except (ModelError, ConfigError, OSError):
            raise
        except Exception as error:  # a user task's code: its failure is one line, not a traceback
            raise ModelError(f"the task's evaluate hook failed: {_one_line(error)}") from None
    except ModelError as error:
        say(str(error))
        return EX_FAILURE
    except ModelRefused as error:
        say(str(error))
        return EX_DATAERR
    except OSError as error:
        say(f"cannot read {args.data}: {error.strerror or error}")
        return EX_FAILURE
    where = "the held-out split" if args.data is None else str(args.data)
    if "loss" in metrics and "tokens" in metrics:
        print(f"{loaded.source} on {where} ({int(metrics['tokens']):,} tokens scored):")
        print(f"  validation loss  {metrics['loss']:.4f} nats/token")
        print(f"  perplexity       {metrics['perplexity']:.3f}")
    elif "loss" in metrics and "bits_per_byte" in metrics:
        print(f"{loaded.source} on {where} ({int(metrics.get('bytes', 0)):,} bytes scored):")
        print(f"  validation loss  {metrics['loss']:.4f} nats/byte")
        print(f"  bits per byte    {metrics['bits_per_byte']:.4f}")
        print(f"  perplexity       {metrics['perplexity']:.3f}")
    else:
        print(f"{loaded.source} on {where}:")
        for name, value in metrics.items():
            print(f"  {name:<16} {value:.6g}")
    return EX_OK


def _sample_hook(loaded: LoadedModel) -> Any:
    if loaded.task.entrypoint is None and loaded.task.kind == "hf_causal_lm":
        from p2ptrain.tasks import hf

        try:
            return hf.make_sampler(hf.load_tokenizer(loaded.task), loaded.task.seq_len)
        except hf.ModelDirRefused as error:
            raise ModelError(str(error)) from None
    if loaded.task.entrypoint is None:
        from p2ptrain.tasks.generate import sample_bytes

        return sample_bytes
    return _user_task(loaded).sample


def _evaluate_hook(loaded: LoadedModel, say: Any) -> Any:
    """Built-in tasks: the held-out split built as the nodes build it (same batches), or the text at
    ``--data`` read as ``task.data_path`` is (files, directories, globs; text, JSONL, Parquet), its first
    4 MiB; a user task: its own hook."""
    if loaded.task.entrypoint is not None:
        return _user_task(loaded).evaluate
    from p2ptrain.data.text import SCORE_MAX_BYTES, make_fetcher, text_batches

    scoring = _scoring(loaded)
    cfg, score = scoring
    batch_size = int(loaded.training.get("batch_size", 8))

    def evaluate(model: Any, data_path: str | None) -> dict[str, float]:
        if data_path is None:
            try:
                return _held_out_metrics(loaded, scoring=scoring)
            except ConfigError as error:  # only here is the run's data needed: say what else would do
                raise ConfigError(f"{error} (the held-out split needs the run's data here; or pass --data PATH)"
                                  ) from None
        try:
            scored = text_batches(data_path, cfg, batch_size, make_fetcher(cfg, loaded.cache_dir), label="--data",
                                  max_bytes=SCORE_MAX_BYTES)
        except ConfigError as error:  # a flag, not the config: the input cannot be used (exit 1)
            raise ModelError(str(error)) from None
        if scored.skipped:
            more = f" (and {len(scored.skipped) - 1} more)" if len(scored.skipped) > 1 else ""
            say(f"--data: {len(scored.skipped)} shard(s) left out, unreadable or malformed: "
                f"{scored.skipped[0]}{more}")
        if scored.failed_records:
            say(f"--data: {scored.failed_records} record(s) skipped, they do not decode: {scored.first_failure}")
        if not scored.batches:
            needs = (f"{cfg.seq_len} bytes for its task.seq_len = {loaded.task.seq_len} tokens"
                     if loaded.task.kind == "hf_causal_lm" else f"task.seq_len = {cfg.seq_len} bytes")
            raise ModelError(f"--data {data_path} holds {scored.text_bytes:,} bytes of text: too little to score "
                             f"(the model needs more than {needs})")
        if scored.truncated:
            say(f"--data: scoring the first {SCORE_MAX_BYTES:,} bytes of its text")
        return score(model, scored.batches)

    return evaluate


def _scoring(loaded: LoadedModel) -> tuple[Any, Any]:
    """A built-in task's ``[task]`` for reading text in windows, and its ``score(model, windows)``: bytelm's
    metrics a byte, or a Hugging Face model's a token (its tokenizer from the model's directory)."""
    if loaded.task.kind != "hf_causal_lm":
        from p2ptrain.tasks.generate import lm_metrics

        return loaded.task, lm_metrics
    from p2ptrain.tasks import hf

    try:
        tokenizer = hf.load_tokenizer(loaded.task)
    except hf.ModelDirRefused as error:
        raise ModelError(str(error)) from None
    seq_len = loaded.task.seq_len
    return hf.byte_config(loaded.task), lambda model, windows: hf.token_metrics(model, tokenizer, seq_len, windows)


def _held_out_metrics(loaded: LoadedModel, *, offline: bool = False,
                      scoring: tuple[Any, Any] | None = None) -> dict[str, float]:
    """A built-in task's metrics on the run's held-out split, built exactly as the nodes build their
    validation batches; ``offline``: from local files and the download cache only (NotDownloaded otherwise);
    ``scoring``: :func:`_scoring`'s answer when the caller has it (the tokenizer is loaded once)."""
    from p2ptrain.data.text import build_text_data, make_fetcher

    cfg, score = scoring if scoring is not None else _scoring(loaded)
    batch_size = int(loaded.training.get("batch_size", 8))
    data = build_text_data(cfg, batch_size=batch_size, peer_seed=0, peer_id="eval", live_peers=lambda: ["eval"],
                           fetcher=make_fetcher(cfg, loaded.cache_dir, offline=offline))
    return dict(score(loaded.model, data.validation))


def _user_task(loaded: LoadedModel) -> Any:
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.tasks.loader import build_task

    training = TrainingSection(**{k: v for k, v in loaded.training.items() if k in ("batch_size", "seed")})
    task = build_task(loaded.task, training, peer_seed=0)
    task.model = loaded.model
    return task
