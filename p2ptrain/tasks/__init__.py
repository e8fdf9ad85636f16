"""Training tasks: the model, data and loss one run trains (built-in ``bytelm`` or a user task)."""

from __future__ import annotations

from p2ptrain.tasks.base import (
    Batch,
    BatchStream,
    CoverageSource,
    IndexedStream,
    LossFn,
    SampleRequest,
    Task,
    TaskContext,
)
from p2ptrain.tasks.corpus import stable_seed
from p2ptrain.tasks.loader import build_task

__all__ = [
    "Batch", "BatchStream", "CoverageSource", "IndexedStream", "LossFn", "SampleRequest", "Task", "TaskContext",
    "build_task", "stable_seed",
]
