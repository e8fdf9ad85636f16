"""Training tasks: the model, data and loss one run trains (built-in ``bytelm`` or a user task).

- ``base``      the task interface a run needs: model, batches, loss, sampling
- ``bytelm``    the built-in byte-level causal transformer LM
- ``hf``        the built-in ``hf_causal_lm`` task: a ``transformers`` causal LM, tokenised on the fly
- ``generate``  sampling from the byte-level LM, and its loss, bits per byte, perplexity
- ``loader``    the ``[task]`` config turned into a :class:`Task` (built-in or a user entrypoint)
- ``code_digest`` the digest of a user task's code, for the fingerprint and an owned run's manifest

User tasks import ``p2ptrain.tasks.base``; exports name ``p2ptrain.tasks.bytelm.ByteLM``: both
paths are kept stable.  May import: torch, transformers (only ``hf``, deferred), :mod:`p2ptrain.data`,
:mod:`p2ptrain.config`.
"""

from __future__ import annotations

from p2ptrain.data.corpus import stable_seed
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
from p2ptrain.tasks.loader import build_task

__all__ = [
    "Batch", "BatchStream", "CoverageSource", "IndexedStream", "LossFn", "SampleRequest", "Task", "TaskContext",
    "build_task", "stable_seed",
]
