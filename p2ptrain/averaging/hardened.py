"""A hardened hivemind averager: gated peers kept out, robust all-reduce, bounded donor-aware downloads.

:class:`HardenedAveragerMixin` goes first in the bases of any hivemind 1.1.12 ``DecentralizedAverager``
subclass.  It overrides (in the averager's forked process unless noted):

* ``rpc_join_group``, ``rpc_aggregate_part``, ``rpc_download_state``: a gated peer (banned, or not
  admitted to the run) is refused: never a follower in our groups, never reduced; a peer not admitted
  is never served state either (a banned one is: see ``rpc_download_state``).
* ``_step``: once per process, hivemind's matchmaking is told never to ask a gated peer to lead us.
* ``_make_runner`` (of :class:`p2ptrain.averaging.counting.CountingAveragerMixin`, which restates hivemind's
  ``_run_allreduce_inplace_`` and reports every round to :class:`RoundReports`): every round runs
  through :class:`p2ptrain.averaging.allreduce.RobustAllReduceRunner`.
* ``load_state_from_peers`` (node process): donors are tried one at a time through
  ``_download_state_from_donor`` (a new pipe target replacing ``_load_state_from_peers``), which skips
  gated peers and implausible donor priorities and aborts a stream as soon as it exceeds the byte bound,
  the tensor count or a tensor's shape; each state is then validated, a bad donor is banned and the next
  one tried (a state refused on an unconfirmed judgement, e.g. a model scoring worse than ours,
  bans nobody: in a loss spike every honest donor's does).  It returns ``(metadata, tensors)`` or
  None, and never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, AsyncIterator  # noqa: UP035  (hivemind's rpc_* annotations need typing's)

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import deserialize_torch_tensor
from hivemind.optim.grad_averager import GradientAverager
from hivemind.p2p import P2PContext, P2PDaemonError, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture
from hivemind.utils.streaming import combine_from_streaming
from hivemind.utils.timed_storage import ValueWithExpiration

from p2ptrain.averaging.allreduce import RobustAllReduceRunner
from p2ptrain.averaging.counting import CountingAveragerMixin
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.robust_reduce import ReduceRule, RoundReports
from p2ptrain.averaging.state_check import StateValidator
from p2ptrain.dhtkeys import all_averagers_key
from p2ptrain.trust.peergate import PeerGate
from p2ptrain.trust.verdicts import MAX_EPOCH, Verdict, advertised_epoch

require_hivemind(__name__)

logger = logging.getLogger(__name__)

#: Verdicts that compare a donor with what other peers report: banned for a while, not for good.
_JUDGEMENTS = frozenset({"implausible_epoch", "bad_model", "short_state"})


@dataclass(frozen=True)
class StateDownload:
    """A state that passed every check, and the peer it came from."""

    donor: str
    metadata: Any
    tensors: list[torch.Tensor]


class HardenedAveragerMixin(CountingAveragerMixin):
    """Put first in the bases of a hivemind ``DecentralizedAverager`` subclass (see the module doc);
    ``rpc_name`` keeps the hivemind class's wire name (see :class:`CountingAveragerMixin`).

    ``gate``, ``reduce_rule`` and ``round_reports`` must be created before the averager (they are
    shared with its forked process).  ``state_validator`` is required to download state;
    ``max_donor_priority`` bounds the epoch a donor may advertise (e.g. the robust global epoch + 2);
    ``known_peers`` lists peers seen training, tried first as donors.  A donor whose state is malformed
    (its own doing, whatever anyone else says) is banned for ``state_ban_seconds``; one rejected on a
    judgement against other peers' reports (an implausible epoch, a poor model) for ``judgement_ban_seconds``,
    since those reports may themselves be forged.
    """

    _gate: PeerGate | None

    def __init__(self, *args: Any, gate: PeerGate | None = None, reduce_rule: ReduceRule | None = None,
                 round_reports: RoundReports | None = None, state_validator: StateValidator | None = None,
                 max_donors: int = 4, state_ban_seconds: float = math.inf,
                 judgement_ban_seconds: float | None = None,
                 max_donor_priority: Callable[[], float | None] | None = None,
                 known_peers: Callable[[], Sequence[str]] | None = None, **kwargs: Any) -> None:
        self._gate, self._reduce_rule = gate, reduce_rule or ReduceRule()
        self.state_validator = state_validator
        self._max_donors, self._state_ban_seconds = max_donors, state_ban_seconds
        self._judgement_ban_seconds = judgement_ban_seconds
        self._max_donor_priority, self._known_peers = max_donor_priority, known_peers
        #: What the last download attempt rejected: (peer ID, reason); how many of them were offences,
        #: and how many were refused on an unconfirmed judgement (nobody blamed).
        self.last_download_rejections: list[tuple[str, str]] = []
        self._lied = self._unconfirmed = 0
        #: Where the state that passed the last download's checks came from: (donor peer ID, its metadata).
        self.last_download_source: tuple[str, Any] | None = None
        super().__init__(*args, round_reports=round_reports, **kwargs)

    def _is_gated(self, peer: Any) -> bool:
        return self._gate is not None and self._gate.is_gated(peer)

    # ------------------------------------------------------------------ who may talk to us

    async def rpc_join_group(self, request: averaging_pb2.JoinRequest,
                             context: P2PContext) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        if self._is_gated(context.remote_id):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        async for message in super().rpc_join_group(request, context):  # type: ignore[misc]
            yield message

    async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.AveragingData]:
        if self._is_gated(context.remote_id):
            yield averaging_pb2.AveragingData(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        async for message in super().rpc_aggregate_part(stream, context):
            yield message

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest,
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
        # Peers not admitted to the run are never served.  A *banned* peer still is: the usual honest
        # reason for a ban is a peer that drifted (its parameters far from ours), and it can only
        # recover by downloading; serving it costs upload that any unbanned peer could cost us anyway.
        if self._gate is not None and not self._gate.admitted(context.remote_id):
            return
        async for message in super().rpc_download_state(request, context):  # type: ignore[misc]
            yield message

    async def _step(self, **kwargs: Any) -> None:
        self._filter_leaders()
        await super()._step(**kwargs)

    def _filter_leaders(self) -> None:
        """Wrap this process's matchmaking so that a gated peer is never asked to lead our group."""
        matchmaking = self._matchmaking  # type: ignore[attr-defined]
        if self._gate is None or getattr(matchmaking, "_p2ptrain_gated", False):
            return
        ask, gate = matchmaking._request_join_group, self._gate

        async def request_join_group(leader: PeerID) -> Any:
            return None if gate.is_gated(leader) else await ask(leader)

        matchmaking._request_join_group = request_join_group
        matchmaking._p2ptrain_gated = True

    # ------------------------------------------------------------------ the all-reduce

    def _make_runner(self, **kwargs: Any) -> RobustAllReduceRunner:
        return RobustAllReduceRunner(rule=self._reduce_rule, gate=self._gate, **kwargs)

    # ------------------------------------------------------------------ state downloads (node process)

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None) -> Any:
        """A validated ``(metadata, tensors)`` from the best donor that passes every check, or None.

        Blocks (``wait`` is accepted for hivemind's signature only) and never raises."""
        download = self.download_state(timeout)
        return None if download is None else (download.metadata, download.tensors)

    def download_state(self, timeout: float | None = None) -> StateDownload | None:
        """Try donors one at a time until one's state passes the validator; ban the ones that lie."""
        self.last_download_rejections = []
        self._lied = self._unconfirmed = 0
        self.last_download_source = None
        validator = self.state_validator
        if validator is None:
            logger.warning("%s has no state validator: not downloading state", type(self).__name__)
            return None
        deadline = time.monotonic() + (timeout if timeout is not None else 300.0)
        tried: set[str] = set()
        for _ in range(self._max_donors):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            reply = self._ask_for_state(tried, validator, remaining)
            if reply is None:
                break
            for peer, kind, reason in reply["failures"]:
                tried.add(peer)
                self._reject(peer, Verdict(False, reason, kind))
            donor = reply.get("donor")
            if donor is None:
                break
            tried.add(donor)
            verdict = advertised_epoch(reply["metadata"], reply.get("priority"))
            if verdict.ok:
                verdict = validator(reply["metadata"], reply["tensors"], donor)
            if verdict.ok:
                logger.info("state from %s passed every check", donor)
                self.last_download_source = (donor, reply["metadata"])
                return StateDownload(donor, reply["metadata"], list(reply["tensors"]))
            self._reject(donor, verdict)
        if self.last_download_rejections:
            lied, unconfirmed = self._lied, self._unconfirmed
            unsure = f"; {unconfirmed} refused as worse than the reference, nobody blamed" if unconfirmed else ""
            logger.log(logging.WARNING if lied else logging.INFO, "no usable state among %d donor(s)%s%s; keeping "
                       "our own", len(self.last_download_rejections), f" ({lied} rejected as bad)" if lied else "",
                       unsure)
        return None

    def _reject(self, peer: str, verdict: Verdict) -> None:
        self.last_download_rejections.append((peer, verdict.reason))
        if verdict.unconfirmed:  # refused on a view, not a fact: nobody blamed
            self._unconfirmed += 1
            logger.info("not adopting the state of %s: %s (not blamed: a view, not a fact)", peer, verdict.reason)
            return
        self._lied += bool(verdict.kind)
        if verdict.kind and self._gate is not None:
            judged = verdict.kind in _JUDGEMENTS
            self._gate.offend(peer, verdict.kind, verdict.reason,
                              ban_seconds=self._judgement_ban_seconds if judged else self._state_ban_seconds)
        elif verdict.kind:
            logger.warning("peer %s: %s (%s)", peer, verdict.kind, verdict.reason)
        else:
            logger.info("not adopting the state of %s: %s", peer, verdict.reason)

    def _ask_for_state(self, tried: set[str], validator: StateValidator, timeout: float) -> dict[str, Any] | None:
        future: MPFuture = MPFuture()
        priority = self._max_donor_priority() if self._max_donor_priority is not None else None
        known = list(self._known_peers()) if self._known_peers is not None else []
        try:
            self._outer_pipe.send(("_download_state_from_donor", [], dict(  # type: ignore[attr-defined]
                future=future, timeout=timeout, exclude=sorted(tried), max_priority=priority, prefer=known,
                shapes=[list(shape) for shape in validator.template.shapes],
                max_bytes=validator.template.max_wire_bytes())))
            return future.result(timeout=timeout + 5.0)
        except Exception as exc:  # the averager process gone or stuck: no state this time
            logger.warning("state download failed: %r", exc)
            return None

    # ------------------------------------------------------------------ state downloads (averager process)

    async def _download_state_from_donor(self, future: MPFuture, timeout: float, exclude: Sequence[str],
                                         max_priority: float | None, prefer: Sequence[str],
                                         shapes: Sequence[Sequence[int]], max_bytes: int) -> None:
        failures: list[tuple[str, str, str]] = []
        try:
            deadline = time.monotonic() + timeout
            for peer, priority in await self._donor_candidates(set(exclude), max_priority, set(prefer)):
                if time.monotonic() >= deadline:
                    break
                result = await self._read_state(peer, shapes, max_bytes, deadline)
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

    async def _donor_candidates(self, exclude: set[str], max_priority: float | None,
                                prefer: set[str]) -> list[tuple[PeerID, float]]:
        """Donors by priority (an unsigned number any peer can write: only plausible ones count)."""
        key = all_averagers_key(self._matchmaking.group_key_manager.prefix)  # type: ignore[attr-defined]
        found = await self.dht.get(key, latest=True, return_future=True)  # type: ignore[attr-defined]
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
            if peer == self.peer_id or name in exclude or self._is_gated(peer):  # type: ignore[attr-defined]
                continue
            ranked.append(((name in prefer, float(value), random.random()), peer))
        return [(peer, rank[1]) for rank, peer in sorted(ranked, key=lambda item: item[0], reverse=True)]

    async def _read_state(self, peer: PeerID, shapes: Sequence[Sequence[int]], max_bytes: int,
                          deadline: float) -> dict[str, Any] | tuple[str, str, str]:
        """One donor's stream, aborted at the first violation; a (peer, offence kind, reason) on failure."""
        # A donor first gathers and serialises its state: give that more than a chunk's time (hivemind
        # waits for it without a bound); each later chunk gets the averager's chunk timeout, at least 2 s.
        chunk_timeout = max(2.0, self.next_chunk_timeout or self.request_timeout)  # type: ignore[attr-defined]
        first_timeout = max(10.0, chunk_timeout)
        stub = self.get_stub(self._p2p, peer, namespace=self.prefix)  # type: ignore[attr-defined]
        metadata, tensors, received = None, [], 0
        parts: list[Any] = []  # the chunks of the tensor being received
        stream = None
        try:
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
                    metadata = self.serializer.loads(message.metadata)  # type: ignore[attr-defined]
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


class HardenedAverager(HardenedAveragerMixin, DecentralizedAverager):
    """A plain hivemind averager, hardened (DiLoCo's pseudo-gradient averager builds on it)."""

    rpc_name = "DecentralizedAverager"


class HardenedGradientAverager(HardenedAveragerMixin, GradientAverager):
    """hivemind's gradient averager, hardened.  ``load_state_from_peers`` downloads nothing: hivemind's
    optimizer throws this averager's downloaded state away (its gradients are reset right after)."""

    rpc_name = "GradientAverager"

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None) -> None:
        return None
