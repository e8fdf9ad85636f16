"""The compressed outer round's error feedback: what a peer sends of its pseudo-gradient, and what it keeps.

In ``outer_compression = "int8"`` or ``"topk"`` mode each peer adds its round's pseudo-gradient to a
buffer of its own, sends a compressed copy of that sum (:meth:`ErrorFeedback.take`) and keeps the
rest, ``sum - sent``, for later rounds: nothing a peer computed is lost, it only travels later.  The
residual is the peer's own accumulated pseudo-gradient less what it sent, never less the swarm's
average (that would feed the other peers' updates back into ours).  A newcomer's buffer starts at
zero; checkpoints hold it (:meth:`state` / :meth:`load`).
"""

from __future__ import annotations

import math

import torch

from p2ptrain.averaging.sparse_codec import CHUNK, chunk_topk

OuterCompression = str  # "none" | "int8" | "topk", as the config spells it


@torch.no_grad()
def chunk_int8(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` quantised to 255 levels on a scale per chunk of :data:`CHUNK` values (what int8 mode sends)."""
    flat = tensor.detach().float().reshape(-1)
    pad = (-flat.numel()) % CHUNK
    chunks = torch.nn.functional.pad(flat, (0, pad)).view(-1, CHUNK)
    scale = chunks.abs().amax(dim=1, keepdim=True)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    out = ((chunks / safe * 127).round() * safe / 127).reshape(-1)[: flat.numel()]
    return out.reshape(tensor.shape)


class ErrorFeedback:
    """One buffer per parameter tensor: the pseudo-gradient a peer has computed and not yet sent."""

    def __init__(self, shapes: list[torch.Size], mode: OuterCompression, density: float = 0.02,
                 bits: int = 2) -> None:
        if mode not in ("int8", "topk"):
            raise ValueError(f"error feedback needs outer_compression int8 or topk, not {mode!r}")
        self.mode, self.density, self.bits = mode, density, bits
        self.buffers = [torch.zeros(shape, dtype=torch.float32) for shape in shapes]

    @torch.no_grad()
    def take(self, pseudo: list[torch.Tensor]) -> list[torch.Tensor]:
        """Add ``pseudo`` to the buffers and return what to send; the buffers keep the rest."""
        sent: list[torch.Tensor] = []
        for buffer, grad in zip(self.buffers, pseudo, strict=True):
            # The buffers are host memory (what the averager sends is too); a GPU's pseudo-gradient is
            # copied over once a round, and what is sent goes back to the device it came from.
            buffer.add_(grad.detach().float().to(buffer.device))
            part = chunk_topk(buffer, self.density, self.bits) if self.mode == "topk" else chunk_int8(buffer)
            buffer.sub_(part)
            sent.append(part.to(grad.device))
        return sent

    @torch.no_grad()
    def give_back(self, sent: list[torch.Tensor]) -> None:
        """Return what :meth:`take` gave out to the buffers: a round that failed sent nothing."""
        for buffer, part in zip(self.buffers, sent, strict=True):
            buffer.add_(part.detach().float().to(buffer.device))

    def sent_fraction(self) -> float:
        """The share of values a round sends (1.0 in int8 mode)."""
        return 1.0 if self.mode == "int8" else min(1.0, math.ceil(self.density * CHUNK) / CHUNK)

    def state(self) -> list[torch.Tensor]:
        return [b.clone() for b in self.buffers]

    @torch.no_grad()
    def load(self, buffers: list[torch.Tensor] | None) -> bool:
        """Resume saved buffers; False (buffers zeroed) when there are none or they do not fit this model."""
        if buffers is None or len(buffers) != len(self.buffers) or any(
                saved.shape != own.shape or not bool(torch.isfinite(saved).all())
                for saved, own in zip(buffers, self.buffers, strict=False)):
            self.reset()
            return False
        for own, saved in zip(self.buffers, buffers, strict=True):
            own.copy_(saved)
        return True

    def reset(self) -> None:
        for buffer in self.buffers:
            buffer.zero_()
