"""The task interface: what a training run needs from a model, its data and its loss.

A :class:`Task` is everything the trainer touches that depends on *what* is trained; the
trainer, optimizer and swarm code never look inside a model or a batch.  The built-in
``bytelm`` task and user tasks (``task.entrypoint = "package.module:function"``) both return
one; a user entrypoint is called with a :class:`TaskContext`.

Rules a task must follow so a swarm of nodes can train it together:

* ``model`` is initialised deterministically from ``TaskContext.seed`` (the same on every
  node), without touching torch's global RNG.
* ``train_batches`` is this node's own slice of the data, seeded from
  ``TaskContext.peer_seed``; its ``state_dict()`` is the data position saved in checkpoints,
  and ``load_state_dict()`` resumes exactly there (no batch replayed or skipped).
* ``validation_batches()`` yields the same bounded, fixed batches on every node and on every
  call, so validation losses of different nodes can be compared.
* ``shape_config`` is a JSON-serialisable dict of whatever shapes the model; it goes into the
  model fingerprint that keeps incompatible nodes apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection

Batch = Any
"""Whatever ``loss_fn`` accepts: a tensor, a tuple of tensors, a dict... The trainer passes it through."""

LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor]
"""``loss_fn(model, batch)`` returns a scalar loss tensor (mean over the batch) to backpropagate."""


@runtime_checkable
class BatchStream(Protocol):
    """An endless, resumable stream of training batches."""

    def next(self) -> Batch:
        """The next micro-batch; never ends (wraps into a new epoch over the data)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The current position (plain ints/strings, so it fits a ``weights_only`` checkpoint)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position returned by :meth:`state_dict`; ``{}`` means the very start."""
        ...


@dataclass(frozen=True)
class SampleRequest:
    """What ``p2ptrain sample`` asks of a task: ``tokens`` more tokens after ``prompt``.

    ``temperature`` 0 means greedy; ``top_k`` 0 means no cut; the same ``seed`` gives the same text.
    """

    prompt: str
    tokens: int
    temperature: float = 1.0
    top_k: int = 0
    seed: int = 0


SampleFn = Callable[[torch.nn.Module, SampleRequest], str]
"""``sample(model, request)`` returns the generated text (prompt excluded)."""

EvaluateFn = Callable[[torch.nn.Module, "str | None"], Mapping[str, float]]
"""``evaluate(model, data_path)`` returns named metrics on the held-out split (``data_path`` None)
or on the given data; ``"loss"`` should be among them."""


@dataclass
class Task:
    """Model, data and loss of one training run.

    ``sample`` and ``evaluate`` are optional hooks for ``p2ptrain sample`` / ``p2ptrain eval``;
    the built-in ``bytelm`` task has both.
    """

    model: torch.nn.Module
    loss_fn: LossFn
    train_batches: BatchStream
    validation_batches: Callable[[], Iterable[Batch]]
    shape_config: dict[str, Any]
    sample: SampleFn | None = None
    evaluate: EvaluateFn | None = None


@dataclass(frozen=True)
class TaskContext:
    """What a task builder gets (the argument of a user entrypoint).

    ``task`` is the whole ``[task]`` section (``task.data_path``, ``task.seq_len``... are there
    for tasks that want them); ``options`` is ``task.options``; ``batch_size`` is the micro-batch
    size every ``train_batches.next()`` must return; ``seed`` seeds the model initialisation and
    is the same on every node; ``peer_seed`` is this node's own stable seed for sampling its
    slice of the training data.  ``peer_id`` is this node's peer ID and ``live_peers()`` the IDs
    of the peers training now (this one included); a data stream that shares shards out among
    peers calls it at shard boundaries.  ``cache_dir`` is where downloaded data may be kept
    (``None``: the task decides).
    """

    task: TaskSection
    batch_size: int
    seed: int
    peer_seed: int
    options: dict[str, Any] = field(default_factory=dict)
    peer_id: str = ""
    live_peers: Callable[[], Sequence[str]] | None = None
    cache_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.peer_id:  # a node alone (tests, tools): a stable name from its seed
            object.__setattr__(self, "peer_id", f"peer-{self.peer_seed}")
        if self.live_peers is None:
            me = self.peer_id
            object.__setattr__(self, "live_peers", lambda: (me,))


@runtime_checkable
class CoverageSource(Protocol):
    """A stream that can say how much of the data it has read (``ShardStream`` does)."""

    def coverage(self) -> Any: ...


class IndexedStream:
    """A :class:`BatchStream` over ``make_batch(index)``: the position is just the index.

    Handy for user tasks whose batch ``i`` can be generated on demand (e.g. from a generator
    seeded with ``(peer_seed, i)``); restoring the index resumes the stream exactly.
    """

    def __init__(self, make_batch: Callable[[int], Batch]) -> None:
        self._make_batch = make_batch
        self.index = 0

    def next(self) -> Batch:
        batch = self._make_batch(self.index)
        self.index += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        index = state.get("index", 0)
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"bad stream position {state!r}: expected {{'index': <int >= 0>}}")
        self.index = index
