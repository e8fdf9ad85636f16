"""Finding a trained model and loading it: from an export directory, a checkpoint, or a node's config.

The model is rebuilt from the task settings (the built-in ``bytelm`` without touching its
data; a user task through its entrypoint) and must have the fingerprint the weights were saved
with, so weights are never loaded into a model of another shape.  Every user mistake is a
:class:`ModelError` with one line to print.  Before anything is built, the settings are held to
:mod:`p2ptrain.model.limits`: an export's task code runs only when trusted, and the parameter count
is bounded (:class:`~p2ptrain.model.limits.ModelRefused`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ValidationError

from p2ptrain.config.errors import describe_invalid
from p2ptrain.config.schema import NodeConfig, TaskSection, TrainingSection, load_config
from p2ptrain.errors import printable
from p2ptrain.model.checkpoint import CheckpointStore, LoadedCheckpoint, load_failure, read_checkpoint
from p2ptrain.model.export import CONFIG_FILE, EXPORT_FORMAT, MODEL_FILE, CardInfo
from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.model.hfexport import gpt2_to_bytelm, is_gpt2_state
from p2ptrain.model.limits import DEFAULT_MAX_PARAMS, check_model_config
from p2ptrain.tasks import bytelm
from p2ptrain.tasks.loader import build_task

Say = Callable[[str], None]

#: An export's config.json is a few kilobytes; anything far larger is not one (and is not read whole).
MAX_CONFIG_BYTES = 1024 * 1024
#: The training settings an export keeps: what ``p2ptrain eval`` needs to rebuild the nodes' validation batches.
EXPORT_TRAINING_KEYS = ("batch_size", "seed")


class ModelError(Exception):
    """MODEL is not something a model can be loaded from; the message is one line."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    task: TaskSection
    training: dict[str, Any]
    fingerprint: str
    shape_config: dict[str, Any]
    card: CardInfo
    source: str
    cache_dir: Path | None = None


def build_model(task: TaskSection, training: TrainingSection) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A freshly initialised model for ``task`` and its shape config (bytelm needs no data for this)."""
    if task.entrypoint is None and task.kind == "hf_causal_lm":
        from p2ptrain.tasks import hf  # transformers only for a Hugging Face model

        try:
            return hf.build_model(task, training.seed), hf.shape_config(task, hf.load_tokenizer(task))
        except hf.ModelDirRefused as exc:
            raise ModelError(str(exc)) from None
    if task.entrypoint is None:
        return bytelm.build_model(task, training.seed), bytelm.shape_config(
            task.seq_len, task.d_model, task.n_layers, task.n_heads)
    built = build_task(task, training, peer_seed=0)
    return built.model, built.shape_config


def from_checkpoint(config: NodeConfig, checkpoint: Path | None, say: Say, *,
                    max_params: int = DEFAULT_MAX_PARAMS) -> LoadedModel:
    """The model in ``checkpoint``, or in the newest checkpoint of ``config`` that loads.  ``config`` is
    the node's own: its task code is the user's."""
    check_model_config(config.task, "the config's [task]", own_entrypoint=config.task.entrypoint,
                       max_params=max_params)
    if checkpoint is not None:
        if checkpoint.is_dir():
            raise ModelError(f"--checkpoint {checkpoint} is a directory: name a checkpoint file in it (ckpt-*.pt), "
                             "or leave --checkpoint out for the newest in the config's checkpoint.dir")
        if not checkpoint.is_file():
            raise ModelError(f"checkpoint {checkpoint} does not exist")
        try:
            loaded = LoadedCheckpoint(checkpoint, read_checkpoint(checkpoint))
        except Exception as exc:
            raise ModelError(f"checkpoint {checkpoint} does not load ({load_failure(exc)})") from None
    else:
        directory = config.checkpoint_dir()
        found, failed = CheckpointStore(directory, keep=1).read_latest()
        if found is None:
            raise ModelError(f"no checkpoint that loads in {directory}" + (
                f" ({len(failed)} corrupt)" if failed else " (has the node written one yet?)"))
        if failed:
            newest, reason = failed[0]
            others = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
            say(f"checkpoint {newest.name}{others} does not load ({_short(reason)}); "
                f"using the previous one, {found.path.name}")
        loaded = found
    state = loaded.state
    model, shape = build_model(config.task, config.training)
    fingerprint = model_fingerprint(model, shape)
    saved = state.get("fingerprint")
    if saved not in (None, fingerprint):
        raise ModelError(f"{loaded.path} holds model {saved} but this config builds {fingerprint}; "
                         "pass the config the run used (-c)")
    weights = state.get("model")
    if not isinstance(weights, dict):
        raise ModelError(f"{loaded.path} has no model weights")
    _load_weights(model, consensus_weights(model, state), loaded.path)
    card = CardInfo.from_state(state, config.swarm.run_id, loaded.path.name)
    training = {"batch_size": config.training.batch_size, "seed": config.training.seed}
    return LoadedModel(model, config.task, training, fingerprint, shape, card, str(loaded.path),
                       cache_dir=config.state_dir() / "data-cache")


def from_export(directory: Path, *, trust_task_code: bool = False, own_entrypoint: str | None = None,
                max_params: int = DEFAULT_MAX_PARAMS) -> LoadedModel:
    """The model of an export directory written by :func:`p2ptrain.model.export.write_export`.

    Its task code runs only with ``trust_task_code``, or when it is ``own_entrypoint`` (the node's own
    config's); a built-in model is built only within ``max_params``."""
    settings = read_export_config(directory)
    hf_model = settings.task.entrypoint is None and settings.task.kind == "hf_causal_lm"
    if hf_model:  # the export holds the model's own config, weights and tokenizer
        settings = replace(settings, task=settings.task.model_copy(
            update={"model_path": str(directory), "tokenizer": str(directory)}))
    check_model_config(settings.task, str(directory / CONFIG_FILE), trust_task_code=trust_task_code,
                       own_entrypoint=own_entrypoint, max_params=max_params)
    model, shape = build_model(settings.task, settings.training)
    fingerprint = model_fingerprint(model, shape)
    if settings.fingerprint != fingerprint:
        raise ModelError(f"{directory} holds model {settings.fingerprint} but its settings build {fingerprint}")
    weights = directory / MODEL_FILE
    if not weights.is_file():
        raise ModelError(f"{directory} has no {MODEL_FILE}")
    try:
        if not hf_model:  # (a Hugging Face model was built with its weights)
            _load_export_weights(model, weights)
    except Exception as exc:  # safetensors raises several types for a damaged file
        raise ModelError(f"{weights} does not load ({type(exc).__name__}: {_line(exc)})") from None
    training = {"batch_size": settings.training.batch_size, "seed": settings.training.seed}
    return LoadedModel(model, settings.task, training, fingerprint, shape, settings.card, str(directory))


def _load_export_weights(model: torch.nn.Module, weights: Path) -> None:
    """The export's weights into ``model``: p2ptrain's names, or GPT-2's for a ByteLM exported as GPT-2."""
    from safetensors.torch import load_file

    state = load_file(str(weights))
    if isinstance(model, bytelm.ByteLM) and is_gpt2_state(state):
        state = gpt2_to_bytelm(state)
    model.load_state_dict(state, strict=True)


@dataclass(frozen=True)
class ExportSettings:
    """What an export's config.json says, checked: the model is rebuilt from it, so nothing is trusted unread."""

    task: TaskSection
    training: TrainingSection
    fingerprint: str
    card: CardInfo


class _Sections(BaseModel):
    task: TaskSection
    training: TrainingSection


def read_export_config(directory: Path) -> ExportSettings:
    """config.json of ``directory``, every field checked; a :class:`ModelError` naming the file and the
    dotted field otherwise (a hand-edited or damaged file must not end in a traceback)."""
    path = directory / CONFIG_FILE
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ModelError(f"{directory} is not a p2ptrain export (no {CONFIG_FILE})") from None
    except OSError as exc:
        raise ModelError(f"{path} is not readable ({exc.strerror or _line(exc)})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelError(f"{path} is larger than {MAX_CONFIG_BYTES:,} bytes: not an export's config")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ModelError(f"{path} is not readable JSON ({_line(exc)})") from None
    if not isinstance(config, dict) or config.get("format") != EXPORT_FORMAT:
        raise ModelError(f"{directory} is not a p2ptrain export ({CONFIG_FILE} has no format {EXPORT_FORMAT!r})")
    training = config.get("training")
    if isinstance(training, dict):  # the export keeps what eval needs; other keys are not ours to judge
        training = {key: training[key] for key in EXPORT_TRAINING_KEYS if key in training}
    try:
        sections = _Sections.model_validate({key: value for key, value in
                                             (("task", config.get("task")), ("training", training))
                                             if value is not None})
    except ValidationError as exc:
        raise ModelError(describe_invalid(exc, printable(str(path)))) from None
    fingerprint = config.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise ModelError(f"{path}: fingerprint: {'required' if fingerprint is None else 'must be text'}")
    run = config.get("run", {})
    if not isinstance(run, dict):
        raise ModelError(f"{path}: run: must be an object, got {type(run).__name__}")
    try:
        card = CardInfo.from_run(run)
    except ValueError as exc:
        raise ModelError(f"{path}: {exc}") from None
    return ExportSettings(sections.task, sections.training, fingerprint, card)


def resolve(model_arg: Path, config_path: Path | None, say: Say, *, trust_task_code: bool = False,
            max_params: int = DEFAULT_MAX_PARAMS) -> LoadedModel:
    """MODEL as the user gave it: an export dir, a node config (.toml), or a checkpoint file (+ -c).

    An export's task code runs only with ``trust_task_code`` or when the node config given with -c names
    the same entrypoint; a node config's own always does (it is the user's)."""
    if not model_arg.exists():
        raise ModelError(f"{model_arg} does not exist")
    if model_arg.is_dir():
        own = load_config(config_path).task.entrypoint if config_path is not None else None
        return from_export(model_arg, trust_task_code=trust_task_code, own_entrypoint=own, max_params=max_params)
    if model_arg.suffix == ".toml":
        return from_checkpoint(load_config(model_arg), None, say, max_params=max_params)
    return from_checkpoint(load_config(config_path), model_arg, say, max_params=max_params)


def consensus_weights(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The swarm's model in a node's checkpoint: in DiLoCo mode the outer parameters, the model the
    swarm agreed on at its last round (the checkpoint's ``model`` adds this node's own progress in
    the round under way); in gradient mode the model itself, which the swarm averages every epoch."""
    weights = dict(state.get("model") or {})
    optimizer = state.get("optimizer")
    outer = optimizer.get("outer_params") if isinstance(optimizer, dict) else None
    names = [name for name, param in model.named_parameters() if param.requires_grad]
    if isinstance(outer, list) and len(outer) == len(names) and all(
            torch.is_tensor(value) and torch.is_tensor(weights.get(name)) and value.shape == weights[name].shape
            for name, value in zip(names, outer, strict=True)):
        weights.update((name, value.to(weights[name].dtype)) for name, value in zip(names, outer, strict=True))
    return weights


def _load_weights(model: torch.nn.Module, weights: dict[str, Any], where: Path) -> None:
    try:
        model.load_state_dict(weights, strict=True)
    except (RuntimeError, TypeError) as exc:
        raise ModelError(f"{where}: the weights do not fit the model ({_line(exc)})") from None


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
