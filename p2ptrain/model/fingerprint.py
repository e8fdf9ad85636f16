"""The model fingerprint: a short hash of what makes two nodes' models averageable together.

Two nodes may only average when every tensor has the same name, shape and dtype and the
model was shaped by the same config; the fingerprint condenses exactly that (not the values)
into 16 hex characters that are stable across processes, machines and Python versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from p2ptrain.config.schema import NodeConfig
from p2ptrain.errors import ConfigError

FINGERPRINT_HEX_CHARS = 16


def canonical_json(value: Mapping[str, Any]) -> str:
    """Key-sorted, whitespace-free JSON; non-JSON values (paths...) fall back to ``str``."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def model_fingerprint(model: torch.nn.Module, shape_config: Mapping[str, Any]) -> str:
    """SHA-256 over sorted ``(name, shape, dtype)`` of the model's state and the shape config.

    The state dict (parameters and persistent buffers) is used rather than parameters alone,
    because buffers are averaged and checkpointed too.
    """
    entries: list[list[object]] = []
    for name, value in model.state_dict().items():
        if isinstance(value, torch.Tensor):
            entries.append([name, list(value.shape), str(value.dtype).removeprefix("torch.")])
        else:  # extra state from get_extra_state(): only its type is structural
            entries.append([name, None, type(value).__name__])
    entries.sort()
    digest = hashlib.sha256()
    digest.update(json.dumps(entries, separators=(",", ":")).encode())
    digest.update(b"\x00")
    digest.update(canonical_json(shape_config).encode())
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def choose_fingerprint(choice: str, config: NodeConfig) -> str | None:
    """What ``--fingerprint`` asks a new manifest to record: none, a given hash, or the model's own (auto)."""
    if choice == "none":
        return None
    if choice != "auto":
        if len(choice) != 16 or any(c not in "0123456789abcdef" for c in choice):
            raise ConfigError(f"--fingerprint {choice!r}: expected 16 lowercase hex characters, auto or none")
        return choice
    from p2ptrain.tasks.loader import build_task  # builds the model: only when asked to

    try:
        task = build_task(config.task, config.training, 0)
    except ConfigError as error:
        raise ConfigError(f"{error} (building the model to record its fingerprint; --fingerprint none skips it)") \
            from None
    return model_fingerprint(task.model, task.shape_config)
