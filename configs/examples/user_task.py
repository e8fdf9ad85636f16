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

Two optional hooks make the trained model usable from the shell: ``sample(model, request)`` for
``p2ptrain sample`` (here: the model's output for the inputs given as ``--prompt "0.1,0.2,..."``)
and ``evaluate(model, data_path)`` for ``p2ptrain eval`` (named metrics, ``"loss"`` among them).
An exception in a hook is shown as one line.  An export of a user task is loaded with this code, so
``sample`` and ``eval`` run it only with ``--trust-task-code`` or with the node config that names it
(``-c node.toml``): a model directory from someone else is data, not code to run.

Raise ``p2ptrain.config.schema.ConfigError("task.options.<key>: ...")`` for bad options: the node then
prints that one line and exits with code 78.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from p2ptrain.config.schema import ConfigError
from p2ptrain.tasks import IndexedStream, SampleRequest, Task, TaskContext, stable_seed

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
    @torch.no_grad()
    def evaluate(model: nn.Module, data_path: str | None) -> dict[str, float]:
        if data_path is not None:
            raise ValueError("this task scores its own validation batches; --data is not supported")
        mse = sum(float(loss_fn(model, batch)) for batch in validation) / len(validation)
        return {"loss": mse, "rmse": math.sqrt(mse)}

    @torch.no_grad()
    def sample(model: nn.Module, request: SampleRequest) -> str:
        try:
            x = torch.tensor([[float(v) for v in request.prompt.split(",")]])
        except ValueError:
            raise ValueError(f"--prompt must be {inputs} comma-separated numbers, got {request.prompt!r}") from None
        if x.shape[1] != inputs:
            raise ValueError(f"--prompt must be {inputs} comma-separated numbers, got {x.shape[1]}")
        return f" -> {float(model(x)):.4f} (target {float(torch.sin(x @ target_w)):.4f})"

    return Task(
        model=model,
        loss_fn=loss_fn,
        train_batches=train,
        validation_batches=lambda: iter(validation),
        shape_config={"task": "user_task.mlp", "inputs": inputs, "hidden": hidden},
        sample=sample,
        evaluate=evaluate,
    )
