"""An example user task: a small MLP learning a fixed random nonlinear function.

Point a node at it with ``task.entrypoint = "user_task:build"`` (see ``user-task.toml``) and make
this folder importable, e.g. ``PYTHONPATH=configs/examples p2ptrain run -c configs/examples/user-task.toml``.

The interface, in short (``p2ptrain.tasks.base`` has the full story):

``build(context: TaskContext) -> Task`` is called once at start-up.  ``context`` holds

* ``context.task``       the whole ``[task]`` config section,
* ``context.options``    ``task.options`` (free-form, here ``hidden``, ``inputs`` and ``noise``),
* ``context.batch_size`` samples per micro-batch (``training.batch_size``),
* ``context.seed``       the model seed, the same on every node (``training.seed``),
* ``context.peer_seed``  this node's own seed, for sampling its slice of the data.

It returns a ``Task(model, loss_fn, train_batches, validation_batches, shape_config)``:

* ``model``               a ``torch.nn.Module`` initialised only from ``context.seed``;
* ``loss_fn(model, batch)`` a scalar loss tensor;
* ``train_batches``       ``.next()`` / ``.state_dict()`` / ``.load_state_dict()``; the state is
                          saved in checkpoints so a restart continues at the same batch;
* ``validation_batches()`` the same bounded batches on every node, every call;
* ``shape_config``        JSON-serialisable dict of whatever shapes the model (fingerprinted).

Raise ``p2ptrain.config.ConfigError("task.options.<key>: ...")`` for bad options: the node then
prints that one line and exits with code 78.
"""

from __future__ import annotations

import torch
from torch import nn

from p2ptrain.config import ConfigError
from p2ptrain.tasks import IndexedStream, Task, TaskContext, stable_seed

VALIDATION_BATCHES = 4


def _option(context: TaskContext, key: str, default: float, kind: type) -> float:
    value = context.options.get(key, default)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or value < 0 or (kind is int and value < 1):
        raise ConfigError(f"task.options.{key}: must be a positive {kind.__name__}, got {value!r}")
    return kind(value)


def build(context: TaskContext) -> Task:
    inputs = int(_option(context, "inputs", 8, int))
    hidden = int(_option(context, "hidden", 32, int))
    noise = _option(context, "noise", 0.01, float)

    # The target function is part of the task, not of the model: seed it with a fixed constant
    # so every node learns the same thing.
    target_gen = torch.Generator().manual_seed(1234)
    target_w = torch.randn(inputs, 1, generator=target_gen)

    def make_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(context.batch_size, inputs, generator=gen)
        y = torch.sin(x @ target_w) + noise * torch.randn(context.batch_size, 1, generator=gen)
        return x, y

    # Build the model without touching the global RNG, then initialise from the shared seed.
    with torch.random.fork_rng(devices=[]):
        model = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    init_gen = torch.Generator().manual_seed(context.seed)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3, generator=init_gen)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    # Training batch i of this node depends only on (peer_seed, i): resumable and per-node.
    train = IndexedStream(lambda i: make_batch(stable_seed("train", context.peer_seed, i)))
    validation = [make_batch(stable_seed("validation", k)) for k in range(VALIDATION_BATCHES)]
    return Task(
        model=model,
        loss_fn=loss_fn,
        train_batches=train,
        validation_batches=lambda: iter(validation),
        shape_config={"task": "user_task.mlp", "inputs": inputs, "hidden": hidden},
    )
