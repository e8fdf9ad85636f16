"""Where training runs: ``training.device`` and ``training.precision`` made into a torch device, an
autocast context, a gradient scaler, and the explicit copies between that device and the CPU.

The model's parameters and its optimizer state stay fp32 whatever the precision (autocast only changes
the arithmetic of the forward pass), so what the swarm averages has one dtype on every peer.  hivemind's
averagers hold CPU tensors in shared memory: :class:`HostStaging` moves a list of device tensors to such
buffers and back, through pinned memory on CUDA with one wait per direction (the copy itself).
Checkpoints and exports hold CPU tensors (:func:`to_cpu`), so a node trained on a GPU resumes on a CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from p2ptrain.errors import ConfigError

logger = logging.getLogger(__name__)

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(setting: str, cuda_available: Callable[[], bool] = torch.cuda.is_available,
                   device_count: Callable[[], int] = torch.cuda.device_count) -> torch.device:
    """``training.device`` as a torch device; raises :class:`ConfigError` (one line) for a CUDA device
    this machine does not have."""
    if setting == "auto":
        return torch.device("cuda", 0) if cuda_available() else torch.device("cpu")
    if setting == "cpu":
        return torch.device("cpu")
    if not cuda_available():
        raise ConfigError(f'training.device: "{setting}" but torch sees no CUDA device here (torch '
                          f'{torch.__version__}, CUDA build {torch.version.cuda or "none"}): install a CUDA '
                          'build of torch, or set training.device = "auto" or "cpu"')
    index = int(setting.partition(":")[2] or 0)
    count = device_count()
    if index >= count:
        raise ConfigError(f'training.device: "{setting}" but torch sees {count} CUDA device(s) '
                          f"(cuda:0..cuda:{count - 1}); check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", index)


@dataclass
class Placement:
    """The device and precision a node trains with, and what the training step needs of them."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    #: fp16 on CUDA: the dynamic loss scale (torch's ``GradScaler``), stepped by the trainer.
    scaler: Any = None

    @classmethod
    def from_settings(cls, device: str, precision: str,
                      cuda_available: Callable[[], bool] = torch.cuda.is_available,
                      device_count: Callable[[], int] = torch.cuda.device_count) -> Placement:
        """From ``training.device`` and ``training.precision``; fp16 without CUDA (device "auto" on a
        CPU machine: the config validator refuses an explicit "cpu") trains in fp32, said in one line."""
        where = resolve_device(device, cuda_available, device_count)
        if precision == "fp16" and where.type != "cuda":
            logger.warning('training.precision "fp16" needs a CUDA device and none is here: training in fp32 '
                           '(set "bf16" for reduced precision on a CPU)')
            precision = "fp32"
        scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        return cls(where, precision, scaler)

    @property
    def name(self) -> str:
        """The device as status and records show it: ``cpu`` or ``cuda:N``."""
        return "cpu" if self.device.type == "cpu" else f"{self.device.type}:{self.device.index or 0}"

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward pass's context: torch.autocast in bf16/fp16, nothing in fp32."""
        dtype = AUTOCAST_DTYPES.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def batch(self, batch: Any) -> Any:
        """``batch`` (a tensor, or tuples, lists and dicts of them) on the device; pinned host memory is
        copied without blocking (the forward pass that reads it runs later on the same stream)."""
        if not self.is_cuda:
            return batch
        return _map_tensors(batch, lambda t: t.to(self.device, non_blocking=t.is_pinned()))

    def memory_bytes(self) -> int | None:
        """Device memory held by torch's allocator now; None on a CPU (there is no device memory to count)."""
        if not self.is_cuda:
            return None
        try:
            return int(torch.cuda.memory_allocated(self.device))
        except Exception:  # a device that went away is reported as unknown, never raised into a scrape
            return None

    def describe(self) -> str:
        where = self.name
        if self.is_cuda:
            with contextlib.suppress(Exception):  # only a name for the log line
                where += f" ({torch.cuda.get_device_name(self.device)})"
        return f"training on {where} in {self.precision}"


def _map_tensors(value: Any, move: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return move(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple keeps its type
        return type(value)(*(_map_tensors(v, move) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(v, move) for v in value)
    if isinstance(value, Mapping):
        return {k: _map_tensors(v, move) for k, v in value.items()}
    return value


def to_cpu(state: Any) -> Any:
    """``state`` (nested dicts, lists, tuples) with every tensor on the CPU: what checkpoints and exports
    hold, so that any machine can read them whatever device trained them."""
    return _map_tensors(state, lambda t: t.detach().cpu() if t.device.type != "cpu" else t)


class HostStaging:
    """Copies between a list of device tensors and CPU buffers of the same shapes (an averager's).

    On a CPU both sides are host memory: plain copies.  On CUDA the device tensors go to pinned buffers
    with non-blocking copies, the stream is waited for once (the transfer itself), then the pinned
    buffers are copied into the averager's shared memory; the reverse direction copies into pinned
    buffers and back to the device without blocking the host (later kernels on the stream wait for it),
    and the next time those buffers are written the host first waits for that transfer.
    """

    def __init__(self, like: Sequence[torch.Tensor], device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._down: list[torch.Tensor] = []
        self._up: list[torch.Tensor] = []
        self._up_done: Any = None
        if self._cuda:
            self._down = [torch.empty(t.shape, dtype=torch.float32, pin_memory=True) for t in like]
            self._up = [torch.empty(t.shape, dtype=torch.float32, pin_memory=True) for t in like]

    @torch.no_grad()
    def to_host(self, sources: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> None:
        """Copy device ``sources`` into the CPU ``targets`` (fp32); on return the targets hold them."""
        if not self._cuda:
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source.detach())
            return
        for pinned, source in zip(self._down, sources, strict=True):
            pinned.copy_(source.detach(), non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        for target, pinned in zip(targets, self._down, strict=True):
            target.copy_(pinned)

    @torch.no_grad()
    def to_device(self, sources: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The CPU ``sources`` as new fp32 tensors on the device (the sources may change after return)."""
        if not self._cuda:
            return [source.detach().to(torch.float32, copy=True) for source in sources]
        if self._up_done is not None:
            self._up_done.synchronize()  # the last upload still reads these pinned buffers
        for pinned, source in zip(self._up, sources, strict=True):
            pinned.copy_(source)
        moved = [pinned.to(self.device, non_blocking=True) for pinned in self._up]
        self._up_done = torch.cuda.Event()
        self._up_done.record(torch.cuda.current_stream(self.device))
        return moved

