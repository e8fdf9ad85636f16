"""What a model config may make this process do before anything is built: which code runs, how much
memory the model takes.

A model directory is data: its ``config.json`` (and a run's manifest, for ``p2ptrain fetch``) names
the task and its shape, and whoever wrote it is not necessarily the user.  So, before anything is
imported or allocated:

- only the built-in model classes are built from such a config; a user task's ``entrypoint`` (a
  module imported and called) runs only when the user trusts it: ``--trust-task-code`` (as Hugging
  Face's ``trust_remote_code``), or it is the entrypoint of the node's own config;
- the parameter count a built-in config implies is computed and bounded (``--max-params``): a config
  asking for ``d_model`` 16384 x 1024 layers (about 12 TiB) is refused in one line, not allocated.

A refusal is :class:`ModelRefused`, exit 65 (``os.EX_DATAERR``).  Standard library at import (the
CLI's parser reads the default from here before torch is loaded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection

#: Default ``--max-params``: far above any model this project ships (the default bytelm has about 0.4
#: million parameters), about 8 GB of float32.
DEFAULT_MAX_PARAMS = 2_000_000_000


class ModelRefused(Exception):
    """A model config asks for code the user did not trust, or more parameters than allowed; one line."""


def check_model_config(task: TaskSection, where: str, *, trust_task_code: bool = False,
                       own_entrypoint: str | None = None, max_params: int = DEFAULT_MAX_PARAMS) -> None:
    """Raise :class:`ModelRefused` unless the model ``task`` (read from ``where``) may be built here.

    ``own_entrypoint``: the entrypoint of the node's own config (its code is the user's own).  A trusted
    user task's size is its code's business: it is only known once that code has run.
    """
    if task.entrypoint is not None:
        check_task_code(task, where, trust_task_code=trust_task_code, own_entrypoint=own_entrypoint)
        return
    if task.kind == "hf_causal_lm":
        from p2ptrain.tasks import hf  # transformers: only for a Hugging Face model

        try:
            count = hf.parameter_count(task)
        except hf.ModelDirRefused as exc:
            raise ModelRefused(f"{where}: {exc}") from None
    else:
        from p2ptrain.tasks.bytelm import parameter_count  # torch: only once a model is to be checked

        count = parameter_count(task.seq_len, task.d_model, task.n_layers)
    if count > max_params:
        raise ModelRefused(f"{where} asks for a model of {count:,} parameters ({_size(count * 4)} of float32), "
                           f"over --max-params {max_params:,}; nothing was built")


def check_task_code(task: TaskSection, where: str, *, trust_task_code: bool = False,
                    own_entrypoint: str | None = None) -> None:
    """Raise :class:`ModelRefused` when ``task`` (read from ``where``) names task code the user did not
    trust: not ``own_entrypoint`` (the node's own config's) and no ``--trust-task-code``."""
    if task.entrypoint is not None and not trust_task_code and task.entrypoint != own_entrypoint:
        raise ModelRefused(f"{where} names task code {task.entrypoint!r} (task.entrypoint); a model file is "
                           "data, so its code is not run: pass --trust-task-code if you trust it")


def _size(nbytes: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:,} bytes"
