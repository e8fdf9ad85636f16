"""Admission in the adapter's averagers: non-admitted callers are refused in each handler (and counted),
admitted ones reach hivemind's handler, outgoing calls to non-admitted peers never start (a leader, a
groupmate, a donor), and the RPC names stay hivemind's so checking and non-checking peers still find
each other.  The gate is a constructor argument: no class is built at run time."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import hivemind
import pytest
from hivemind.averaging.averager import DecentralizedAverager
from hivemind.optim.grad_averager import GradientAverager
from hivemind.p2p import P2PContext, PeerID, ServicerBase
from hivemind.proto import averaging_pb2

from p2ptrain.averaging.admitting import AdmissionCheck
from p2ptrain.averaging.counting import NotAdmitted, admitted_stub
from p2ptrain.averaging.hardened import AveragerLayer, HardenedAverager, HardenedGradientAverager
from p2ptrain.averaging.optimizer import HardenedOptimizer
from p2ptrain.trust.admission import AdmissionGate

FRIEND, STRANGER = "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF", "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"
GROUP = b"group"


class _Base(ServicerBase):
    """Stands in for hivemind's averager: answers every handler with one marker message."""

    async def rpc_join_group(self, request: averaging_pb2.JoinRequest, context: P2PContext,
                             ) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        yield averaging_pb2.MessageFromLeader(code=averaging_pb2.ACCEPTED)

    async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext,
                                 ) -> AsyncIterator[averaging_pb2.AveragingData]:
        async for _ in stream:
            yield averaging_pb2.AveragingData(code=averaging_pb2.AVERAGED_PART)

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest, context: P2PContext,
                                 ) -> AsyncIterator[averaging_pb2.DownloadData]:
        yield averaging_pb2.DownloadData(metadata=b"state")


class _Node(AveragerLayer, _Base):
    """The layer over the stand-in, its group registered (a groupmate's parts are served at once)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(peer_checks=False, **kwargs)
        self._running_groups = {GROUP: None}


def _gate() -> AdmissionGate:
    gate = AdmissionGate("invite")
    gate.update("invite", [FRIEND], [])
    return gate


def _collect(agen: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [item async for item in agen]

    return asyncio.run(run())


async def _parts() -> AsyncIterator[averaging_pb2.AveragingData]:
    yield averaging_pb2.AveragingData(group_id=GROUP)


def _calls(averager: Any, peer: str) -> list[list[Any]]:
    context = SimpleNamespace(remote_id=PeerID.from_base58(peer))
    return [_collect(averager.rpc_join_group(averaging_pb2.JoinRequest(), context)),
            _collect(averager.rpc_aggregate_part(_parts(), context)),
            _collect(averager.rpc_download_state(averaging_pb2.DownloadRequest(), context))]


def test_non_admitted_callers_are_refused_and_counted_admitted_ones_pass(caplog):
    caplog.set_level(logging.INFO, "p2ptrain.averaging.admitting")
    gate = _gate()
    averager = _Node(admission=gate)
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
    assert [m.code for m in part] == [averaging_pb2.AVERAGED_PART]
    assert gate.refused_total == 3 and averager.streams_serving == 0
    assert [m.code for m in _calls(_Node(), STRANGER)[1]] == [averaging_pb2.AVERAGED_PART]  # an open run


def test_a_peer_banned_later_is_refused_from_then_on():
    gate = AdmissionGate("open")
    averager = _Node(admission=gate)
    assert _calls(averager, STRANGER)[2][0].metadata == b"state"
    gate.update("open", (), [STRANGER])  # a new manifest version bans it
    assert _calls(averager, STRANGER)[2] == []


def test_outgoing_calls_to_non_admitted_peers_never_start():
    averager = _Node(admission=_gate())
    friend, stranger = PeerID.from_base58(FRIEND), PeerID.from_base58(STRANGER)
    # A donor, dialled through the averager (hivemind's own download does so too).
    assert averager.get_stub(None, friend, namespace="run") is not None  # type: ignore[arg-type]
    with pytest.raises(NotAdmitted, match=f"peer {STRANGER} is not admitted"):
        averager.get_stub(None, stranger, namespace="run")  # type: ignore[arg-type]
    assert _Node.get_stub(None, stranger, namespace="run") is not None  # type: ignore[arg-type]  # hivemind's
    # A leader: matchmaking never asks it.
    asked: list[PeerID] = []

    async def request_join_group(leader: PeerID) -> str:
        asked.append(leader)
        return "group"

    matchmaking = SimpleNamespace(_request_join_group=request_join_group, look_for_group=None)
    averager._wrap_matchmaking(matchmaking)
    assert asyncio.run(matchmaking._request_join_group(stranger)) is None
    assert asyncio.run(matchmaking._request_join_group(friend)) == "group" and asked == [friend]
    # A groupmate: the all-reduce runner never dials it.
    runner = SimpleNamespace(_servicer_type=_Node, _p2p=None, _prefix="run")
    refuse = functools.partial(averager._refuses, what="contact")
    assert admitted_stub(runner, refuse, friend) is not None  # type: ignore[arg-type]
    with pytest.raises(NotAdmitted):
        admitted_stub(runner, refuse, stranger)  # type: ignore[arg-type]


@pytest.mark.parametrize(("ours", "theirs"), [(HardenedAverager, DecentralizedAverager),
                                              (HardenedGradientAverager, GradientAverager)])
def test_rpc_names_stay_hivemind_s_and_use_the_checking_handlers(ours, theirs):
    ours._collect_rpc_handlers()
    handlers = {h.method_name: h for h in ours._rpc_handlers}
    assert {"rpc_join_group", "rpc_aggregate_part", "rpc_download_state"} <= set(handlers)
    assert handlers["rpc_aggregate_part"].stream_input and handlers["rpc_join_group"].stream_output
    assert ours._get_handle_name("run", "rpc_join_group") == f"run::{theirs.__name__}.rpc_join_group"
    assert ours.rpc_join_group is not theirs.rpc_join_group


def test_hivemind_s_traceback_for_a_skipped_donor_is_dropped():
    from p2ptrain.averaging.hardened import _DropNotAdmitted

    try:
        raise NotAdmitted("peer x is not admitted to this run")
    except NotAdmitted:
        import sys

        skipped = logging.LogRecord("hivemind.averaging.averager", logging.ERROR, "", 0, "Failed", (),
                                    sys.exc_info())
    other = logging.LogRecord("hivemind.averaging.averager", logging.ERROR, "", 0, "Failed", (), None)
    assert not _DropNotAdmitted().filter(skipped) and _DropNotAdmitted().filter(other)


def test_the_optimizer_hands_its_gradient_averager_the_gate(monkeypatch):
    monkeypatch.setattr(hivemind.Optimizer, "_make_gradient_averager", lambda self, factory, **kwargs: factory)
    optimizer = object.__new__(HardenedOptimizer)
    optimizer._parent_pid = -1  # hivemind's __del__ shuts down an optimizer its process started
    partial = functools.partial(HardenedGradientAverager, request_timeout=1.5)
    for admission in (None, _gate()):
        optimizer._admission = admission
        made = optimizer._make_gradient_averager(partial)
        assert made.func is HardenedGradientAverager
        assert made.keywords == {"request_timeout": 1.5, "admission": admission}
        plain = optimizer._make_gradient_averager(None)  # ours without the peer checks, never hivemind's own
        assert plain.func is HardenedGradientAverager
        assert plain.keywords == {"peer_checks": False, "admission": admission}


def test_refusals_are_counted_and_logged_once_per_peer(caplog):
    caplog.set_level(logging.INFO, "p2ptrain.averaging.admitting")
    gate = _gate()
    check = AdmissionCheck(gate)
    assert not check.refuses(FRIEND, "average with")
    assert check.refuses(STRANGER, "average with") and check.refuses(STRANGER, "contact")
    assert gate.refused_total == 2 and len(caplog.records) == 1
