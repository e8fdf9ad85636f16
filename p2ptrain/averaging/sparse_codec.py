"""The sparse outer round's wire format: each chunk's nonzero entries as compact indices and few-bit values.

A peer in ``outer_compression = "topk"`` mode hands the averager a dense tensor that is zero except for
each chunk's top-k entries, already quantised to ``bits`` bits on a per-chunk scale
(:func:`chunk_topk`).  :class:`SparseChunkCodec` is the hivemind compression that carries such a part:
per chunk of :data:`CHUNK` elements a count, a bit width and a scale, then the entries' offsets in the
chunk (uint16) and their sign/magnitude codes packed ``bits`` to a byte.  Entries that lie on the
chunk's ``bits``-bit grid travel exactly; a chunk that does not (the reducer's averaged reply, which
mixes several peers' entries) travels at 8 bits, so a reply is never denser or coarser than needed.

hivemind's all-reduce sums the decoded, dense parts: differing index sets across peers are simply
added, and each reply decodes to the dense average.  :meth:`SparseChunkCodec.estimate_compression_ratio`
makes hivemind's parts (each tensor split from its start) a whole number of chunks long, which keeps a
peer's chunks and the codec's chunks the same (a part of a different length still decodes correctly; its
chunks would then travel at 8 bits).

hivemind's protocol names a compression by a fixed enum, with no room for new ones: the codec speaks as
``BLOCKWISE_8BIT``, which this project never sends otherwise (it needs bitsandbytes), and receivers
decode it through this module's registration.  :func:`sparse_problem` checks a buffer's structure
(counts, offsets strictly increasing and inside their chunk, bit widths, finite scales, exact length)
before anything is decoded, so a malformed part is refused and its sender named.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hivemind.compression import CompressionBase, CompressionInfo
from hivemind.compression import serialization as _serialization
from hivemind.proto import runtime_pb2

#: Elements per chunk: each chunk keeps its own top-k entries and its own scale.
CHUNK = 4096
VALUE_BITS = (2, 4, 8)
WIRE_NAME = "BLOCKWISE_8BIT"
_VERSION = 1
_HEADER = np.dtype([("count", "<u2"), ("bits", "u1"), ("scale", "<f4")])  # 7 bytes per chunk


def _levels(bits: int) -> int:
    """Magnitudes 1..levels on a chunk's grid: a sign bit and ``bits - 1`` magnitude bits."""
    return 1 << (bits - 1)


def _chunk_views(flat: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``flat`` zero-padded to whole chunks, as (chunks, CHUNK), and the padding added."""
    pad = (-flat.numel()) % CHUNK
    padded = torch.nn.functional.pad(flat, (0, pad)) if pad else flat
    return padded.view(-1, CHUNK), pad


@torch.no_grad()
def chunk_topk(tensor: torch.Tensor, density: float, bits: int) -> torch.Tensor:
    """A dense tensor holding, for each chunk of ``tensor``'s flattened values, its ``ceil(density * CHUNK)``
    largest-magnitude entries quantised to ``bits`` bits on the chunk's scale; zero elsewhere.

    What it returns is exactly what :class:`SparseChunkCodec` carries, so ``tensor - result`` is what a
    peer did not send (its error-feedback residual)."""
    if bits not in VALUE_BITS:
        raise ValueError(f"value bits must be one of {VALUE_BITS}, got {bits}")
    flat = tensor.detach().float().reshape(-1)
    if flat.numel() == 0:
        return torch.zeros_like(tensor, dtype=torch.float32)
    chunks, pad = _chunk_views(flat)
    k = max(1, min(CHUNK, math.ceil(density * CHUNK)))
    _, index = chunks.abs().topk(k, dim=1)
    picked = chunks.gather(1, index)
    scale = picked.abs().amax(dim=1, keepdim=True)
    levels = _levels(bits)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    magnitude = (picked.abs() / safe * levels).round().clamp(0, levels)
    values = picked.sign() * magnitude * safe / levels
    out = torch.zeros_like(chunks).scatter_(1, index, values)
    out = out.reshape(-1)[: flat.numel()] if pad else out.reshape(-1)
    return out.view(tensor.shape)


def sparse_wire_bytes(numel: int, density: float, bits: int) -> int:
    """Bytes one tensor of ``numel`` values takes on the wire after :func:`chunk_topk` (before splitting)."""
    chunks = math.ceil(numel / CHUNK)
    k = max(1, min(CHUNK, math.ceil(density * CHUNK)))
    per_chunk = _HEADER.itemsize + 2 * k + _packed_len(k, bits)
    return 1 + chunks * per_chunk


def _pack(codes: np.ndarray, bits: int) -> bytes:
    if bits == 8:
        return codes.astype(np.uint8).tobytes()
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)
    return np.packbits(((codes[:, None] >> shifts) & 1).astype(np.uint8).reshape(-1)).tobytes()


def _unpack(data: np.ndarray, count: int, bits: int) -> np.ndarray:
    if bits == 8:
        return data[:count].astype(np.int64)
    flat = np.unpackbits(data)[: count * bits].reshape(count, bits).astype(np.int64)
    return (flat << np.arange(bits - 1, -1, -1, dtype=np.int64)).sum(axis=1)


def _packed_len(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def _encode_chunk(values: np.ndarray, bits: int) -> tuple[int, float, np.ndarray]:
    """(bit width, scale, codes) for a chunk's nonzero values: ``bits`` if they lie on that grid, else 8."""
    scale = float(np.abs(values).max())
    for width in (bits, 8) if bits != 8 else (8,):
        levels = _levels(width)
        magnitude = np.clip(np.rint(np.abs(values) / scale * levels), 1, levels)
        decoded = np.sign(values) * magnitude * np.float32(scale) / levels
        if width == 8 or np.allclose(decoded, values, rtol=1e-5, atol=0.0):
            codes = ((values < 0).astype(np.int64) << (width - 1)) | (magnitude.astype(np.int64) - 1)
            return width, scale, codes
    raise AssertionError("unreachable")


class SparseChunkCodec(CompressionBase):
    """hivemind compression for mostly-zero tensors: per chunk, nonzero offsets and ``bits``-bit values."""

    compression_type = getattr(runtime_pb2.CompressionType, WIRE_NAME)

    def __init__(self, bits: int = 8) -> None:
        if bits not in VALUE_BITS:
            raise ValueError(f"value bits must be one of {VALUE_BITS}, got {bits}")
        self.bits = bits

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        # Parts as long as fp32 ones (512 KiB / 4 bytes: 32 chunks), so hivemind's part boundaries fall on
        # chunk boundaries and the load is split between reducers as finely as for a dense round.
        return 1.0

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        flat = tensor.detach().float().reshape(-1).numpy()
        out = [bytes([_VERSION])]
        for start in range(0, flat.size, CHUNK):
            chunk = flat[start:start + CHUNK]
            where = np.flatnonzero(chunk)
            if where.size == 0:
                out.append(np.array((0, 8, 0.0), dtype=_HEADER).tobytes())
                continue
            width, scale, codes = _encode_chunk(chunk[where], self.bits)
            out += [np.array((where.size, width, scale), dtype=_HEADER).tobytes(),
                    where.astype("<u2").tobytes(), _pack(codes, width)]
        return runtime_pb2.Tensor(buffer=b"".join(out), size=tensor.shape, dtype="float32",
                                  compression=self.compression_type, requires_grad=tensor.requires_grad)

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        shape = tuple(serialized_tensor.size)
        problem = sparse_problem(serialized_tensor.buffer, math.prod(shape))
        if problem:
            raise ValueError(f"malformed sparse part: {problem}")
        buffer = np.frombuffer(serialized_tensor.buffer, dtype=np.uint8)
        dense = np.zeros(math.prod(shape), dtype=np.float32)
        offset = 1
        for start in range(0, dense.size, CHUNK):
            header = np.frombuffer(buffer, dtype=_HEADER, count=1, offset=offset)[0]
            count, bits, scale = int(header["count"]), int(header["bits"]), float(header["scale"])
            offset += _HEADER.itemsize
            if count:
                where = np.frombuffer(buffer, dtype="<u2", count=count, offset=offset).astype(np.int64)
                offset += 2 * count
                codes = _unpack(buffer[offset:offset + _packed_len(count, bits)], count, bits)
                offset += _packed_len(count, bits)
                levels = _levels(bits)
                sign = np.where(codes >> (bits - 1) & 1, -1.0, 1.0)
                dense[start + where] = sign * ((codes & (levels - 1)) + 1) * np.float32(scale) / levels
        table = torch.from_numpy(dense).reshape(shape)
        return table.to(getattr(torch, serialized_tensor.dtype or "float32"))


def sparse_problem(buffer: bytes, numel: int, max_scale: float = 1e30) -> str:
    """Why ``buffer`` is not a valid sparse part of ``numel`` elements ("" if it is).  Never raises.

    Checked: the version, each chunk's header (count within the chunk, bit width one of
    :data:`VALUE_BITS`, a finite, non-negative scale below ``max_scale``), offsets strictly increasing
    inside the chunk, and the buffer's exact length."""
    try:
        data = np.frombuffer(buffer, dtype=np.uint8)
        if data.size < 1 or data[0] != _VERSION:
            return "unknown sparse format version"
        offset = 1
        for start in range(0, numel, CHUNK):
            length = min(CHUNK, numel - start)
            if offset + _HEADER.itemsize > data.size:
                return f"truncated at chunk {start // CHUNK}"
            header = np.frombuffer(data, dtype=_HEADER, count=1, offset=offset)[0]
            count, bits, scale = int(header["count"]), int(header["bits"]), float(header["scale"])
            offset += _HEADER.itemsize
            if count > length or bits not in VALUE_BITS:
                return f"chunk {start // CHUNK} declares {count} entries of {bits} bits"
            if not math.isfinite(scale) or scale < 0 or scale > max_scale:
                return f"chunk {start // CHUNK} has scale {scale:.3g}"
            need = 2 * count + _packed_len(count, bits)
            if offset + need > data.size:
                return f"truncated at chunk {start // CHUNK}"
            if count:
                where = np.frombuffer(data, dtype="<u2", count=count, offset=offset).astype(np.int64)
                if int(where[-1]) >= length or (count > 1 and bool((np.diff(where) <= 0).any())):
                    return f"chunk {start // CHUNK} has offsets out of order or outside it"
            offset += need
        if offset != data.size:
            return f"{data.size - offset} trailing bytes"
        return ""
    except Exception as exc:  # whatever a peer sends, the check must not raise into hivemind
        return f"unreadable ({type(exc).__name__})"


# Receivers decode through hivemind's registry, not through the sender's object.
_serialization._BASE_COMPRESSION_TYPES[WIRE_NAME] = SparseChunkCodec()
