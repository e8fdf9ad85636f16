"""How a run manifest and a node's own config combine, and how the owner edits a manifest's settings.

The manifest decides everything run-wide (the run-wide ``[task]`` and ``[training]`` fields, the
run id); the node's config decides local matters (state dir, threads, API, volunteer controls,
network, and the machine's own ``[task]`` fields: memory for text, the download cache and its
limits, and where this machine keeps the run's data when that is a local path). A local value
that differs from the manifest is a contradiction only when the node's config sets it: a node
config that never mentions ``training.lr`` simply follows the run, one that says ``lr = 0.001``
(even the default) while the run says 0.0003 is told so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from p2ptrain.config.checks import missing_data_path
from p2ptrain.config.schema import ConfigError, NodeConfig, SwarmSection, TaskSection, TrainingSection
from p2ptrain.config.tomlfile import parse_literal
from p2ptrain.config.tomlwrite import toml_table
from p2ptrain.run.manifest import (
    LOCAL_DATA_KEY,
    LOCAL_TASK,
    LOCAL_TRAINING,
    RUN_WIDE_TASK,
    RUN_WIDE_TRAINING,
    Manifest,
    is_data_url,
    non_finite,
)
from p2ptrain.runref import RunRef

__all__ = ["LOCAL_TASK", "apply_settings", "local_only", "merge_manifest", "owner_node_config", "run_wide"]
_DEFAULT_RUN_ID = SwarmSection.model_fields["run_id"].default


def _where(manifest: Manifest) -> str:
    return f"run {manifest.ref} (manifest version {manifest.version})"


def _contradiction(field: str, local: Any, wanted: Any, manifest: Manifest) -> ConfigError:
    return ConfigError(f"{field}: this node's config says {local!r} but {_where(manifest)} says {wanted!r}; "
                       f"remove {field} from the node config")


def _check_section(local: BaseModel, wanted: dict[str, Any], section: str, manifest: Manifest,
                   skip: Iterable[str] = ()) -> None:
    """Every field the node's config sets (``model_fields_set``: the file's keys and the environment's)
    must agree with the manifest, the default value included."""
    have = local.model_dump(mode="json")
    for name, value in wanted.items():
        if name in skip or name not in local.model_fields_set:
            continue
        if have[name] != value:
            raise _contradiction(f"{section}.{name}", have[name], value, manifest)


def _data_path(local: TaskSection, manifest: Manifest) -> str | None:
    """Where this node reads the run's data: the manifest's URL, or this machine's own path."""
    wanted = manifest.task.get("data_path")
    if wanted is not None:
        if "data_path" in local.model_fields_set and local.data_path != wanted:
            raise _contradiction("task.data_path", local.data_path, wanted, manifest)
        return str(wanted)
    if manifest.local_data and local.data_path is None:
        raise ConfigError(f"task.data_path: {_where(manifest)} trains on data each node keeps itself "
                          f"(task.{LOCAL_DATA_KEY} = true): set task.data_path in this node's config to where "
                          "this machine has its copy")
    return local.data_path


def merge_manifest(local: NodeConfig, manifest: Manifest) -> NodeConfig:
    """``local`` with the (already verified) manifest's run-wide settings applied.

    ``local`` must be the node's own config as loaded (what it sets is what it says), never a config
    merged before. Raises :class:`ConfigError`, one line naming the field and both values, when the
    node's config sets a run-wide value the manifest contradicts, or when the run's data is each
    node's own and this one names none (or names one that is not there).
    """
    ref = manifest.ref
    if local.swarm.run is not None and local.swarm.run != str(ref):
        raise _contradiction("swarm.run", local.swarm.run, str(ref), manifest)
    if "run_id" in local.swarm.model_fields_set and local.swarm.run_id != ref.run_id:
        raise _contradiction("swarm.run_id", local.swarm.run_id, ref.run_id, manifest)
    task_wanted = {name: manifest.task.get(name) for name in RUN_WIDE_TASK}  # left out: None
    _check_section(local.task, task_wanted, "task", manifest, skip=("data_path",))
    _check_section(local.training, manifest.training, "training", manifest)
    data_path = _data_path(local.task, manifest)

    data = local.model_dump()
    data["swarm"].update(run_id=ref.run_id, run=str(ref))
    data["task"] = {**task_wanted, **{name: data["task"][name] for name in LOCAL_TASK}, "data_path": data_path}
    data["training"] = {**data["training"], **manifest.training}
    try:
        merged = NodeConfig.model_validate(data)
    except ValidationError as error:  # a verified manifest validated already; this is a guard
        raise ConfigError(f"run {ref}: manifest settings do not validate: {error.errors()[0]['msg']}") from None
    # The node's own data was checked when its config was loaded; a URL cannot be checked here.
    problem = missing_data_path(data_path) if data_path is not None else None
    if problem:
        raise ConfigError(f"task.data_path: {problem} (the data of {_where(manifest)})")
    return merged


def apply_settings(manifest: Manifest, assignments: Iterable[str]) -> Manifest:
    """``manifest`` with ``section.field=value`` assignments applied to ``task``/``training`` (unsigned).

    ``task.data_path`` takes an http(s) URL (the run's data for every node); ``task.local_data=true``
    says each node brings its own copy instead (and drops the URL). Each problem is one
    :class:`ConfigError` line naming the assignment.
    """
    task, training = dict(manifest.task), dict(manifest.training)
    local_data = manifest.local_data
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        section, _, name = key.strip().partition(".")
        where = f"--set {key.strip()}"
        if not sep or not name:
            raise ConfigError(f"--set {assignment!r}: expected SECTION.FIELD=VALUE, e.g. training.lr=3e-4")
        value = parse_literal(raw.strip())
        if section == "training":
            if name in TrainingSection.model_fields and name not in RUN_WIDE_TRAINING:
                raise ConfigError(f"{where}: a local setting (each node's own config), not part of the run manifest")
            if name not in RUN_WIDE_TRAINING:
                raise ConfigError(f"{where}: unknown key")
            training[name] = value
        elif section == "task":
            if name == LOCAL_DATA_KEY:
                if type(value) is not bool:
                    raise ConfigError(f"{where}: expected true or false")
                local_data = value
                if value:
                    task["data_path"] = None
            elif name in LOCAL_TASK:
                raise ConfigError(f"{where}: a local setting (each node's own config), not part of the run manifest")
            elif name not in TaskSection.model_fields:
                raise ConfigError(f"{where}: unknown key")
            elif name == "data_path" and not (isinstance(value, str) and is_data_url(value)):
                raise ConfigError(f"{where}: the manifest names the run's data by http(s):// URL only; for data "
                                  f"each node keeps locally use --set task.{LOCAL_DATA_KEY}=true")
            else:
                task[name] = value
                if name == "data_path":
                    local_data = False
        else:
            raise ConfigError(f"{where}: only task.* and training.* settings live in the manifest")
    try:
        task_section, training_section = TaskSection.model_validate(task), TrainingSection.model_validate(training)
    except ValidationError as error:
        first = error.errors()[0]
        section = "task" if error.title == "TaskSection" else "training"
        field = ".".join([section, *(str(p) for p in first["loc"])])
        raise ConfigError(f"--set {field}: {first['msg'].removeprefix('Value error, ')}") from None
    problem = non_finite(task_section.model_dump(), "task") or non_finite(training_section.model_dump(), "training")
    if problem:  # checked before JSON conversion turns nan and inf into nothing
        raise ConfigError(f"--set {problem}")
    task_all, training_all = task_section.model_dump(mode="json"), training_section.model_dump(mode="json")
    return dataclasses.replace(manifest, task={name: task_all[name] for name in RUN_WIDE_TASK},
                               training={name: training_all[name] for name in RUN_WIDE_TRAINING},
                               local_data=local_data)


def local_data_path(overrides: Mapping[str, Mapping[str, Any]]) -> Any:
    """The overrides' data path when it is a local one (each node's own), else None."""
    data_path = overrides.get("task", {}).get("data_path")
    return data_path if data_path is not None and not is_data_url(str(data_path)) else None


def run_wide(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The manifest's part of per-section overrides: [task] (less local fields and a local data path)
    and run-wide [training]."""
    local_data = local_data_path(overrides) is not None
    return {"task": {k: v for k, v in overrides.get("task", {}).items()
                     if k not in LOCAL_TASK and not (k == "data_path" and local_data)},
            "training": {k: v for k, v in overrides.get("training", {}).items() if k not in LOCAL_TRAINING}}


def local_only(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A node's part of per-section overrides: everything but the manifest's."""
    wide = run_wide(overrides)
    return {section: {k: v for k, v in values.items() if k not in wide.get(section, {})}
            for section, values in overrides.items()}


#: [swarm] keys the run decides (run_id), or that name another run: never copied into an owner's node config.
_RUN_SWARM_KEYS = ("run_id", "run", "manifest", "invite")


def owner_node_config(source: Mapping[str, Any], ref: RunRef, manifest_path: Path, origin: str) -> str:
    """The config of the run's first node (its owner's): ``source``'s local matters, the run by reference and
    its manifest file.

    The run's own settings stay out: the manifest decides them, and a node config that repeated them
    would contradict the next ``p2ptrain run update`` of any of them (exit 78, never restarted).
    ``source`` is a node config file's parsed TOML (not the environment's overrides), ``origin`` its name.
    """
    local = local_only({name: dict(values) for name, values in source.items() if isinstance(values, Mapping)})
    swarm = {key: value for key, value in local.pop("swarm", {}).items() if key not in _RUN_SWARM_KEYS}
    sections = {"swarm": {"run": str(ref), "manifest": str(manifest_path.resolve()), **swarm},
                **{name: values for name, values in local.items() if values}}
    lines = [f"# The node config of run {ref}'s first node, written by p2ptrain run init from {origin}.",
             "# Local matters only: the run's [task] and [training] settings come from its signed manifest",
             "# (swarm.manifest), and change with: p2ptrain run update " + str(manifest_path) + " --set ...",
             "# Start the node with: p2ptrain run --config <this file>", ""]
    for name, values in sections.items():
        lines += [*toml_table(name, values, sort_keys=False), ""]
    return "\n".join(lines)
