"""The one layer of overrides over hivemind's averagers, and the hardened plain and gradient averagers.

hivemind's ``GradientAverager`` and ``TrainingStateAverager`` are ``DecentralizedAverager`` s, so the
overrides every averager of ours needs live in one class, :class:`AveragerLayer`, put first in the bases
of one subclass per hivemind class (:class:`HardenedAverager`, :class:`HardenedGradientAverager`,
:class:`p2ptrain.averaging.state_download.SafeTrainingStateAverager`,
:class:`p2ptrain.averaging.diloco.DiLoCoAverager`).  What the overrides decide comes from policy objects
given to the constructor, each tested without hivemind:

* an owned run's admission (:class:`~p2ptrain.averaging.admitting.AdmissionCheck`; None for open runs),
* the peer gate and the per-sender checks of a robust all-reduce (:class:`~p2ptrain.trust.peergate.PeerGate`,
  :class:`~p2ptrain.averaging.robust_reduce.ReduceRule`; ``peer_checks=False``: hivemind's all-reduce, counted),
* round reports (:class:`~p2ptrain.averaging.robust_reduce.RoundReports`),
* serving groupmates (:class:`~p2ptrain.averaging.groupmates.GroupmateService`),
* validated state downloads (:class:`~p2ptrain.averaging.donors.StateDownloads`).

It overrides (hivemind 1.1.12, in the averager's forked process unless noted; every one is listed
in :mod:`p2ptrain.averaging.pinned`):

* ``_get_handle_name``, ``_collect_rpc_handlers``: the hivemind class's wire names (``rpc_name``),
  so nodes with and without our classes still find each other.
* ``rpc_join_group``, ``rpc_aggregate_part``, ``rpc_download_state``: a peer not admitted to the run,
  or gated (banned), is refused (a banned one is still served state: see ``rpc_download_state``); a
  groupmate's parts wait (bounded) for our own trigger, and are counted while served.
* ``get_stub`` (on an instance only; node process too): never dial a peer not admitted.
* ``_step``: matchmaking's group reads paced (:mod:`p2ptrain.averaging.matchmaking`), a gated or
  non-admitted peer never asked to lead us (``Matchmaking._request_join_group``, wrapped), every
  search noted (``Matchmaking.look_for_group``, wrapped).
* ``_register_allreduce_group``, ``shutdown`` (node process): groupmates served, not cut off.
* ``_run_allreduce_inplace_`` (restated from hivemind's): every round runs through our runner
  (:mod:`p2ptrain.averaging.allreduce` or :mod:`p2ptrain.averaging.counting`) and ends in a report.
* ``load_state_from_peers`` (node process), with the checks: donors tried one at a time through
  ``_download_state_from_donor`` (a new pipe target beside hivemind's ``_load_state_from_peers``),
  which reads the donors' streams (:mod:`p2ptrain.averaging.donor_stream`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, AsyncIterator, ClassVar  # noqa: UP035  (hivemind's rpc_* annotations need typing's)

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.group_info import GroupInfo
from hivemind.optim.grad_averager import GradientAverager
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase, StubBase
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.asyncio import as_aiter, azip

from p2ptrain.averaging.admitting import Admission, AdmissionCheck
from p2ptrain.averaging.allreduce import RobustAllReduceRunner
from p2ptrain.averaging.counting import CountingAllReduceRunner, NotAdmitted
from p2ptrain.averaging.donor_stream import read_best_donor
from p2ptrain.averaging.donors import StateDownload, StateDownloads
from p2ptrain.averaging.groupmates import GroupmateService
from p2ptrain.averaging.matchmaking import pace_group_polls
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.robust_reduce import AllReduceReport, ReduceRule, RoundReports
from p2ptrain.averaging.state_check import StateValidator
from p2ptrain.model.device import HostStaging
from p2ptrain.trust.peergate import PeerGate
from p2ptrain.waiting import Stopping, answer_unless_stopping

require_hivemind(__name__)

logger = logging.getLogger(__name__)

__all__ = ["AveragerLayer", "HardenedAverager", "HardenedGradientAverager", "NotAdmitted", "StateDownload"]

_HIVEMIND_AVERAGER_LOGGER = "hivemind.averaging.averager"


class _DropNotAdmitted(logging.Filter):
    """hivemind logs a failed state download from a donor with a traceback; a donor we skipped on
    purpose is already logged by us in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], NotAdmitted))


@functools.cache
def _quiet_hivemind() -> None:
    logging.getLogger(_HIVEMIND_AVERAGER_LOGGER).addFilter(_DropNotAdmitted())


def _never() -> bool:
    return False


class _AdmittedStubs:
    """``get_stub``: hivemind's classmethod when called on the class (matchmaking and the all-reduce
    runner do: :class:`AveragerLayer` checks their peers itself); on an averager with an admission gate,
    a refusal first (hivemind's own state download dials donors through the instance)."""

    def __get__(self, instance: Any, owner: type) -> Callable[..., StubBase]:
        plain = ServicerBase.__dict__["get_stub"].__get__(None, owner)
        admission: AdmissionCheck | None = getattr(instance, "_admission", None) if instance is not None else None
        if admission is None:
            return plain

        def get_stub(p2p: P2P, peer: PeerID, *, namespace: str | None = None) -> StubBase:
            if admission.refuses(peer, "contact"):
                raise NotAdmitted(f"peer {peer} is not admitted to this run")
            return plain(p2p, peer, namespace=namespace)

        return get_stub


class AveragerLayer:
    """Put first in the bases of a hivemind ``DecentralizedAverager`` subclass (see the module doc).

    ``rpc_name``: the wire name of the hivemind class it replaces (None: the class's own name).
    ``admission``: an owned run's gate (None: an open run).  ``peer_checks``: the gate (``gate``),
    a robust all-reduce (``reduce_rule``) and validated downloads (``state_validator``, ``max_donors``,
    the ban times; ``max_donor_priority`` bounds the epoch a donor may advertise, ``known_peers`` are
    tried first); without them hivemind's all-reduce (counted) and downloads.  ``round_reports`` and
    ``gate`` must be created before the averager: they are shared with its forked process.
    """

    _rpc_handlers: ClassVar[Any]  # hivemind's ServicerBase cache (declared only: see _collect_rpc_handlers)

    rpc_name: str | None = None
    get_stub = _AdmittedStubs()

    def __init__(self, *args: Any, admission: Admission | None = None, peer_checks: bool = True,
                 gate: PeerGate | None = None, reduce_rule: ReduceRule | None = None,
                 round_reports: RoundReports | None = None, state_validator: StateValidator | None = None,
                 max_donors: int = 4, state_ban_seconds: float = math.inf,
                 judgement_ban_seconds: float | None = None,
                 max_donor_priority: Callable[[], float | None] | None = None,
                 known_peers: Callable[[], Sequence[str]] | None = None,
                 serve_grace: float | None = None, **kwargs: Any) -> None:
        if not peer_checks and gate is not None:
            raise ValueError("a peer gate needs the peer checks")
        self._admission = AdmissionCheck(admission) if admission is not None else None
        if admission is not None:
            _quiet_hivemind()
        self._peer_checks, self._gate = peer_checks, gate
        self._reduce_rule = reduce_rule or ReduceRule()
        self._round_reports = round_reports
        self._downloads = StateDownloads(gate, validator=state_validator, max_donors=max_donors,
                                         state_ban_seconds=state_ban_seconds,
                                         judgement_ban_seconds=judgement_ban_seconds) if peer_checks else None
        self._max_donor_priority, self._known_peers = max_donor_priority, known_peers
        #: True once the node is stopping: a state download in progress is then given up within a second
        #: (the optimizer that owns this averager sets it; a test's averager never stops).
        self.stopping: Callable[[], bool] = _never
        # Before the base class starts the averager's process: the count of streams served is shared.
        self._groupmates = GroupmateService(serve_grace)
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ wire names

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        handle = f"{cls.rpc_name or cls.__name__}.{method_name}"
        return handle if namespace is None else f"{namespace}::{handle}"

    @classmethod
    def _collect_rpc_handlers(cls) -> None:
        # hivemind caches handlers and stubs in a class attribute that subclasses inherit: a stub made
        # for a parent class would call the parent's RPC names.  Each of our classes makes its own.
        if "_rpc_handlers" not in cls.__dict__:
            cls._rpc_handlers = None
        super()._collect_rpc_handlers()  # type: ignore[misc]

    # ------------------------------------------------------------------ who may talk to us

    def _refuses(self, peer: Any, what: str) -> bool:
        return self._admission is not None and self._admission.refuses(peer, what)

    def _is_gated(self, peer: Any) -> bool:
        return self._gate is not None and self._gate.is_gated(peer)

    async def rpc_join_group(self, request: averaging_pb2.JoinRequest,
                             context: P2PContext) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        if self._refuses(context.remote_id, "take into an averaging group"):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_LOOKING_FOR_GROUP)
            return
        if self._is_gated(context.remote_id):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        async for message in super().rpc_join_group(request, context):  # type: ignore[misc]
            yield message

    async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.AveragingData]:
        if self._refuses(context.remote_id, "average with"):
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        if self._is_gated(context.remote_id):
            yield averaging_pb2.AveragingData(code=averaging_pb2.PROTOCOL_VIOLATION)
            return
        answer = super().rpc_aggregate_part  # type: ignore[misc]
        async for message in self._groupmates.serve(
                stream, lambda request: request.group_id, self._running_groups,  # type: ignore[attr-defined]
                self.serve_grace(), lambda parts: answer(parts, context)):
            yield message

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest,
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
        if self._refuses(context.remote_id, "serve state to"):
            return  # what hivemind answers when sharing is off: the caller asks the next donor
        # Peers not admitted to the run are never served.  A *banned* peer still is: the usual honest
        # reason for a ban is a peer that drifted (its parameters far from ours), and it can only
        # recover by downloading; serving it costs upload that any unbanned peer could cost us anyway.
        if self._gate is not None and not self._gate.admitted(context.remote_id):
            return
        async for message in super().rpc_download_state(request, context):  # type: ignore[misc]
            yield message

    # ------------------------------------------------------------------ matchmaking

    async def _step(self, **kwargs: Any) -> None:
        matchmaking = self._matchmaking  # type: ignore[attr-defined]
        pace_group_polls(matchmaking)
        self._wrap_matchmaking(matchmaking)
        try:
            await super()._step(**kwargs)  # type: ignore[misc]
        finally:
            self._groupmates.step_ended(kwargs.get("step"))

    def _wrap_matchmaking(self, matchmaking: Any) -> None:
        """Once per process: a gated or non-admitted peer is never asked to lead our group, and every
        search and the group it finds are noted for serving groupmates."""
        if getattr(matchmaking, "_p2ptrain_wrapped", False):
            return
        ask, look_for_group = matchmaking._request_join_group, matchmaking.look_for_group

        async def request_join_group(leader: PeerID) -> Any:
            if self._is_gated(leader) or self._refuses(leader, "contact"):
                return None
            return await ask(leader)

        async def noted_look_for_group(step: Any) -> GroupInfo | None:
            return await self._groupmates.search(look_for_group, step)

        matchmaking._request_join_group = request_join_group
        matchmaking.look_for_group = noted_look_for_group
        matchmaking._p2ptrain_wrapped = True

    # ------------------------------------------------------------------ serving groupmates

    def serve_grace(self) -> float:
        """The longest a groupmate's stream waits for our trigger, and our shutdown for its readers."""
        return self._groupmates.grace(getattr(self, "next_chunk_timeout", None))

    @property
    def streams_serving(self) -> int:
        """The all-reduce streams this averager is answering right now (read from any process)."""
        return self._groupmates.streams_serving

    @contextlib.contextmanager
    def _register_allreduce_group(self, group_info: GroupInfo) -> Iterator[None]:
        with super()._register_allreduce_group(group_info):  # type: ignore[misc]
            self._groupmates.registered(group_info.group_id)
            yield

    def finish_serving(self, sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> float:
        """Wait (bounded) until no groupmate is still reading averages from us; returns the seconds waited."""
        return self._groupmates.finish_serving(self.serve_grace(), sleep=sleep, clock=clock)

    def shutdown(self) -> None:
        self.finish_serving()
        super().shutdown()  # type: ignore[misc]

    # ------------------------------------------------------------------ the all-reduce

    def _make_runner(self, **kwargs: Any) -> AllReduceRunner:
        """The runner of one round (``kwargs``: what hivemind gives its ``AllReduceRunner``)."""
        refuse = functools.partial(self._refuses, what="contact") if self._admission is not None else None
        if not self._peer_checks:
            return CountingAllReduceRunner(refuse=refuse, **kwargs)
        return RobustAllReduceRunner(rule=self._reduce_rule, gate=self._gate, refuse=refuse, **kwargs)

    async def _run_allreduce_inplace_(self, tensors: Sequence[torch.Tensor], group_info: GroupInfo,
                                      group_id: bytes | None = None, **kwargs: Any) -> None:
        # hivemind 1.1.12's DecentralizedAverager._run_allreduce_inplace_ with our runner and a report.
        group_id = group_info.group_id if group_id is None else group_id
        runner = self._make_runner(
            p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors,  # type: ignore[attr-defined]
            group_id=group_id, ordered_peer_ids=group_info.peer_ids, **kwargs)
        assert group_id in self._running_groups, f"group {group_id!r} was not registered"  # type: ignore[attr-defined]
        self._running_groups[group_id].set_result(runner)  # type: ignore[attr-defined]
        ok = False
        try:
            if runner.modes[group_info.peer_ids.index(self.peer_id)] != AveragingMode.AUX:  # type: ignore[attr-defined]
                async for tensor, update in azip(as_aiter(*tensors), runner):
                    tensor.add_(update, alpha=self._averaging_alpha)  # type: ignore[attr-defined]
                    self.last_updated = get_dht_time()
                # hivemind sets this per tensor: each set re-declares this peer as a state donor (a
                # DHT store sent to every peer), one per averaged tensor every round.  Once per round
                # says the same.
                self._state_updated.set()  # type: ignore[attr-defined]
            else:
                async for _ in runner:
                    raise ValueError("aux peers should not receive averaged tensors")
            ok = True
        finally:
            self._report_round(runner, group_info, ok)

    def _report_round(self, runner: Any, group_info: GroupInfo, ok: bool) -> None:
        if self._round_reports is None:
            return
        reducer, container = runner.tensor_part_reducer, runner.tensor_part_container
        self._round_reports.put(AllReduceReport(
            averager=self.prefix, group_size=len(group_info.peer_ids),  # type: ignore[attr-defined]
            peers=tuple(str(peer) for peer in group_info.peer_ids),
            senders=len(runner.sender_peer_ids),
            contributions_expected=reducer.num_parts * len(runner.sender_peer_ids),
            contributions_received=reducer.contributions_accepted,
            results_expected=container.total_size, results_received=container.total_size - container.failed_size,
            rejected=tuple(runner.rejections), clipped=reducer.clipped, ok=ok, finished_at=time.time(),
            # Each accepted sender's weight as the reduce rule capped it: what this round vouches for.
            weights=tuple((str(runner.sender_peer_ids[index]), float(weight))
                          for index, weight in getattr(reducer, "weights", {}).items())))

    # ------------------------------------------------------------------ state downloads (node process)

    @property
    def state_validator(self) -> StateValidator | None:
        return self._downloads.validator if self._downloads is not None else None

    @state_validator.setter
    def state_validator(self, validator: StateValidator | None) -> None:
        if self._downloads is not None:
            self._downloads.validator = validator

    @property
    def last_download_rejections(self) -> list[tuple[str, str]]:
        """What the last download attempt rejected: (peer ID, reason)."""
        return self._downloads.rejections if self._downloads is not None else []

    @property
    def last_download_source(self) -> tuple[str, Any] | None:
        """Where the state that passed the last download's checks came from: (donor peer ID, its metadata)."""
        return self._downloads.source if self._downloads is not None else None

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None) -> Any:
        """With the peer checks: a validated ``(metadata, tensors)`` from the best donor that passes every
        check, or None; it blocks (``wait`` is accepted for hivemind's signature only) and never raises.
        Without them, hivemind's download."""
        if self._downloads is None:
            return super().load_state_from_peers(wait=wait, timeout=timeout)  # type: ignore[misc]
        download = self.download_state(timeout)
        return None if download is None else (download.metadata, download.tensors)

    def download_state(self, timeout: float | None = None) -> StateDownload | None:
        """Try donors one at a time until one's state passes the validator; ban the ones that lie."""
        if self._downloads is None:
            return None
        return self._downloads.download(self._ask_for_state, timeout, what=type(self).__name__)

    def _ask_for_state(self, tried: set[str], validator: StateValidator, timeout: float) -> dict[str, Any] | None:
        future: MPFuture = MPFuture()
        priority = self._max_donor_priority() if self._max_donor_priority is not None else None
        known = list(self._known_peers()) if self._known_peers is not None else []
        try:
            self._outer_pipe.send(("_download_state_from_donor", [], dict(  # type: ignore[attr-defined]
                future=future, timeout=timeout, exclude=sorted(tried), max_priority=priority, prefer=known,
                shapes=[list(shape) for shape in validator.template.shapes],
                max_bytes=validator.template.max_wire_bytes())))
            return answer_unless_stopping(future, timeout + 5.0, self.stopping)
        except Stopping:
            logger.info("state download cut short: this node is stopping")
            return None
        except Exception as exc:  # the averager process gone or stuck: no state this time
            logger.warning("state download failed: %r", exc)
            return None

    # ------------------------------------------------------------------ state downloads (averager process)

    async def _download_state_from_donor(self, future: MPFuture, **request: Any) -> None:
        """The donors' streams, read in this averager's process
        (:func:`~p2ptrain.averaging.donor_stream.read_best_donor`)."""
        await read_best_donor(self, future, **request)


class HardenedAverager(AveragerLayer, DecentralizedAverager):
    """hivemind's plain averager through the layer (DiLoCo's averager builds on the same bases)."""

    rpc_name = "DecentralizedAverager"


class HardenedGradientAverager(AveragerLayer, GradientAverager):
    """hivemind's gradient averager through the layer.  With the peer checks ``load_state_from_peers``
    downloads nothing: hivemind's optimizer throws this averager's downloaded state away (its
    gradients are reset right after)."""

    rpc_name = "GradientAverager"

    @torch.no_grad()
    def load_accumulators_into_averager_(self) -> None:
        """hivemind's, with the device-to-host copy made explicit: accumulators on a GPU go to the averager's
        host buffers through pinned memory, one wait for the whole transfer instead of one per tensor."""
        accumulators = list(self._grad_accumulators())
        if not accumulators or accumulators[0].device.type == "cpu":
            super().load_accumulators_into_averager_()
            return
        times = self.local_times_accumulated
        scale = 1.0 / times if times else 0.0
        staging = getattr(self, "_staging", None)
        if staging is None:  # made on first use, in the node's process (the averager's never sees a GPU)
            staging = self._staging = HostStaging(accumulators, accumulators[0].device)
        with self.get_tensors() as averaged:
            staging.to_host(accumulators, averaged)
            for tensor in averaged:
                tensor.mul_(scale)

    def load_state_from_peers(self, wait: bool = True, timeout: float | None = None) -> Any:
        if self._peer_checks:
            return None
        return super().load_state_from_peers(wait=wait, timeout=timeout)
