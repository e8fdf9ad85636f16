"""Admitting averagers: non-admitted callers are refused in each handler (and counted), admitted ones
reach hivemind's handler, outgoing calls to non-admitted peers never start, and the RPC names stay
hivemind's so checking and non-checking peers still find each other."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from hivemind.averaging.averager import DecentralizedAverager
from hivemind.optim.grad_averager import GradientAverager
from hivemind.p2p import P2PContext, PeerID, ServicerBase
from hivemind.proto import averaging_pb2

from p2ptrain.averaging.admitting import AdmittingOptimizerMixin, NotAdmitted, admitting
from p2ptrain.trust.admission import AdmissionGate

FRIEND, STRANGER = "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF", "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"


class _Base(ServicerBase):
    """Stands in for hivemind's averager: answers every handler with one marker message."""

    async def rpc_join_group(self, request: averaging_pb2.JoinRequest, context: P2PContext,
                             ) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        yield averaging_pb2.MessageFromLeader(code=averaging_pb2.ACCEPTED)

    async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext,
                                 ) -> AsyncIterator[averaging_pb2.AveragingData]:
        yield averaging_pb2.AveragingData(code=averaging_pb2.AVERAGED_PART)

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest, context: P2PContext,
                                 ) -> AsyncIterator[averaging_pb2.DownloadData]:
        yield averaging_pb2.DownloadData(metadata=b"state")


def _gate() -> AdmissionGate:
    gate = AdmissionGate("invite")
    gate.update("invite", [FRIEND], [])
    return gate


def _collect(agen: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [item async for item in agen]

    return asyncio.run(run())


def _calls(averager: Any, peer: str) -> list[list[Any]]:
    context = SimpleNamespace(remote_id=PeerID.from_base58(peer))
    return [_collect(averager.rpc_join_group(averaging_pb2.JoinRequest(), context)),
            _collect(averager.rpc_aggregate_part(None, context)),
            _collect(averager.rpc_download_state(averaging_pb2.DownloadRequest(), context))]


def test_non_admitted_callers_are_refused_and_counted_admitted_ones_pass(caplog):
    caplog.set_level(logging.INFO, "p2ptrain.averaging.admitting")
    gate = _gate()
    averager = object.__new__(admitting(_Base, gate))
    join, part, state = _calls(averager, STRANGER)
    assert [m.code for m in join] == [averaging_pb2.NOT_LOOKING_FOR_GROUP]
    assert [m.code for m in part] == [averaging_pb2.BAD_GROUP_ID]
    assert state == []  # no state at all: the caller asks the next donor
    assert gate.refused_total == 3
    assert [r.getMessage() for r in caplog.records] == [  # once per peer, not per request
        f"refusing to take into an averaging group peer {STRANGER}: not admitted to this run "
        "(invite-only, banned or revoked)"]
    join, part, state = _calls(averager, FRIEND)
    assert [m.code for m in join] == [averaging_pb2.ACCEPTED] and state[0].metadata == b"state"
    assert gate.refused_total == 3


def test_a_peer_banned_later_is_refused_from_then_on():
    gate = AdmissionGate("open")
    averager = object.__new__(admitting(_Base, gate))
    assert _calls(averager, STRANGER)[2][0].metadata == b"state"
    gate.update("open", (), [STRANGER])  # a new manifest version bans it
    assert _calls(averager, STRANGER)[2] == []


def test_outgoing_calls_to_non_admitted_peers_never_start():
    cls = admitting(_Base, _gate())
    assert cls.get_stub(None, PeerID.from_base58(FRIEND), namespace="run") is not None  # type: ignore[arg-type]
    with pytest.raises(NotAdmitted, match=f"peer {STRANGER} is not admitted"):
        cls.get_stub(None, PeerID.from_base58(STRANGER), namespace="run")  # type: ignore[arg-type]


def test_rpc_names_stay_hivemind_s_and_use_the_checking_handlers():
    cls = admitting(DecentralizedAverager, _gate())
    assert cls.__name__ == "DecentralizedAverager" and issubclass(cls, DecentralizedAverager)
    cls._collect_rpc_handlers()
    handlers = {h.method_name: h for h in cls._rpc_handlers}
    assert {"rpc_join_group", "rpc_aggregate_part", "rpc_download_state"} <= set(handlers)
    assert handlers["rpc_aggregate_part"].stream_input and handlers["rpc_join_group"].stream_output
    assert cls._get_handle_name("run", "rpc_join_group") == "run::DecentralizedAverager.rpc_join_group"
    assert cls.rpc_join_group is not DecentralizedAverager.rpc_join_group


def test_hivemind_s_traceback_for_a_skipped_donor_is_dropped():
    from p2ptrain.averaging.admitting import _DropNotAdmitted

    try:
        raise NotAdmitted("peer x is not admitted to this run")
    except NotAdmitted:
        import sys

        skipped = logging.LogRecord("hivemind.averaging.averager", logging.ERROR, "", 0, "Failed", (),
                                    sys.exc_info())
    other = logging.LogRecord("hivemind.averaging.averager", logging.ERROR, "", 0, "Failed", (), None)
    assert not _DropNotAdmitted().filter(skipped) and _DropNotAdmitted().filter(other)


class _FakeOptimizerBase:
    def _make_gradient_averager(self, factory: Any, **kwargs: Any) -> Any:
        return factory


class _Optimizer(AdmittingOptimizerMixin, _FakeOptimizerBase):
    pass


def test_the_optimizer_s_gradient_averager_factory_is_made_admitting():
    optimizer = _Optimizer()
    partial = functools.partial(GradientAverager, request_timeout=1.5)
    assert optimizer._make_gradient_averager(partial) is partial  # no gate: untouched
    optimizer._admission = _gate()
    made = optimizer._make_gradient_averager(partial)
    assert made.keywords == {"request_timeout": 1.5} and made.func.admission is optimizer._admission
    assert issubclass(made.func, GradientAverager) and made.func is not GradientAverager
    assert optimizer._make_gradient_averager(None).admission is optimizer._admission
    with pytest.raises(TypeError, match="cannot make"):
        optimizer._make_gradient_averager(lambda **kw: None)
