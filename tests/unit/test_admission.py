"""Admission: the shared gate (read from forked processes), record filtering, and the DHT authorizer's
token checks, exercised through hivemind's own request signing without starting a DHT."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from pathlib import Path
from types import SimpleNamespace

import pytest
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import TokenAuthorizerBase
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.config.schema import ConfigError
from p2ptrain.run.invite import InviteError, issue_invite
from p2ptrain.run.owner import OwnerKey
from p2ptrain.status import NodeState, PeerRecord
from p2ptrain.swarm.dhtauth import InviteAuthorizer, peer_id_of_public_key
from p2ptrain.swarm.identity import IdentityKey, ensure_identity, peer_id_of_identity
from p2ptrain.trust.admission import AdmissionGate, filter_view
from p2ptrain.trust.swarm_view import summarize

A, B, C = ("QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF", "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3",
           "Qmb4VdreyqThHr97gkPTcBQ6Sv7KRL7XRhM3acdKjeGwNk")


def test_open_gate_admits_all_but_excluded_invite_gate_only_admitted():
    gate = AdmissionGate("open")
    assert gate.is_admitted(A) and gate.policy == "open"
    gate.update("open", (), [B])
    assert gate.is_admitted(A) and not gate.is_admitted(B) and gate.is_excluded(B)
    gate.update("invite", [A, B], [B])
    assert gate.policy == "invite" and gate(A) and not gate(B) and not gate(C)


def _child(gate: AdmissionGate, ready, go, out) -> None:
    ready.set()
    go.wait(10)
    out.put((gate.is_admitted(A), gate.is_admitted(B), gate.policy))


def test_updates_reach_processes_forked_before_them():
    gate = AdmissionGate("invite")
    gate.update("invite", [A], [])
    assert gate(A)  # the parent's local copy is filled before the fork, like a running node's
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_child, args=(gate, ready, go, out))
    child.start()
    try:
        assert ready.wait(10)
        gate.update("invite", [B], [A])
        go.set()
        assert out.get(timeout=10) == (False, True, "invite")
    finally:
        child.join(10)


def test_overflowing_lists_keep_capacity_and_refuse_the_rest():
    gate = AdmissionGate("invite", capacity=2)
    gate.update("invite", [A, B, C], [])
    assert sum(gate(p) for p in (A, B, C)) == 2


def test_filter_view_drops_records_of_non_admitted_peers():
    records = tuple(PeerRecord(peer_id=p, state=NodeState.TRAINING.value, epoch=e, samples_per_second=s)
                    for p, e, s in ((A, 3, 10.0), (B, 999, 500.0), (C, 4, 20.0)))
    view = summarize(records, rejected_total=2)
    gate = AdmissionGate("open")
    gate.update("open", (), [B])
    kept, dropped = filter_view(view, gate.is_admitted)
    assert dropped == 1 and [r.peer_id for r in kept.peers] == [A, C]
    assert kept.global_epoch == 4 and kept.swarm_samples_per_second == 30.0 and kept.rejected_records_total == 2
    assert filter_view(view, lambda _peer: True) == (view, 0)


# --- the DHT authorizer ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run():
    key = OwnerKey.generate()
    return key, key.ref("private")


@pytest.fixture(scope="module")
def keys():
    return [RSAPrivateKey() for _ in range(3)]


def _peer(key: RSAPrivateKey) -> str:
    return peer_id_of_public_key(key.get_public_key().to_bytes())


def _authorizer(run, key, *, gate=None, clock=lambda: 1_800_000_000.0, days=30.0):
    owner, ref = run
    token = issue_invite(owner, ref, _peer(key), days, now=1_800_000_000.0)
    return InviteAuthorizer(ref, token, key, gate or AdmissionGate("invite"), clock=clock)


def test_peer_id_of_a_key_matches_hivemind_and_the_identity_file(tmp_path: Path):
    path = tmp_path / "identity.key"
    ensure_identity(path)
    ensure_identity(path)  # idempotent: an existing identity is kept
    key = IdentityKey.from_file(path).hivemind_key()
    assert _peer(key) == peer_id_of_identity(path) == PeerID.from_identity(path.read_bytes()).to_base58()
    with pytest.raises(ConfigError, match="no such file"):
        peer_id_of_identity(tmp_path / "missing.key")


def test_own_invite_must_hold_at_start(run, keys):
    owner, ref = run
    other_peers_token = issue_invite(owner, ref, _peer(keys[1]), 30, now=1_800_000_000.0)
    with pytest.raises(InviteError, match="invite is for peer"):
        InviteAuthorizer(ref, other_peers_token, keys[0], AdmissionGate("invite"), clock=lambda: 1_800_000_000.0)
    with pytest.raises(InviteError, match="expired"):
        _authorizer(run, keys[0], clock=lambda: 1_800_000_000.0 + 31 * 86400)
    gate = AdmissionGate("invite")
    gate.update("invite", [], [_peer(keys[0])])
    with pytest.raises(InviteError, match="banned or its invite revoked"):
        _authorizer(run, keys[0], gate=gate)


def _signed_ping(authorizer: TokenAuthorizerBase) -> dht_pb2.PingRequest:
    request = dht_pb2.PingRequest()
    asyncio.run(authorizer.sign_request(request, None))
    return request


def test_invited_requests_pass_through_hivemind_signing(run, keys):
    a, b = _authorizer(run, keys[0]), _authorizer(run, keys[1])
    assert asyncio.run(a.validate_request(_signed_ping(b)))
    assert asyncio.run(b.validate_request(_signed_ping(a)))
    assert a.refused_total == 0


class _Borrower(TokenAuthorizerBase):
    """A stranger presenting an invited peer's token with its own key (what a copied token allows)."""

    def __init__(self, key: RSAPrivateKey, token: AccessToken) -> None:
        super().__init__(key)
        self._token = token

    async def get_token(self) -> AccessToken:
        return self._token

    def is_token_valid(self, access_token: AccessToken) -> bool:
        return True

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        return False


def test_strangers_borrowed_tokens_revoked_and_expired_peers_are_refused(run, keys):
    owner, ref = run
    now = [1_800_000_000.0]
    gate = AdmissionGate("invite")
    a = _authorizer(run, keys[0], gate=gate, clock=lambda: now[0])
    b = _authorizer(run, keys[1])
    b_token = asyncio.run(b.get_token())

    no_invite = AccessToken(public_key=keys[2].get_public_key().to_bytes())
    assert not asyncio.run(a.validate_request(_signed_ping(_Borrower(keys[2], no_invite))))
    # b's token with the stranger's key: the invite names b, the key is not b's
    borrowed_name = AccessToken(username=b_token.username, public_key=keys[2].get_public_key().to_bytes())
    assert not asyncio.run(a.validate_request(_signed_ping(_Borrower(keys[2], borrowed_name))))
    # b's whole token, signed with the stranger's key: hivemind's signature check refuses it
    assert not asyncio.run(a.validate_request(_signed_ping(_Borrower(keys[2], b_token))))
    # another run's invite
    foreign_owner = OwnerKey.generate()
    foreign = issue_invite(foreign_owner, foreign_owner.ref("private"), _peer(keys[2]), 30, now=now[0])
    foreign_token = AccessToken(username=foreign, public_key=keys[2].get_public_key().to_bytes())
    assert not asyncio.run(a.validate_request(_signed_ping(_Borrower(keys[2], foreign_token))))
    assert a.refused_total == 4  # the whole borrowed token passes the invite check, then fails the signature

    assert asyncio.run(a.validate_request(_signed_ping(b)))
    gate.update("invite", [], [_peer(keys[1])])  # b revoked in a new manifest version
    assert not asyncio.run(a.validate_request(_signed_ping(b)))
    gate.update("invite", [], [])
    now[0] += 31 * 86400  # b's invite expired (cached tokens are re-checked against the clock)
    assert not a.is_token_valid(b_token)
    assert a.refused_total == 6


def test_strangers_without_an_invite_are_named_once_each_then_only_counted(run, keys, caplog, monkeypatch):
    caplog.set_level("INFO", logger="p2ptrain.swarm.dhtauth")
    monkeypatch.setattr("p2ptrain.swarm.dhtauth._LOGGED_PEERS", 3)
    a = _authorizer(run, keys[0])
    unsigned = dht_pb2.PingRequest()  # a node outside the run sends no token: nothing in it names the sender

    async def rpc(request: dht_pb2.PingRequest, *args: object) -> bool:
        """What hivemind's AuthRPCWrapper awaits, the RPC's context (its remote peer) in its arguments."""
        return await a.validate_request(request)

    strangers = [A, B, A, C, _peer(keys[1]), _peer(keys[2])]
    for peer in strangers:
        assert not asyncio.run(rpc(unsigned, SimpleNamespace(remote_id=PeerID.from_base58(peer))))
    lines = [m for m in caplog.messages if "DHT requests of" in m]
    assert [line.split()[5] for line in lines[:3]] == [A, B, C] and "presented no invite" in lines[0]
    assert lines[3].startswith("refused DHT requests of 3 peers in invite run ") and len(lines) == 4
    assert a.refused_total == len(strangers) and "(unknown)" not in caplog.text
