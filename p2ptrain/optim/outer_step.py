"""DiLoCo's outer optimizer, free of networking: pseudo-gradients in, new outer parameters out.

Kept apart from :mod:`p2ptrain.optim.diloco` (which decides when a round ends and with whom it averages)
so the arithmetic of the outer step, Nesterov-momentum SGD on ``outer - average``, with the local
progress of an overlapped round carried on top, can be read and tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class OuterStep:
    """The outer update, free of networking: pseudo-gradients in, new outer parameters out."""

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float, nesterov: bool) -> None:
        self.params = [p.detach().clone().float() for p in params]
        self.optimizer = torch.optim.SGD(self.params, lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)
        #: Rounds landed (an outer step, averaged or not, or a restart): tells a reader the model changed.
        self.steps_applied = 0

    @torch.no_grad()
    def pseudo_gradients(self, current: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """``outer - current`` for each tensor: the direction the round moved, as a gradient."""
        return [outer - now.detach().float() for outer, now in zip(self.params, current, strict=True)]

    @torch.no_grad()
    def apply(self, averaged: Iterable[torch.Tensor], model_params: Iterable[torch.Tensor],
              carry: Iterable[torch.Tensor] | None = None) -> None:
        """One SGD step of the outer params on ``averaged``; copy the result into ``model_params``.

        ``carry`` (same shapes) is local progress made since the pseudo-gradients were taken; it is
        added on top of the new outer params, so an overlapped round loses none of it.
        """
        for outer, grad in zip(self.params, averaged, strict=True):
            outer.grad = grad.detach().to(outer.dtype).clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.restart(model_params, carry)

    @torch.no_grad()
    def restart(self, model_params: Iterable[torch.Tensor], carry: Iterable[torch.Tensor] | None = None) -> None:
        """No outer step (the outer params and momentum unchanged): the model restarts from the outer
        params, ``carry`` on top."""
        self.steps_applied += 1
        carried = list(carry) if carry is not None else [None] * len(self.params)
        for outer, param, extra in zip(self.params, model_params, carried, strict=True):
            param.copy_(outer if extra is None else outer + extra)

    def momentum_buffers(self) -> list[torch.Tensor]:
        return [self.optimizer.state.get(p, {}).get("momentum_buffer", torch.zeros_like(p)) for p in self.params]
