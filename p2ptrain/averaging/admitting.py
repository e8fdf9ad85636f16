"""Averagers that take part only with admitted peers: the averaging and state-sharing side of a run's gate.

hivemind 1.1.12 authorizes DHT requests (see :mod:`p2ptrain.swarm.dhtauth`) but not its averagers'
own RPCs: any peer that knows an averager's address can ask to join its group, send it parts
of an all-reduce, or download its state.  :func:`admitting` makes a subclass of an averager
class whose handlers check the caller's peer ID (``context.remote_id``, authenticated by
libp2p) against the node's :class:`~p2ptrain.trust.admission.AdmissionGate`, and which never dials a
non-admitted peer itself (as a group leader, a groupmate or a state donor).

The gate lives in shared memory created before hivemind forks the averagers, so a ban or a
revocation in a new manifest version reaches these handlers at once. A refusal is counted in
the gate and logged once per peer; hivemind's own handling of a peer that does not answer (the
next leader, the next donor, a round without that part) does the rest. This module is the seam
where checks against hostile admitted peers can join later.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, AsyncIterator, Protocol, TypeVar  # noqa: UP035 - hivemind reads typing's AsyncIterator

from hivemind.averaging.averager import DecentralizedAverager
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import P2P, P2PContext, P2PDaemonError, PeerID, StubBase
from hivemind.proto import averaging_pb2

from p2ptrain.dhtkeys import state_averager_prefix

logger = logging.getLogger(__name__)

_LOGGED_PEERS = 256
_HIVEMIND_AVERAGER_LOGGER = "hivemind.averaging.averager"


class Admission(Protocol):
    """What the averagers ask the gate (``p2ptrain.trust.admission.AdmissionGate``)."""

    def is_admitted(self, peer_id: object) -> bool: ...

    def count_refusal(self) -> None: ...


class NotAdmitted(P2PDaemonError):
    """This node will not talk to that peer; hivemind treats it like a peer that cannot be reached."""


class _DropNotAdmitted(logging.Filter):
    """hivemind logs a failed state download from a donor with a traceback; a donor we skipped on
    purpose is already logged by us in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], NotAdmitted))


@functools.cache
def _quiet_hivemind() -> None:
    logging.getLogger(_HIVEMIND_AVERAGER_LOGGER).addFilter(_DropNotAdmitted())


class AdmissionMixin:
    """Put before a hivemind averager class; :func:`admitting` sets :attr:`admission`."""

    admission: Admission | None = None
    _logged: set[str]

    @classmethod
    def _refuse(cls, peer_id: object, what: str) -> bool:
        """True (and counted, logged once) when ``peer_id`` may not take part in the run."""
        admission = cls.admission
        if admission is None or admission.is_admitted(peer_id):
            return False
        admission.count_refusal()
        name = str(peer_id)
        if name not in cls._logged and len(cls._logged) < _LOGGED_PEERS:
            cls._logged.add(name)
            logger.info("refusing to %s peer %s: not admitted to this run (invite-only, banned or revoked)",
                        what, name)
        return True

    async def rpc_join_group(self, request: averaging_pb2.JoinRequest, context: P2PContext,
                             ) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        if self._refuse(context.remote_id, "take into an averaging group"):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_LOOKING_FOR_GROUP)
            return
        async for message in super().rpc_join_group(request, context):  # type: ignore[misc]
            yield message

    async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext,
                                 ) -> AsyncIterator[averaging_pb2.AveragingData]:
        if self._refuse(context.remote_id, "average with"):
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        async for message in super().rpc_aggregate_part(stream, context):  # type: ignore[misc]
            yield message

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest, context: P2PContext,
                                 ) -> AsyncIterator[averaging_pb2.DownloadData]:
        if self._refuse(context.remote_id, "serve state to"):
            return  # what hivemind answers when sharing is off: the caller asks the next donor
        async for message in super().rpc_download_state(request, context):  # type: ignore[misc]
            yield message

    @classmethod
    def get_stub(cls, p2p: P2P, peer: PeerID, *, namespace: str | None = None) -> StubBase:
        """Every outgoing averaging call (to a leader, a groupmate, a donor) starts here."""
        if cls._refuse(peer, "contact"):
            raise NotAdmitted(f"peer {peer} is not admitted to this run")
        return super().get_stub(p2p, peer, namespace=namespace)  # type: ignore[misc]


_Averager = TypeVar("_Averager", bound=DecentralizedAverager)


def admitting(base: type[_Averager], admission: Admission) -> type[_Averager]:
    """A subclass of ``base`` that refuses non-admitted peers; build it before the averager starts.

    It keeps ``base``'s name: hivemind names each RPC handler after its servicer class, and peers
    must find each other's handlers whichever of them check admission.
    """
    _quiet_hivemind()
    namespace = {"admission": admission, "_logged": set(), "__module__": base.__module__,
                 "__qualname__": base.__qualname__,
                 "_rpc_handlers": None, "_stub_type": None}  # collected afresh: with our handlers
    return type(base.__name__, (AdmissionMixin, base), namespace)


class AdmittingOptimizerMixin:
    """Put before ``hivemind.Optimizer``: the state and gradient averagers it builds check the gate.

    The subclass sets ``_admission`` before ``hivemind.Optimizer.__init__`` runs.
    """

    _admission: Admission | None = None

    def _make_state_averager(self, **kwargs: Any) -> TrainingStateAverager:
        if self._admission is None:
            return super()._make_state_averager(**kwargs)  # type: ignore[misc]
        # hivemind.Optimizer names its state averager's settings in its own _make_state_averager;
        # the same settings here, for the admitting class.
        opt: Any = self
        return admitting(TrainingStateAverager, self._admission)(
            dht=opt.dht, prefix=state_averager_prefix(opt.run_id), min_matchmaking_time=opt.matchmaking_time,
            allreduce_timeout=opt.allreduce_timeout, shutdown_timeout=opt.shutdown_timeout,
            offload_optimizer=opt.offload_optimizer, custom_gradients=opt.offload_optimizer,
            status_loglevel=opt.status_loglevel, next_chunk_timeout=opt.next_chunk_timeout,
            client_mode=opt.client_mode, auxiliary=opt.auxiliary, start=True, **kwargs)

    def _make_gradient_averager(self, factory: Any, **kwargs: Any) -> GradientAverager:
        if self._admission is not None:
            if factory is None:
                factory = GradientAverager
            if isinstance(factory, functools.partial) and isinstance(factory.func, type):
                # mypy's functools.partial plugin calls a class with an untyped (Any) base "not callable"
                factory = functools.partial(admitting(factory.func, self._admission),  # type: ignore[misc]
                                            *factory.args, **factory.keywords)
            elif isinstance(factory, type):
                factory = admitting(factory, self._admission)
            else:
                raise TypeError(f"cannot make {factory!r} check admission: pass a class or functools.partial")
        return super()._make_gradient_averager(factory, **kwargs)  # type: ignore[misc]
