"""How a run manifest and a node's own config combine, and how the owner edits a manifest's settings.

The manifest decides everything run-wide (``[task]`` and the run-wide ``[training]`` fields, the
run id); the node's config decides local matters (state dir, threads, API, volunteer controls,
network, and where this machine keeps the run's data, ``task.data_path``). A local value that
differs from the manifest is a contradiction only when it was changed from the default: a node
config that never mentions ``training.lr`` simply follows the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from p2ptrain.config import ConfigError, NodeConfig, SwarmSection, TaskSection, TrainingSection
from p2ptrain.manifest import RUN_WIDE_TRAINING, Manifest
from p2ptrain.tomlfile import parse_literal

#: [task] fields a node may set for itself: the run's data may live elsewhere on each machine.
LOCAL_TASK: tuple[str, ...] = ("data_path",)
_DEFAULT_RUN_ID = SwarmSection.model_fields["run_id"].default


def _contradiction(field: str, local: Any, wanted: Any, manifest: Manifest) -> ConfigError:
    return ConfigError(f"{field}: this node's config says {local!r} but run {manifest.ref} "
                       f"(manifest version {manifest.version}) says {wanted!r}; remove {field} from the node config")


def _check_section(local: BaseModel, wanted: dict[str, Any], section: str, manifest: Manifest,
                   skip: Iterable[str] = ()) -> None:
    have = local.model_dump(mode="json")
    default = type(local)().model_dump(mode="json")
    for name, value in wanted.items():
        if name in skip:
            continue
        if have[name] != default[name] and have[name] != value:
            raise _contradiction(f"{section}.{name}", have[name], value, manifest)


def merge_manifest(local: NodeConfig, manifest: Manifest) -> NodeConfig:
    """``local`` with the (already verified) manifest's run-wide settings applied.

    Raises :class:`ConfigError`, one line naming the field and both values, when the node's config
    explicitly sets a run-wide value the manifest contradicts.
    """
    ref = manifest.ref
    if local.swarm.run is not None and local.swarm.run != str(ref):
        raise _contradiction("swarm.run", local.swarm.run, str(ref), manifest)
    if local.swarm.run_id not in (_DEFAULT_RUN_ID, ref.run_id):
        raise _contradiction("swarm.run_id", local.swarm.run_id, ref.run_id, manifest)
    task_wanted = dict(manifest.task)
    for name in TaskSection.model_fields:
        task_wanted.setdefault(name, None)  # a field the manifest leaves out is None there
    _check_section(local.task, task_wanted, "task", manifest, skip=LOCAL_TASK)
    _check_section(local.training, manifest.training, "training", manifest)

    data = local.model_dump()
    data["swarm"].update(run_id=ref.run_id, run=str(ref))
    task = {**task_wanted}
    if local.task.data_path is not None:
        task["data_path"] = local.task.data_path
    data["task"] = task
    data["training"] = {**data["training"], **manifest.training}
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as error:  # a verified manifest validated already; this is a guard
        raise ConfigError(f"run {ref}: manifest settings do not validate: {error.errors()[0]['msg']}") from None


def apply_settings(manifest: Manifest, assignments: Iterable[str]) -> Manifest:
    """``manifest`` with ``section.field=value`` assignments applied to ``task``/``training`` (unsigned).

    Each problem is one :class:`ConfigError` line naming the assignment.
    """
    task, training = dict(manifest.task), dict(manifest.training)
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        section, _, name = key.strip().partition(".")
        where = f"--set {key.strip()}"
        if not sep or not name:
            raise ConfigError(f"--set {assignment!r}: expected SECTION.FIELD=VALUE, e.g. training.lr=3e-4")
        if section == "training":
            if name in TrainingSection.model_fields and name not in RUN_WIDE_TRAINING:
                raise ConfigError(f"{where}: a local setting (each node's own config), not part of the run manifest")
            if name not in RUN_WIDE_TRAINING:
                raise ConfigError(f"{where}: unknown key")
            training[name] = parse_literal(raw.strip())
        elif section == "task":
            if name not in TaskSection.model_fields:
                raise ConfigError(f"{where}: unknown key")
            task[name] = parse_literal(raw.strip())
        else:
            raise ConfigError(f"{where}: only task.* and training.* settings live in the manifest")
    try:
        task_values = TaskSection.model_validate(task).model_dump(mode="json")
        training_all = TrainingSection.model_validate(training).model_dump(mode="json")
    except ValidationError as error:
        first = error.errors()[0]
        section = "task" if error.title == "TaskSection" else "training"
        field = ".".join([section, *(str(p) for p in first["loc"])])
        raise ConfigError(f"--set {field}: {first['msg'].removeprefix('Value error, ')}") from None
    return dataclasses.replace(manifest, task=task_values,
                               training={name: training_all[name] for name in RUN_WIDE_TRAINING})
