"""What a SIGHUP reload may apply at run time, and what needs a restart: pure functions of two configs."""

from __future__ import annotations

from typing import Any

from p2ptrain.config.schema import NodeConfig

#: Dotted fields (or whole sections, ending in ".") the node applies without restarting.
RELOADABLE = ("node.log_level", "swarm.initial_peers", "training.threads", "training.max_epochs", "volunteer.")


def _is_reloadable(name: str) -> bool:
    return any(name == entry or (entry.endswith(".") and name.startswith(entry)) for entry in RELOADABLE)


def _changed_fields(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        names: list[str] = []
        for key in sorted(old.keys() | new.keys()):
            names += _changed_fields(old.get(key), new.get(key), f"{prefix}{key}.")
        return names
    return [prefix.rstrip(".")] if old != new else []


def reloadable_changes(old: NodeConfig, new: NodeConfig) -> tuple[list[str], list[str]]:
    """Dotted names of changed fields: (applied on reload, needing a restart), both sorted.

    ``task.options`` is free-form and compared as one value.
    """
    old_data, new_data = old.model_dump(mode="json"), new.model_dump(mode="json")
    for data in (old_data, new_data):
        data["task"]["options"] = repr(data["task"]["options"])  # opaque: don't descend into user dicts
    changed = _changed_fields(old_data, new_data, "")
    applied = [name for name in changed if _is_reloadable(name)]
    return applied, [name for name in changed if not _is_reloadable(name)]


def merge_reloadable(old: NodeConfig, new: NodeConfig) -> NodeConfig:
    """``old`` with every reloadable field (or section) taken from ``new``: the config a node runs
    with after a SIGHUP.  Fields that need a restart keep their running values."""
    sections: dict[str, Any] = {}
    for entry in RELOADABLE:
        section, _, key = entry.partition(".")
        if not key:
            sections[section] = getattr(new, section)
            continue
        current = sections.get(section, getattr(old, section))
        sections[section] = current.model_copy(update={key: getattr(getattr(new, section), key)})
    return old.model_copy(update=sections)
