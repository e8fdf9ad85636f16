"""Maps the config's compression choices ("none", "fp16", "8bit") to hivemind compression objects."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from hivemind.compression import (
    CompressionBase,
    Float16Compression,
    NoCompression,
    SizeAdaptiveCompression,
    Uniform8BitQuantization,
)
from hivemind.compression import serialization as _serialization
from hivemind.proto import runtime_pb2

from p2ptrain.averaging.sparse_codec import WIRE_NAME as SPARSE_WIRE_NAME

CompressionChoice = Literal["none", "fp16", "8bit"]

SMALL_TENSOR_ELEMENTS = 2**16
"""Below this many elements a tensor is sent as fp16 even in "8bit" mode: biases and norms are tiny
on the wire, and quantising them hurts most."""

WIRE_COMPRESSIONS = frozenset({"NONE", "FLOAT16", "UNIFORM_8BIT", SPARSE_WIRE_NAME})
"""The hivemind compression types :func:`make_compression` (and the sparse outer round's codec,
:mod:`p2ptrain.averaging.sparse_codec`) can produce: the only ones an honest peer's averaging parts
arrive in (anything else is refused before it is decoded)."""

BYTES_PER_ELEMENT = {"none": 4.0, "fp16": 2.0, "8bit": 1.0}
"""Approximate wire bytes per fp32 element for each choice (8-bit adds a small lookup table)."""


class _Uniform8Bit(Uniform8BitQuantization):
    """hivemind 1.1.12's 8-bit decoder does ``int(array)`` on a 1-element array, which NumPy >= 2.4
    rejects (every 8-bit message then fails to decode); this decodes the same bytes without it."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        size = int(np.frombuffer(buffer, count=1, dtype=np.int64)[0])
        codebook = np.frombuffer(buffer, offset=8, count=size, dtype=self.codebook_dtype)
        indices = np.frombuffer(buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        # astype/copy: frombuffer arrays are read-only, and torch warns about wrapping those.
        quantized = torch.from_numpy(indices.astype(np.int64)).reshape(tuple(serialized_tensor.size))
        table = torch.from_numpy(codebook.copy()).to(dtype=getattr(torch, serialized_tensor.dtype))
        return table[quantized].requires_grad_(serialized_tensor.requires_grad)


# Receivers decode through this registry, not through the sender's object, so the fix goes there.
_serialization._BASE_COMPRESSION_TYPES["UNIFORM_8BIT"] = _Uniform8Bit()


def make_compression(choice: CompressionChoice) -> CompressionBase:
    """The hivemind compression for ``choice``; raises ValueError for anything else."""
    if choice == "none":
        return NoCompression()
    if choice == "fp16":
        return Float16Compression()
    if choice == "8bit":
        return SizeAdaptiveCompression(
            threshold=SMALL_TENSOR_ELEMENTS, less=Float16Compression(), greater_equal=_Uniform8Bit()
        )
    raise ValueError(f"unknown compression {choice!r}; expected one of: none, fp16, 8bit")


def wire_bytes(num_elements: int, choice: CompressionChoice) -> int:
    """Estimated bytes one copy of ``num_elements`` fp32 values takes on the wire with ``choice``."""
    return int(num_elements * BYTES_PER_ELEMENT[choice])
