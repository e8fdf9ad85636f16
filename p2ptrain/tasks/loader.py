"""Turn the ``[task]`` config into a :class:`Task`: the built-in ``bytelm`` or a user entrypoint.

A user entrypoint ``"package.module:function"`` must be importable (installed, or on
``PYTHONPATH``); the function is called with one :class:`TaskContext` and must return a
:class:`Task`.  Every way that can go wrong becomes one :class:`ConfigError` line naming
``task.entrypoint`` (the CLI exits 78 on it); the original exception stays chained for debug logs.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from p2ptrain.config.schema import ConfigError
from p2ptrain.tasks.base import BatchStream, Task, TaskContext
from p2ptrain.tasks.bytelm import build_bytelm
from p2ptrain.tasks.code_digest import module_of, task_code_sha256

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection, TrainingSection


def build_task(
    task_cfg: TaskSection,
    training_cfg: TrainingSection,
    peer_seed: int,
    *,
    peer_id: str = "",
    live_peers: Callable[[], Sequence[str]] | None = None,
    cache_dir: Path | None = None,
) -> Task:
    """Build this node's task; ``peer_seed`` is its stable per-node seed (see ``corpus.stable_seed``).

    ``peer_id`` and ``live_peers`` let the data be shared out among the peers training now
    (default: this node alone); ``cache_dir`` is where downloaded shards go (default
    ``task.cache_dir``, else ``<state_dir>/data-cache``).
    """
    context = TaskContext(
        task=task_cfg,
        batch_size=training_cfg.batch_size,
        seed=training_cfg.seed,
        peer_seed=peer_seed,
        options=dict(task_cfg.options),
        peer_id=peer_id,
        live_peers=live_peers,
        cache_dir=cache_dir,
    )
    if task_cfg.entrypoint is None:
        if task_cfg.kind == "hf_causal_lm":
            from p2ptrain.tasks.hf import build_hf_task  # transformers only when this task is used

            return build_hf_task(context)
        return build_bytelm(context)
    builder = resolve_entrypoint(task_cfg.entrypoint)
    try:
        task = builder(context)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"task.entrypoint: {task_cfg.entrypoint} raised {type(exc).__name__}: {exc}"
        ) from exc
    check_task(task, task_cfg.entrypoint)
    code = checked_code_digest(task_cfg)
    if code is not None:  # the fingerprint covers the task's code, not only its shapes
        task.shape_config = {**task.shape_config, "task_code_sha256": code}
    return task


def entrypoint_code_sha256(entrypoint: str) -> str | None:
    """Import ``entrypoint``'s module (a :class:`ConfigError` line if it cannot be) and digest its code."""
    resolve_entrypoint(entrypoint)
    module = module_of(entrypoint)
    return task_code_sha256(module) if module is not None else None


def checked_code_digest(task_cfg: TaskSection) -> str | None:
    """The digest of the entrypoint's code (:mod:`p2ptrain.tasks.code_digest`), importing it if need be; a
    :class:`ConfigError` when ``task.code_sha256`` (an owned run's manifest) records another."""
    code = entrypoint_code_sha256(task_cfg.entrypoint) if task_cfg.entrypoint is not None else None
    expected = task_cfg.code_sha256
    if expected is not None and code != expected:
        found = f"has sha256 {code}" if code is not None else "has no source file to check"
        raise ConfigError(f"task.code_sha256: the code of {task_cfg.entrypoint} on this machine {found}, the run's "
                          f"has {expected}: install the run's version of the task")
    return code


def resolve_entrypoint(entrypoint: str) -> Callable[[TaskContext], Any]:
    """Import ``"package.module:function"`` and return the function."""
    module_name, _, function_name = entrypoint.partition(":")
    if not module_name or not function_name:
        raise ConfigError(f"task.entrypoint: must look like 'package.module:function', got {entrypoint!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Tell "the user's module is not there" apart from "it imports something that is not there".
        if exc.name is not None and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"task.entrypoint: no module named {module_name!r} "
                "(install it or add its folder to PYTHONPATH)"
            ) from exc
        raise ConfigError(f"task.entrypoint: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"task.entrypoint: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    function = getattr(module, function_name, None)
    if function is None:
        raise ConfigError(f"task.entrypoint: module {module_name!r} has no attribute {function_name!r}")
    if not callable(function):
        raise ConfigError(f"task.entrypoint: {entrypoint} is a {type(function).__name__}, not a function")
    return function


def check_task(task: object, entrypoint: str) -> None:
    """Reject a builder result that is not a usable :class:`Task`, naming the first problem."""
    if not isinstance(task, Task):
        raise ConfigError(
            f"task.entrypoint: {entrypoint} returned {type(task).__name__}, expected p2ptrain.tasks.Task"
        )
    if not isinstance(task.model, torch.nn.Module):
        problem = "model is not a torch.nn.Module"
    elif not any(True for _ in task.model.parameters()):
        problem = "model has no parameters"
    elif not callable(task.loss_fn):
        problem = "loss_fn is not callable"
    elif not isinstance(task.train_batches, BatchStream):
        problem = "train_batches lacks next()/state_dict()/load_state_dict()"
    elif not callable(task.validation_batches):
        problem = "validation_batches is not callable"
    elif not _is_json(task.shape_config):
        problem = "shape_config is not a JSON-serialisable dict"
    elif task.sample is not None and not callable(task.sample):
        problem = "sample hook is not callable"
    elif task.evaluate is not None and not callable(task.evaluate):
        problem = "evaluate hook is not callable"
    else:
        return
    raise ConfigError(f"task.entrypoint: {entrypoint} returned a Task whose {problem}")


def _is_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return isinstance(value, dict)
