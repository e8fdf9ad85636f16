"""hivemind's all-reduce with every sender's part checked before it is mixed in.

Three small subclasses of hivemind 1.1.12's all-reduce internals, each overriding what it names:

* :class:`RobustTensorPartReducer` (``TensorPartReducer``: ``reset_accumulators``,
  ``accumulate_part``, ``on_sender_failed``, ``check_current_part_finished``) keeps each sender's
  copy of the current part instead of a running sum; once all have arrived it screens them
  (:func:`p2ptrain.averaging.robust_reduce.screen_parts`), names the senders it rejects, and aggregates the
  rest robustly.  A rejected sender is left out of every later part of the round.  Nothing a peer
  sends can make this check raise: a part that cannot be screened refuses its sender, and a part that
  cannot be reduced hands everyone our own values, so the honest senders are never left waiting.
* :class:`CheckedTensorPartContainer` (``TensorPartContainer.register_processed_part``) refuses an
  average returned by another reducer that is not finite or moves our part implausibly far, keeps our
  own values for that reducer's share instead, and names it.
* :class:`RobustAllReduceRunner` (``AllReduceRunner.__init__``, restated so that only our container and
  reducer are built, ``_communicate_with_peer``, ``_accumulate_parts_streaming``, ``_get_peer_stub``:
  never a peer not admitted to an owned run) installs both, leaves
  gated peers out from the start (their parts
  are never awaited, their results never used), and checks each incoming part's declared shape, dtype,
  compression and size before it is deserialised.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartContainer, TensorPartReducer
from hivemind.p2p import P2P, PeerID, ServicerBase, StubBase
from hivemind.proto import averaging_pb2, runtime_pb2

from p2ptrain.averaging.compression import WIRE_COMPRESSIONS
from p2ptrain.averaging.counting import Refuse, admitted_stub
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.robust_reduce import (
    PART_DTYPES,
    ReduceRule,
    Rejection,
    aggregate,
    check_result,
    dtype_name,
    part_floors,
    screen_parts,
)
from p2ptrain.averaging.sparse_codec import WIRE_NAME as SPARSE_WIRE_NAME
from p2ptrain.averaging.sparse_codec import sparse_problem
from p2ptrain.trust.peergate import PeerGate

require_hivemind(__name__)

logger = logging.getLogger(__name__)

#: Bytes a serialised part may take per element (float64 is the widest honest encoding) plus framing.
_MAX_BYTES_PER_ELEMENT = 8
_PART_FRAMING_BYTES = 4096
#: The dtypes a part may declare, each with its bytes per element uncompressed (hivemind sends bfloat16
#: as 2 or, in its legacy mode, 4 bytes): see robust_reduce.PART_DTYPES.
_WIRE_DTYPES = {"float16": (2,), "bfloat16": (2, 4), "float32": (4,), "float64": (8,)}

OnReject = Callable[[int, Rejection], None]


class RobustTensorPartReducer(TensorPartReducer):
    """Collects every sender's copy of a part, screens them, aggregates the accepted ones robustly."""

    def __init__(self, part_shapes: Sequence[torch.Size], num_senders: int, *, rule: ReduceRule,
                 local_sender: int | None, on_reject: OnReject, own_floors: Sequence[float] = ()) -> None:
        self.rule, self.local_sender, self._on_reject = rule, local_sender, on_reject
        #: For each part, the least norm our own copy counts as when it is the reference (part_floors).
        self.own_floors = tuple(own_floors)
        self._contributions: dict[int, tuple[torch.Tensor, float]] = {}
        self.contributions_accepted = 0
        self.clipped = 0
        #: Each sender's weight as accepted (capped), by sender index: the round report says who was vouched for.
        self.weights: dict[int, float] = {}
        super().__init__(part_shapes, num_senders)

    def reset_accumulators(self) -> None:
        if self.current_part_index >= self.num_parts - 1:
            self.finalize()
            return
        self.current_part_index += 1
        self.current_part_accumulated_from = 0
        self.current_part_future: asyncio.Future[torch.Tensor] = asyncio.Future()
        self.num_current_senders = sum(self.current_part_index < failed for failed in self.sender_failed_after)
        self.accumulator = None  # kept for the base class's finalize(), which deletes it
        self.denominator = 0.0
        self._contributions = {}

    async def accumulate_part(self, sender_index: int, part_index: int, tensor_part: torch.Tensor,
                              weight: float = 1.0) -> torch.Tensor:
        assert 0 <= sender_index < self.num_senders, "invalid sender index"
        assert 0 <= part_index < self.num_parts, "invalid part index"
        self.num_parts_received[sender_index] += 1
        finished = asyncio.ensure_future(self.finished.wait())
        try:
            while part_index > self.current_part_index:  # a sender is at most one part ahead
                await asyncio.wait({self.current_part_future, finished}, return_when=asyncio.FIRST_COMPLETED)
                if self.finished.is_set():
                    raise AllreduceException(f"attempted to aggregate part in a finalized {type(self).__name__}")
        finally:
            finished.cancel()
        if self.sender_failed_after[sender_index] != math.inf:
            raise BannedException(f"sender {sender_index} was excluded from this round")
        future = self.current_part_future
        problem = None
        if not isinstance(tensor_part, torch.Tensor) or tensor_part.dtype not in PART_DTYPES:
            problem = f"part {part_index} has dtype {dtype_name(tensor_part)}"
        elif tuple(tensor_part.shape) != tuple(self.part_shapes[part_index]):
            problem = f"part {part_index} has shape {tuple(tensor_part.shape)}"
        if problem is not None:
            self._exclude(sender_index, part_index, Rejection("malformed_part", problem))
            raise BannedException(f"sender {sender_index} sent a malformed part")
        self._contributions[sender_index] = (tensor_part, weight)
        self.current_part_accumulated_from += 1
        self.check_current_part_finished()
        return await future

    def _exclude(self, sender_index: int, from_part: int, why: Rejection) -> None:
        self.sender_failed_after[sender_index] = from_part
        if from_part == self.current_part_index:
            self.num_current_senders -= 1
        if sender_index != self.local_sender:
            self._on_reject(sender_index, why)
        self.check_current_part_finished()

    def on_sender_failed(self, sender_index: int) -> None:
        if self.sender_failed_after[sender_index] != math.inf:
            return  # already excluded (rejected by a check): do not count it out twice
        super().on_sender_failed(sender_index)

    def check_current_part_finished(self) -> None:
        if self.finished.is_set() or self.current_part_accumulated_from < self.num_current_senders:
            return
        if self.num_current_senders == 0 and not self._contributions:
            return  # nobody left to send this part; the round ends by its timeout or finalize()
        try:
            result = self._reduce_current_part()
        except Exception as exc:  # never leave the senders' futures unresolved: the round would stall
            logger.warning("could not reduce part %d of an all-reduce (%s: %s); our own values stand in for it",
                           self.current_part_index, type(exc).__name__, str(exc)[:120])
            result = self._own_or_zeros()
        self.current_part_future.set_result(result)
        self.reset_accumulators()

    def _reduce_current_part(self) -> torch.Tensor:
        index = self.current_part_index
        floor = self.own_floors[index] if index < len(self.own_floors) else 0.0
        accepted, rejected = screen_parts(self._contributions, self.local_sender, self.rule, floor)
        for sender, why in rejected.items():
            self.sender_failed_after[sender] = min(self.sender_failed_after[sender], self.current_part_index + 1)
            self._on_reject(sender, why)
        if not accepted:  # nothing usable: hand everyone back our own part (or zeros), never a poisoned mix
            return self._own_or_zeros()
        result, clipped = aggregate([t for t, _ in accepted.values()], [w for _, w in accepted.values()], self.rule)
        for sender, (_, weight) in accepted.items():
            self.weights[sender] = max(weight, self.weights.get(sender, 0.0))
        self.contributions_accepted += len(accepted)
        self.clipped += clipped
        return result

    def _own_or_zeros(self) -> torch.Tensor:
        own = self._contributions.get(self.local_sender) if self.local_sender is not None else None
        try:
            if own is not None and own[0].dtype in PART_DTYPES and bool(torch.isfinite(own[0]).all()):
                return own[0].clone()
        except Exception:  # our own part: if it cannot be read, zeros keep everyone's values
            pass
        return torch.zeros(self.part_shapes[self.current_part_index])


class CheckedTensorPartContainer(TensorPartContainer):
    """Refuses implausible averages returned by other reducers; our own values stand in for them."""

    def __init__(self, *args: Any, rule: ReduceRule, local_index: int, on_bad_result: Callable[[int, str], None],
                 floors: bool = True, **kwargs: Any) -> None:
        self.rule, self.local_index, self._on_bad_result = rule, local_index, on_bad_result
        self.distrusted: set[int] = set()
        self._filling_in = False
        super().__init__(*args, **kwargs)
        #: For each peer's share, each part's floor as a reference (robust_reduce.part_floors); none when
        #: ``floors`` is False (a peer tagging along with weight 0: its tensors say nothing).
        shares = [[part.numel() for part, _ in share] for share in self._input_parts_by_peer]
        flat = part_floors(self.local_tensors, self.num_parts_by_tensor, [n for share in shares for n in share],
                           rule.vector_floor) if floors else []
        self.floors_by_peer: list[list[float]] = []
        for share in shares:
            self.floors_by_peer.append(flat[:len(share)] if flat else [0.0] * len(share))
            flat = flat[len(share):]

    def register_failed_reducer(self, peer_index: int) -> None:
        self._filling_in = True  # the base class fills in (and counts) our own values itself
        try:
            super().register_failed_reducer(peer_index)
        finally:
            self._filling_in = False

    def register_processed_part(self, peer_index: int, part_index: int, part: torch.Tensor) -> None:
        if (peer_index != self.local_index and not self._filling_in
                and part_index < len(self._input_parts_by_peer[peer_index])):
            local = self._input_parts_by_peer[peer_index][part_index][0]
            if peer_index not in self.distrusted:
                reason = check_result(part, local, self.rule, self.floors_by_peer[peer_index][part_index])
                if reason:
                    self.distrusted.add(peer_index)
                    self._on_bad_result(peer_index, reason)
            if peer_index in self.distrusted:
                part = torch.zeros_like(local)  # deltas: zero keeps our own values for this share
                self.failed_size += part.numel()
        super().register_processed_part(peer_index, part_index, part)


class RobustAllReduceRunner(AllReduceRunner):
    """hivemind's butterfly all-reduce with per-sender screening, robust aggregation and a peer gate."""

    def __init__(self, *, p2p: P2P, servicer_type: type[ServicerBase], prefix: str | None, group_id: bytes,
                 tensors: Sequence[torch.Tensor], ordered_peer_ids: Sequence[PeerID], peer_fractions: tuple[float, ...],
                 rule: ReduceRule, gate: PeerGate | None, refuse: Refuse | None = None, weight: float | None = None,
                 modes: Sequence[AveragingMode] | None = None, sender_timeout: float | None = None,
                 reducer_timeout: float | None = None, **kwargs: Any) -> None:
        # hivemind 1.1.12's AllReduceRunner.__init__, building our container and reducer in place of
        # its own (calling it would partition every tensor twice per round).  Keep in step with it.
        self._p2p, self.peer_id = p2p, p2p.peer_id
        assert self.peer_id in ordered_peer_ids, "peer_id is not a part of the group"
        if reducer_timeout is not None and (sender_timeout is None or reducer_timeout <= sender_timeout):
            raise ValueError("If reducer_timeout is enabled, sender_timeout must be shorter than reducer_timeout.")
        if not issubclass(servicer_type, ServicerBase):
            raise TypeError("`servicer_type` is expected to be a ServicerBase subclass")
        self._servicer_type, self._prefix = servicer_type, prefix
        modes = modes or tuple(AveragingMode.CLIENT if frac == 0 else AveragingMode.NODE for frac in peer_fractions)
        assert len(modes) == len(ordered_peer_ids), "lists have inconsistent length"
        assert any(mode != AveragingMode.CLIENT for mode in modes), "cannot run allreduce without reducers"
        self.group_id, self.ordered_peer_ids = group_id, ordered_peer_ids
        self.modes, self.peer_fractions = modes, peer_fractions
        if weight is None:
            weight = float(modes[self.ordered_peer_ids.index(self.peer_id)] != AveragingMode.AUX)
        self.weight = weight
        self._future: asyncio.Future[None] = asyncio.Future()
        self.sender_peer_ids = [peer for peer, mode in zip(ordered_peer_ids, modes, strict=True)
                                if mode != AveragingMode.AUX]
        self.sender_timeout, self.reducer_timeout = sender_timeout, reducer_timeout
        self.all_senders_started = asyncio.Event()
        self.banned_senders: set[PeerID] = set()
        self.banlock = asyncio.Lock()
        self.active_senders: set[PeerID] = {self.peer_id} if self.peer_id in self.sender_peer_ids else set()
        if len(self.active_senders) == len(self.sender_peer_ids):
            self.all_senders_started.set()

        self.rule, self.gate, self._refuse = rule, gate, refuse
        #: (peer ID, offence kind, reason) of every sender or reducer refused in this round.
        self.rejections: list[tuple[str, str, str]] = []
        local_index = self.ordered_peer_ids.index(self.peer_id)
        # Our own parts are the reference of a pair (it has no other), never below their floors; a peer
        # tagging along with weight 0 sends whatever its buffers hold, so they are no reference then.
        sending = self.weight > 0 and self.peer_id in self.sender_peer_ids
        self.tensor_part_container = CheckedTensorPartContainer(
            tensors, peer_fractions, return_deltas=True, rule=rule, local_index=local_index, floors=sending,
            on_bad_result=lambda index, reason: self._offend(self.ordered_peer_ids[index], "bad_result", reason),
            **kwargs)
        self.parts_for_local_averaging = self.tensor_part_container.get_raw_input_parts(local_index)
        self.tensor_part_reducer = RobustTensorPartReducer(
            tuple(part.shape for part in self.parts_for_local_averaging), len(self.sender_peer_ids), rule=rule,
            local_sender=self.sender_peer_ids.index(self.peer_id) if self.peer_id in self.sender_peer_ids else None,
            on_reject=lambda index, why: self._offend(self.sender_peer_ids[index], why.kind, why.reason),
            own_floors=self.tensor_part_container.floors_by_peer[local_index])
        for index, peer in enumerate(self.sender_peer_ids):
            if peer != self.peer_id and self._gated(peer):
                self.banned_senders.add(peer)
                self.tensor_part_reducer.on_sender_failed(index)

    def _gated(self, peer: PeerID) -> bool:
        return self.gate is not None and self.gate.is_gated(peer)

    def _offend(self, peer: PeerID, kind: str, reason: str) -> None:
        self.rejections.append((str(peer), kind, reason))
        if self.gate is not None:
            # An average with NaN or inf is never honest; one that moved ours far is a judgement.
            self.gate.offend(peer, kind, reason, certain=kind == "bad_result" and "NaN" in reason)

    def _get_peer_stub(self, peer: PeerID) -> StubBase:
        return admitted_stub(self, self._refuse, peer)

    async def _communicate_with_peer(self, peer_id: PeerID) -> None:
        if peer_id != self.peer_id and self._gated(peer_id):
            # Never hand our parts to a gated reducer, nor wait for its results: keep our own values.
            self.tensor_part_container.register_failed_reducer(self.ordered_peer_ids.index(peer_id))
            return
        await super()._communicate_with_peer(peer_id)

    async def _accumulate_parts_streaming(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                          sender_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        async for message in super()._accumulate_parts_streaming(self._screened(stream, sender_index),
                                                                 sender_index):
            yield message

    async def _screened(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                        sender_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        """Each message's declared shape, dtype, compression and byte size, checked before hivemind
        deserialises it (it restores a part in whatever dtype and encoding its sender names)."""
        shapes = self.tensor_part_reducer.part_shapes
        index = 0
        async for message in stream:
            problem = _declared_problem(message.tensor_part, index, shapes)
            if problem is not None:
                self._offend(self.sender_peer_ids[sender_index], *problem)
                raise AllreduceException(problem[1])
            index += 1
            yield message


def _declared_problem(part: Any, index: int, shapes: Sequence[torch.Size]) -> tuple[str, str] | None:
    """(offence kind, reason) for a part message that no honest peer sends, else None."""
    if index >= len(shapes):
        return "malformed_part", f"sent more than the {len(shapes)} parts expected"
    if tuple(part.size) != tuple(shapes[index]):
        return "malformed_part", f"part {index} declares shape {tuple(part.size)}"
    if part.dtype not in _WIRE_DTYPES:
        return "malformed_part", f"part {index} declares dtype {part.dtype[:20]!r}"
    compression = runtime_pb2.CompressionType.Name(part.compression) \
        if part.compression in runtime_pb2.CompressionType.values() else str(part.compression)
    if compression not in WIRE_COMPRESSIONS:
        return "malformed_part", f"part {index} declares compression {compression}"
    numel, size = math.prod(shapes[index]), len(part.buffer)
    if size > numel * _MAX_BYTES_PER_ELEMENT + _PART_FRAMING_BYTES:
        return "oversized_part", f"part {index} is {size} bytes"
    if compression == SPARSE_WIRE_NAME:
        # Its index set and headers are checked before decoding; its values then like a dense part's.
        problem = sparse_problem(part.buffer, numel)
        return ("malformed_part", f"part {index}: {problem}") if problem else None
    widths = {"NONE": _WIRE_DTYPES[part.dtype], "FLOAT16": (2,)}.get(compression, ())
    if widths and size not in {numel * width for width in widths}:
        return "malformed_part", f"part {index} is {size} bytes, not {numel} x {'/'.join(map(str, widths))}"
    return None
