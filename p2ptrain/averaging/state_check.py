"""Checks a downloaded training state before any of it touches the model: a claim until proven sane.

A state from a peer is ``(metadata, tensors)``.  The tensors are checked here (count, shapes, dtypes,
finite, size); the metadata by the pure verdicts of :mod:`p2ptrain.trust.verdicts`.  Nothing here
raises: whatever a peer sent, the worst outcome is "rejected, because ...".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from p2ptrain.trust.verdicts import Verdict, plausible_epoch

#: Metadata beyond the tensors (hivemind's flattened optimizer state, a few scalars).
METADATA_ALLOWANCE_BYTES = 4 << 20


@dataclass(frozen=True)
class TensorTemplate:
    """The shapes and dtypes a state must have: the local tensors it would be copied into."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> TensorTemplate:
        return cls(tuple(tuple(t.shape) for t in tensors), tuple(t.dtype for t in tensors))

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def nbytes(self) -> int:
        return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                   for shape, dtype in zip(self.shapes, self.dtypes, strict=True))

    def max_wire_bytes(self) -> int:
        """The most a donor may send: the tensors uncompressed, 10% framing, and the metadata."""
        return int(self.nbytes * 1.1) + METADATA_ALLOWANCE_BYTES


def check_tensors(template: TensorTemplate, tensors: Any) -> Verdict:
    """Exact count, shapes and dtypes; every floating value finite; total size within the model's."""
    if not isinstance(tensors, list | tuple):
        return Verdict.bad("bad_state", f"tensors are a {type(tensors).__name__}, not a list")
    if len(tensors) != len(template):
        return Verdict.bad("bad_state", f"{len(tensors)} tensors, expected {len(template)}")
    total = 0
    for index, (tensor, shape, dtype) in enumerate(zip(tensors, template.shapes, template.dtypes, strict=True)):
        if not isinstance(tensor, torch.Tensor):
            return Verdict.bad("bad_state", f"tensor {index} is a {type(tensor).__name__}")
        if tuple(tensor.shape) != shape:
            return Verdict.bad("bad_state", f"tensor {index} has shape {tuple(tensor.shape)}, expected {shape}")
        if tensor.dtype != dtype:
            return Verdict.bad("bad_state", f"tensor {index} is {tensor.dtype}, expected {dtype}")
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            return Verdict.bad("bad_state", f"tensor {index} has NaN or inf values")
        total += tensor.numel() * tensor.element_size()
    if total > template.nbytes:
        return Verdict.bad("bad_state", f"{total} bytes of tensors, the model has {template.nbytes}")
    return Verdict.good()


@dataclass
class StateValidator:
    """Every check a downloaded state must pass, in order; called once per candidate donor.

    ``peer_epochs`` reports the run's peers' epochs by peer ID (the donor's own report is left out);
    ``model_check`` is the optional, costlier look at the model itself.
    """

    template: TensorTemplate
    check_metadata: Callable[[Any], Verdict]
    own_epoch: Callable[[], int]
    peer_epochs: Callable[[], Mapping[str, int]] | None = None
    epoch_slack: int = 10
    model_check: Callable[[Any, Sequence[torch.Tensor], str], Verdict] | None = None

    def structure(self, metadata: Any, tensors: Any) -> Verdict:
        """Only the checks that need nobody's word: tensor count, shapes, dtypes, finite values, size,
        and the metadata's schema; never raises."""
        try:
            verdict = check_tensors(self.template, tensors)
            return verdict if not verdict.ok else self.check_metadata(metadata)
        except Exception as exc:
            return Verdict.bad("bad_state", f"could not be checked ({type(exc).__name__})")

    def __call__(self, metadata: Any, tensors: Any, donor: str) -> Verdict:
        try:
            for verdict in self._checks(metadata, tensors, donor):
                if not verdict.ok:
                    return verdict
            return Verdict.good()
        except Exception as exc:  # a check that trips over odd input still only rejects the state
            return Verdict.bad("bad_state", f"could not be checked ({type(exc).__name__})")

    def _checks(self, metadata: Any, tensors: Any, donor: str) -> Iterator[Verdict]:
        yield check_tensors(self.template, tensors)
        yield self.check_metadata(metadata)
        others = self.peer_epochs() if self.peer_epochs is not None else {}
        yield plausible_epoch(metadata["epoch"], [e for peer, e in others.items() if peer != donor],
                              own=self.own_epoch(), slack=self.epoch_slack)
        if self.model_check is not None:
            yield self.model_check(metadata, tensors, donor)
