"""The DHT gate of an invite run: a hivemind authorizer that admits only invited peers.

hivemind's :class:`TokenAuthorizerBase` wraps every DHT RPC (ping, store, find) both ways: the
caller attaches an access token and signs the request with the token's RSA key; the servicer
checks the token, the signature, the clock and a nonce, then signs its response the same way.
Here the access token's ``username`` is the peer's invite and its ``public_key`` is the peer's
libp2p identity key, so a token is valid only when the owner-signed invite names exactly the
peer ID of that key, has not expired, and that peer is not banned or revoked (read from the
node's :class:`~p2ptrain.trust.admission.AdmissionGate`). A stranger cannot borrow an invite: signing
requests needs the private identity key of the peer it names.

A refused request gets no answer (hivemind drops it); the refusal is counted and logged once
per peer, a peer without any invite named by the libp2p peer ID it connected with (up to a
bound; the rest are counted only). Every node of an invite run must use the authorizer: the DHT
of such a run is closed.
"""

from __future__ import annotations

import collections
import functools
import logging
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from cryptography.hazmat.primitives import serialization
from hivemind.proto import crypto_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import AuthorizedRequestBase, TokenAuthorizerBase
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from p2ptrain.peerid import base58
from p2ptrain.run.invite import Invite, InviteError, verify_invite
from p2ptrain.runref import RunRef
from p2ptrain.swarm.identity import peer_id_of
from p2ptrain.trust.admission import AdmissionGate

logger = logging.getLogger(__name__)

_CACHE = 1024
_LOGGED_PEERS = 256


def peer_id_of_public_key(openssh: bytes) -> str:
    """The libp2p peer ID of an RSA public key in hivemind's wire form (OpenSSH)."""
    der = RSAPublicKey.from_bytes(openssh)._public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base58(peer_id_of(crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()))


class InviteAuthorizer(TokenAuthorizerBase):
    """Admits DHT requests and responses only from peers invited to ``ref`` and not excluded."""

    def __init__(self, ref: RunRef, invite: str, identity_key: RSAPrivateKey, gate: AdmissionGate, *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(identity_key)
        self._ref, self._invite, self._gate, self._clock = ref, invite, gate, clock
        self.peer_id = peer_id_of_public_key(self.local_public_key.to_bytes())
        # Our own invite must hold now: hivemind asserts it on first use, deep inside an RPC.
        own = verify_invite(invite, ref=ref, peer_id=self.peer_id, now=clock(),
                            excluded={self.peer_id} if gate.is_excluded(self.peer_id) else set())
        self.own_invite: Invite = own  # the node watches its expiry (daemon.runfollow)
        self._expires_at = own.expires_at
        self._known: collections.OrderedDict[tuple[str, bytes], tuple[str, int]] = collections.OrderedDict()
        self._logged: set[str] = set()
        # Shared with the node: the authorizer runs in the DHT's forked process.
        self._refused = mp.get_context("fork").Value("q", 0)

    @property
    def refused_total(self) -> int:
        """DHT requests and responses refused so far (counted in the DHT's process, read anywhere)."""
        return int(self._refused.value)

    async def get_token(self) -> AccessToken:
        return AccessToken(username=self._invite, public_key=self.local_public_key.to_bytes(),
                           expiration_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._expires_at)))

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        return False  # an invite cannot be renewed here; a new one means a restart with the new token

    def is_token_valid(self, access_token: AccessToken) -> bool:
        now = self._clock()
        key = (access_token.username, bytes(access_token.public_key))
        known = self._known.get(key)
        peer_id = known[0] if known is not None else ""
        reason = ""
        if known is None and not key[0]:
            peer_id = _rpc_peer() or "(unknown)"
            reason = "it presented no invite (a node outside the run, or not set up for it)"
        elif known is None:
            try:
                peer_id = peer_id_of_public_key(key[1])
            except Exception:
                peer_id, reason = "(no valid key)", "no valid identity key in its access token"
            if not reason:
                try:
                    invite = verify_invite(key[0], ref=self._ref, peer_id=peer_id, now=now)
                except InviteError as error:
                    reason = str(error)
                else:
                    known = (peer_id, invite.expires_at)
                    self._known[key] = known
                    if len(self._known) > _CACHE:
                        self._known.popitem(last=False)
        if not reason and known is not None and now >= known[1]:
            reason = "its invite expired"
        if not reason and self._gate.is_excluded(peer_id):
            reason = "it was banned or its invite revoked by the run's owner"
        if reason:
            self._refuse(peer_id, reason)
            return False
        return True

    async def validate_request(self, request: AuthorizedRequestBase) -> bool:
        before = self.refused_total
        if await super().validate_request(request):
            return True
        if self.refused_total == before:  # a valid invite, but hivemind's signature, clock or nonce check failed
            try:
                peer_id = peer_id_of_public_key(request.auth.client_access_token.public_key)
            except Exception:
                peer_id = "(unknown)"
            self._refuse(peer_id, "its request was not signed by the invited peer's key, or was replayed")
        return False

    def _refuse(self, peer_id: str, reason: str) -> None:
        with self._refused.get_lock():
            self._refused.value += 1
        if peer_id in self._logged:
            return
        if len(self._logged) < _LOGGED_PEERS:
            self._logged.add(peer_id)
            logger.info("refusing DHT requests of peer %s in invite run %s: %s", peer_id, self._ref, reason)
        elif len(self._logged) == _LOGGED_PEERS:
            self._logged.add("")  # said once: from here on refusals are only counted
            logger.info("refused DHT requests of %d peers in invite run %s; more are counted only "
                        "(dht_requests_refused_total)", _LOGGED_PEERS, self._ref)


def _rpc_peer(depth: int = 4) -> str | None:
    """The peer ID of the DHT request being authorized, when it can be seen.

    hivemind hands an authorizer the request alone; a peer without an authorizer sends no token,
    so nothing in it names the sender. The RPC's context (``P2PContext.remote_id``, the peer libp2p
    authenticated) is an argument of hivemind's ``AuthRPCWrapper`` a frame or two up the await
    chain. Looked for only when refusing such a peer, and never trusted for anything but a log line.
    """
    try:
        frame: FrameType | None = sys._getframe(2)
        for _ in range(depth):
            if frame is None:
                return None
            args = frame.f_locals.get("args")
            remote = getattr(args[0], "remote_id", None) if isinstance(args, tuple) and args else None
            if remote is not None:
                return str(remote.to_base58())
            frame = frame.f_back
    except Exception:  # a different hivemind: the refusal still counts, the peer is just unnamed
        return None
    return None


async def _forget(peer_ids: frozenset[str], _dht: Any, node: Any) -> int:
    table = node.protocol.routing_table
    gone = [uid for uid, peer in list(table.uid_to_peer_id.items()) if peer.to_base58() in peer_ids]
    for uid in gone:
        del table[uid]
    return len(gone)


def forget_peers(dht: Any, peer_ids: Iterable[str]) -> int:
    """Drop excluded peers from the DHT's routing table, so this node stops sending them stores and
    lookups (its authorizer already refuses their requests and answers); returns how many were there."""
    peer_ids = frozenset(peer_ids)
    if not peer_ids:
        return 0
    return int(dht.run_coroutine(functools.partial(_forget, peer_ids)))
