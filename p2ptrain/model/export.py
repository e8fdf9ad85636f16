"""Writing a trained model as a portable directory: model.safetensors, config.json and a model card.

The directory is complete or absent: everything is written into a temp directory beside it,
fsynced, and renamed into place; an existing export is replaced only with ``force`` (and only
if it is an export or empty, so a typo cannot wipe an unrelated folder).  The directory is also a
Hugging Face model: ``transformers``' ``AutoModelForCausalLM`` and ``AutoTokenizer`` load a ``bytelm``
export (as GPT-2, :mod:`p2ptrain.model.hfexport`) and an ``hf_causal_lm`` one; config.json carries
p2ptrain's own keys (``format``, ``task``, ``run``...) beside the model config.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file, save_model

from p2ptrain.atomicfile import fsync_path
from p2ptrain.model.hfexport import bytelm_to_gpt2, gpt2_config, write_byte_tokenizer

if TYPE_CHECKING:
    from p2ptrain.config.schema import TaskSection

EXPORT_FORMAT = "p2ptrain-export"
EXPORT_VERSION = 1
MODEL_FILE, CONFIG_FILE, CARD_FILE, TORCH_FILE = "model.safetensors", "config.json", "README.md", "model.pt"
BYTELM_CLASS = "p2ptrain.tasks.bytelm.ByteLM"


class ExportError(Exception):
    """The export could not be written; the message is one line for the user."""


#: What a model card's validation loss was measured on (``CardInfo.val_of``).
VAL_OF_EXPORT = "export"
"""The exported weights themselves (``p2ptrain export`` or ``fetch`` scored them on the held-out split)."""
VAL_OF_MODEL = "model"
"""The node's training parameters at ``val_epoch`` (gradient mode): the export's only if nothing changed since."""
VAL_OF_LOCAL = "local"
"""A DiLoCo node's local model at ``val_epoch``, while the export holds the swarm's outer parameters."""


@dataclass(frozen=True)
class CardInfo:
    """What the model card says about the run (``None``: not recorded)."""

    run_ref: str
    epoch: int | None = None
    samples: int | None = None
    val_loss: float | None = None
    contributors: int | None = None
    saved_at: float | None = None
    checkpoint: str = ""
    #: Samples this node contributed to the swarm's model (see p2ptrain.trust.credit).
    samples_contributed: int | None = None
    fetched_from: str = ""
    """The peer whose state ``p2ptrain fetch`` downloaded (empty: exported from a local checkpoint)."""
    val_epoch: int | None = None
    """The epoch ``val_loss`` was measured at (None: not recorded, a checkpoint older than the field)."""
    val_of: str = ""
    """What ``val_loss`` was measured on: ``VAL_OF_EXPORT``, ``VAL_OF_MODEL``, ``VAL_OF_LOCAL`` ("": not recorded)."""
    reported_by: int | None = None
    """Fetched: the peer records read (whose figures ``samples``, ``contributors`` and ``samples_claimed`` sum)."""
    samples_claimed: int | None = None
    """Fetched: the samples those records claim for their own peers, each clipped at the run's pace: claims,
    not vouched for.  (Fetched exports without it: ``samples`` are those claims.)"""
    vouched_by: int | None = None
    """Fetched: the peers this download joined through that have a record: whose own figures and averaging
    rounds vouch for ``samples`` and ``contributors``."""

    @classmethod
    def from_state(cls, state: Mapping[str, Any], run_id: str, checkpoint: str = "") -> CardInfo:
        """From a node checkpoint's state; every key is optional (older checkpoints lack some)."""
        contributors = state.get("contributors")
        if isinstance(contributors, list | tuple | dict | set):
            contributors = len(contributors)
        val_of = state.get("val_params")
        return cls(
            run_ref=str(state.get("run_ref") or run_id),
            epoch=_number(state.get("epoch"), int),
            samples=_number(state.get("samples_processed"), int),
            val_loss=_number(state.get("val_loss"), float),
            contributors=_number(contributors, int),
            saved_at=_number(state.get("saved_at"), float),
            checkpoint=checkpoint,
            samples_contributed=_number(state.get("samples_contributed"), int),
            val_epoch=_number(state.get("val_epoch"), int),
            val_of=val_of if val_of in (VAL_OF_MODEL, VAL_OF_LOCAL) else "",
        )

    @classmethod
    def from_run(cls, run: Mapping[str, Any]) -> CardInfo:
        """From an export's ``run`` object; ValueError naming ``run.<field>`` for a value of the wrong type."""
        values: dict[str, Any] = {"run_ref": ""}
        for name, field in cls.__dataclass_fields__.items():
            if name not in run or run[name] is None:
                continue
            value, kind = run[name], str(field.type)
            if kind == "str":
                good = isinstance(value, str)
            elif kind.startswith("int"):
                good = isinstance(value, int) and not isinstance(value, bool)
            else:  # a float: JSON writes 4.0 as 4
                good = _number(value, float) is not None
                value = float(value) if good else value
            if not good:
                raise ValueError(f"run.{name}: expected {kind.removesuffix(' | None')}, got {value!r:.40}")
            values[name] = value
        return cls(**values)


def _number(value: object, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return kind(value)


def write_export(
    model: torch.nn.Module,
    task_cfg: TaskSection,
    fingerprint: str,
    card: CardInfo,
    out_dir: Path,
    *,
    force: bool = False,
    shape_config: Mapping[str, Any] | None = None,
    training: Mapping[str, Any] | None = None,
    torch_copy: bool = False,
) -> Path:
    """Write ``model`` to ``out_dir`` atomically; raises :class:`ExportError` (nothing half-written).

    ``training`` (``batch_size``, ``seed``) lets ``p2ptrain eval`` rebuild the nodes' exact
    validation batches; ``torch_copy`` adds a plain ``torch.save`` state dict as ``model.pt``.
    """
    out_dir = Path(out_dir)
    check_target(out_dir, force)
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    except OSError as exc:
        raise ExportError(f"cannot write in {parent}: {exc.strerror or exc}") from None
    try:
        config = export_config(task_cfg, fingerprint, card, shape_config, training)
        metadata = {"format": "pt", "fingerprint": fingerprint}
        model = _on_cpu(model)  # CPU tensors whatever device trained the model: an export opens on any machine
        if task_cfg.entrypoint is not None:
            save_model(model, str(temp / MODEL_FILE), metadata=metadata)
        elif task_cfg.kind == "hf_causal_lm":
            config = _write_hf_model(model, task_cfg, temp) | config
        else:  # ByteLM as GPT-2: transformers loads it, p2ptrain maps the names back
            save_file(bytelm_to_gpt2(model.state_dict()), str(temp / MODEL_FILE), metadata=metadata)
            write_byte_tokenizer(temp)
            config = gpt2_config(config["model_args"]) | config
        _write_text(temp / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True) + "\n")
        _write_text(temp / CARD_FILE, with_metadata(render_card(config, out_dir.name), config))
        if torch_copy:
            torch.save({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}, temp / TORCH_FILE)
        for path in temp.iterdir():
            fsync_path(path)
        _swap_in(temp, out_dir)
    except OSError as exc:
        raise ExportError(f"cannot write the export {out_dir}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return out_dir


def _write_hf_model(model: torch.nn.Module, task_cfg: TaskSection, temp: Path) -> dict[str, Any]:
    """A ``transformers`` model's own files (config, safetensors weights, tokenizer); its config as a dict."""
    from p2ptrain.tasks import hf

    save_pretrained = getattr(model, "save_pretrained")  # noqa: B009 (a transformers model, typed as Module)
    save_pretrained(str(temp), safe_serialization=True)
    hf.load_tokenizer(task_cfg).save_pretrained(str(temp))
    return dict(json.loads((temp / CONFIG_FILE).read_text(encoding="utf-8")))


def with_metadata(card: str, config: Mapping[str, Any]) -> str:
    """The card as the hub expects it: YAML metadata first (huggingface_hub's ModelCard where installed)."""
    tags = ["p2ptrain", "decentralized-training", "bytelm" if config.get("model_class") == BYTELM_CLASS
            else "causal-lm"]
    try:
        from huggingface_hub import ModelCard, ModelCardData
    except ImportError:
        return "---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n" + "".join(
            f"- {tag}\n" for tag in tags) + "---\n\n" + card
    data = ModelCardData(library_name="transformers", pipeline_tag="text-generation", tags=tags)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{card}"))


def _on_cpu(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself when it is on the CPU, else a CPU copy (the original stays where it trains)."""
    if all(t.device.type == "cpu" for t in model.state_dict().values()):
        return model
    return copy.deepcopy(model).to("cpu")


def check_target(out_dir: Path, force: bool) -> None:
    """Refuse an existing ``out_dir`` unless ``force``, and even then anything but an export or empty dir."""
    if not out_dir.exists() and not out_dir.is_symlink():
        existing = next((p for p in out_dir.parents if p.exists() or p.is_symlink()), None)
        if existing is not None and not existing.is_dir():
            raise ExportError(f"cannot write {out_dir}: {existing} is not a directory")
        return
    if not force:
        raise ExportError(f"{out_dir} already exists (use --force to replace it)")
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise ExportError(f"{out_dir} exists and is not a directory; not replacing it")
    if any(out_dir.iterdir()) and not is_export(out_dir):
        raise ExportError(f"{out_dir} exists and is not a p2ptrain export; not replacing it, even with --force")


def is_export(directory: Path) -> bool:
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("format") == EXPORT_FORMAT


def export_config(task_cfg: TaskSection, fingerprint: str, card: CardInfo,
                  shape_config: Mapping[str, Any] | None, training: Mapping[str, Any] | None) -> dict[str, Any]:
    bytelm = task_cfg.entrypoint is None and task_cfg.kind == "bytelm"
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_VERSION,
        "fingerprint": fingerprint,
        "model_class": BYTELM_CLASS if bytelm else None,
        "model_args": {"seq_len": task_cfg.seq_len, "d_model": task_cfg.d_model, "n_layers": task_cfg.n_layers,
                       "n_heads": task_cfg.n_heads} if bytelm else None,
        "shape_config": dict(shape_config or {}),
        "task": task_cfg.model_dump(mode="json", by_alias=True),
        "training": dict(training or {}),
        "run": asdict(card),
        "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "not recorded"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _or_unknown(value: object, spec: str = "") -> str:
    return "not recorded" if value is None else format(value, spec)


def _origin(run: Mapping[str, Any]) -> str:
    """The card's row saying where the weights came from: a node's checkpoint, or a peer in the swarm."""
    if run.get("fetched_from"):
        return (f"| downloaded | from the swarm (`p2ptrain fetch`), peer {run['fetched_from']}, "
                f"{_when(run.get('saved_at'))} |\n")
    return f"| checkpoint | {run.get('checkpoint') or 'not recorded'}, saved {_when(run.get('saved_at'))} |\n"


def _validation(run: Mapping[str, Any], name: str, bytelm: bool, causal_lm: bool) -> str:
    """The card's validation loss, saying what it was measured on: this model, or the node's parameters then."""
    val = run.get("val_loss")
    if val is None:
        return f"not recorded (`p2ptrain eval {name}` measures it)"
    figure = f"{val:.6g} (the task's loss)"
    if bytelm:
        figure = f"{val:.4f} nats/byte ({val / math.log(2):.3f} bits per byte)"
    elif causal_lm:
        figure = f"{val:.4f} nats/token"
    at = "at an unrecorded epoch" if run.get("val_epoch") is None else f"at epoch {run['val_epoch']}"
    if run.get("val_of") == VAL_OF_EXPORT:
        return f"{figure} {at}: this model on the run's held-out split"
    of = ("its local DiLoCo model, not the swarm's outer parameters exported here"
          if run.get("val_of") == VAL_OF_LOCAL else "its training parameters then")
    return (f"{figure} {at}, the node's last measurement, on {of}; not this export's own figure "
            f"(`p2ptrain eval {name}` measures that)")


def _credit(run: Mapping[str, Any]) -> str:
    """The card's rows on samples and contributors: this node's own counts, or, fetched, what the swarm's
    averaging rounds vouch for and, apart, what its peers' records claim."""
    if not run.get("fetched_from"):
        return (f"| samples (this node's count) | {_or_unknown(run.get('samples'), ',')} |\n"
                f"| samples this node contributed (its own count) | "
                f"{_or_unknown(run.get('samples_contributed'), ',')} |\n"
                f"| contributing peers (seen by this node, vouched for) | {_or_unknown(run.get('contributors'))} |\n")
    reporters = run.get("reported_by")
    if not reporters or run.get("samples") is None or run.get("contributors") is None:
        missing = "not recorded (no peer record of the run was read before the download)"
        return f"| samples contributed | {missing} |\n| contributing peers | {missing} |\n"
    records = f"{reporters} peer record{'s' if reporters != 1 else ''}"
    if run.get("samples_claimed") is None:  # an export fetched before vouching: its figures are claims
        claims = f"as reported by {reporters} peer{'s' if reporters != 1 else ''}"
        return (f"| samples contributed | {run['samples']:,}, {claims} (claims, each capped at what the run "
                f"allows; not vouched for) |\n| contributing peers | {run['contributors']}, {claims} |\n")
    vouchers = run.get("vouched_by") or 0
    peers, verb = (f"{vouchers} peer", "vouches") if vouchers == 1 else (f"{vouchers} peers", "vouch")
    by = (f"as {peers} this download joined through {verb} for them: their own figures and the samples each "
          "peer carried into their averaging rounds")
    return (f"| samples contributed (vouched for) | {run['samples']:,}, {by} |\n"
            f"| contributing peers (vouched for) | {run['contributors']}, {by} |\n"
            f"| samples claimed (not vouched for) | {run['samples_claimed']:,}, what {records} claim for "
            "their own peers, each clipped at the run's pace |\n")


def render_card(config: Mapping[str, Any], name: str) -> str:
    """The model card: what was trained, how far, and the lines that load it."""
    run, task = config["run"], config["task"]
    bytelm = config.get("model_class") == BYTELM_CLASS
    causal_lm = task.get("kind") == "hf_causal_lm" and not task.get("entrypoint")
    with_transformers = (
        "```python\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model = AutoModelForCausalLM.from_pretrained(\"{name}\")\n"
        f"tokenizer = AutoTokenizer.from_pretrained(\"{name}\")\n"
        "```\n\n"
    )
    if bytelm:
        what = (f"the built-in byte-level transformer LM (`bytelm`): {task['n_layers']} layers, width "
                f"{task['d_model']}, {task['n_heads']} heads, context {task['seq_len']} bytes; stored as GPT-2 "
                "with a byte vocabulary (token i is byte i)")
        load = (
            f"{with_transformers}"
            f"Or try it from the shell: `p2ptrain sample {name} --prompt \"def \"` and `p2ptrain eval {name}`.\n"
        )
    elif task.get("kind") == "hf_causal_lm" and not task.get("entrypoint"):
        what = f"a Hugging Face causal LM (`{config.get('model_type', 'transformers')}`, task `hf_causal_lm`)"
        load = with_transformers + f"Or from the shell: `p2ptrain sample {name} --prompt \"def \"`.\n"
    else:
        what = f"a user task (`{task.get('entrypoint')}`)"
        load = (
            "Build the model with the task's entrypoint (settings in config.json, `task`), then\n"
            f"`safetensors.torch.load_model(model, \"{name}/model.safetensors\")`.\n"
        )
    data = task.get("data_path") or "the .py files of Python's standard library (the default corpus)"
    return (
        f"# {name}\n\n"
        f"A model trained by a p2ptrain swarm: {what}.\n\n"
        "| | |\n|---|---|\n"
        f"| run | {run['run_ref']} |\n"
        f"| optimizer epochs | {_or_unknown(run.get('epoch'))} |\n"
        f"{_credit(run)}"
        f"| validation loss | {_validation(run, name, bytelm, causal_lm)} |\n"
        f"{_origin(run)}"
        f"| exported | {config['exported_at']} |\n"
        f"| model fingerprint | {config['fingerprint']} |\n"
        f"| training data | {data} |\n\n"
        "## Load it\n\n"
        f"{load}"
    )


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _swap_in(temp: Path, out_dir: Path) -> None:
    """Rename the finished ``temp`` to ``out_dir``; an old export is moved aside first, then deleted."""
    old: Path | None = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / "export")
    try:
        os.replace(temp, out_dir)
    except OSError:
        if old is not None:  # put the previous export back: never leave the user with nothing
            os.replace(old / "export", out_dir)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(OSError):  # durability of the rename; the export itself is complete
        fsync_path(out_dir.parent)
