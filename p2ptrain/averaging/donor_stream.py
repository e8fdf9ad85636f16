"""Reading state donors' streams in an averager's process: the best donors first, each stream bounded.

:class:`p2ptrain.averaging.hardened.AveragerLayer` sends ``_download_state_from_donor`` down hivemind's
pipe (hivemind's averager process calls any of its methods by name), which runs :func:`read_best_donor`:
donors ranked by their advertised priority (an unsigned number any peer can write: only plausible ones
count; gated peers and those tried already skipped; peers known to train first), each stream aborted
at the first violation of the byte bound, the tensor count or a tensor's shape.  What to make of the
state that comes back is decided in the node's process (:mod:`p2ptrain.averaging.donors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hivemind.compression import deserialize_torch_tensor
from hivemind.p2p import P2PDaemonError, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture
from hivemind.utils.streaming import combine_from_streaming
from hivemind.utils.timed_storage import ValueWithExpiration

from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.dhtkeys import all_averagers_key
from p2ptrain.trust.verdicts import MAX_EPOCH

require_hivemind(__name__)

logger = logging.getLogger(__name__)


async def read_best_donor(averager: Any, future: MPFuture, timeout: float, exclude: Sequence[str],
                          max_priority: float | None, prefer: Sequence[str], shapes: Sequence[Sequence[int]],
                          max_bytes: int) -> None:
    """Read donors' streams, best first, until one is well-formed; ``future`` gets ``{"donor", "metadata",
    "tensors", "priority", "failures"}`` (``donor`` None when none was), never an exception."""
    failures: list[tuple[str, str, str]] = []
    try:
        deadline = time.monotonic() + timeout
        for peer, priority in await _donor_candidates(averager, set(exclude), max_priority, set(prefer)):
            if time.monotonic() >= deadline:
                break
            result = await _read_state(averager, peer, shapes, max_bytes, deadline)
            if isinstance(result, tuple) and len(result) == 3:
                failures.append(result)
                continue
            future.set_result(dict(donor=str(peer), metadata=result["metadata"], tensors=result["tensors"],
                                   failures=failures, priority=priority))
            return
    except Exception as exc:
        logger.debug("looking for a state donor failed: %r", exc, exc_info=True)
    finally:
        if not future.done():
            future.set_result(dict(donor=None, failures=failures))

async def _donor_candidates(averager: Any, exclude: set[str], max_priority: float | None,
                            prefer: set[str]) -> list[tuple[PeerID, float]]:
    """Donors by priority (an unsigned number any peer can write: only plausible ones count)."""
    key = all_averagers_key(averager._matchmaking.group_key_manager.prefix)
    found = await averager.dht.get(key, latest=True, return_future=True)
    entries = found.value if found is not None and isinstance(found.value, dict) else {}
    ceiling = MAX_EPOCH if max_priority is None else min(MAX_EPOCH, max_priority)
    ranked = []
    for subkey, item in entries.items():
        value = item.value if isinstance(item, ValueWithExpiration) else None
        if not isinstance(subkey, bytes) or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if not (math.isfinite(value) and 0 <= value <= ceiling):
            continue
        peer = PeerID(subkey)
        name = str(peer)
        if peer == averager.peer_id or name in exclude or averager._is_gated(peer):
            continue
        ranked.append(((name in prefer, float(value), random.random()), peer))
    return [(peer, rank[1]) for rank, peer in sorted(ranked, key=lambda item: item[0], reverse=True)]

async def _read_state(averager: Any, peer: PeerID, shapes: Sequence[Sequence[int]], max_bytes: int,
                      deadline: float) -> dict[str, Any] | tuple[str, str, str]:
    """One donor's stream, aborted at the first violation; a (peer, offence kind, reason) on failure."""
    # A donor first gathers and serialises its state: give that more than a chunk's time (hivemind
    # waits for it without a bound); each later chunk gets the averager's chunk timeout, at least 2 s.
    chunk_timeout = max(2.0, averager.next_chunk_timeout or averager.request_timeout)
    first_timeout = max(10.0, chunk_timeout)
    metadata, received = None, 0
    tensors: list[Any] = []
    parts: list[Any] = []  # the chunks of the tensor being received
    stream = None
    try:
        stub = averager.get_stub(averager._p2p, peer, namespace=averager.prefix)
        stream = await asyncio.wait_for(stub.rpc_download_state(averaging_pb2.DownloadRequest()),
                                        timeout=min(first_timeout, max(0.1, deadline - time.monotonic())))
        async for message in _with_timeouts(stream, first_timeout, chunk_timeout):
            received += len(message.tensor_part.buffer) + len(message.metadata)
            if received > max_bytes:
                return str(peer), "bad_state", f"sent over {max_bytes} bytes"
            if time.monotonic() > deadline:
                return str(peer), "", "too slow"
            if message.metadata:
                if metadata is not None:
                    return str(peer), "bad_state", "sent its metadata twice"
                metadata = averager.serializer.loads(message.metadata)
            if message.tensor_part.dtype:  # the first chunk of the next tensor
                if parts:
                    tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
                    parts = []
                index = len(tensors)
                if index >= len(shapes):
                    return str(peer), "bad_state", f"sent more than {len(shapes)} tensors"
                declared = list(message.tensor_part.size)
                if declared != list(shapes[index]):
                    expected = list(shapes[index])
                    return str(peer), "bad_state", f"tensor {index} has shape {declared}, expected {expected}"
            elif not parts:
                if message.tensor_part.buffer:
                    return str(peer), "bad_state", "sent tensor data without a header"
                continue
            parts.append(message.tensor_part)
        if parts:
            tensors.append(deserialize_torch_tensor(combine_from_streaming(parts)))
        if metadata is not None and len(tensors) < len(shapes):
            return str(peer), "short_state", f"its stream ended after {len(tensors)} of {len(shapes)} tensors"
    except (TimeoutError, ConnectionError, OSError) as exc:
        return str(peer), "", f"{type(exc).__name__} while downloading"
    except Exception as exc:
        # p2p errors (peer gone, handler refused, a peer we will not dial) are weather; anything
        # else broke in decoding.
        weather = isinstance(exc, P2PDaemonError) or type(exc).__module__.startswith("hivemind.p2p")
        return str(peer), "" if weather else "bad_state", f"{type(exc).__name__}: {str(exc)[:80]}"
    finally:
        if stream is not None:
            with contextlib.suppress(Exception):  # closing a stream the peer already ended
                await stream.aclose()
    if metadata is None:
        return str(peer), "", "sent no state"
    return dict(metadata=metadata, tensors=tensors)



async def _with_timeouts(stream: AsyncIterator[Any], first: float, each: float) -> AsyncIterator[Any]:
    """The stream's messages, the first within ``first`` seconds, every later one within ``each``."""
    iterator, timeout = stream.__aiter__(), first
    while True:
        try:
            message = await asyncio.wait_for(iterator.__anext__(), timeout=timeout)
        except StopAsyncIteration:
            return
        yield message
        timeout = each
