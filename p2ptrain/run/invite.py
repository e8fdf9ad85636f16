"""Invites to a private run: owner-signed tokens that admit one peer ID until an expiry.

A token is ``p2ptrain-invite-v1.<payload>.<signature>`` (both base64url): the payload names the
run reference, the invited peer ID, when it was issued and when it expires, and carries the
owner's public key, so any node can check a token with nothing but the run reference. Tokens
are not secret (they admit only the peer ID they name, and proving to be that peer needs its
private key), but there is no point in publishing them. Revocation is by peer ID, in the next
manifest version.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

from p2ptrain.errors import ConfigError
from p2ptrain.peerid import check_peer_id, is_peer_id
from p2ptrain.run.owner import OwnerKey, decode_b64, decode_public_key, encode_public_key, verify
from p2ptrain.runref import RunRef

TOKEN_PREFIX = "p2ptrain-invite-v1."
MAX_TOKEN_CHARS = 2048
MAX_DAYS = 3660.0
#: The shortest invite: one hour. Shorter ones would expire before a node could start and join with
#: one (or, truncated to whole seconds, be born expired), and the warning ahead of expiry needs time.
MIN_DAYS = 1 / 24
_SIGNING_DOMAIN = b"p2ptrain-invite-v1\x00"


class InviteError(ConfigError):
    """An invite that does not admit this peer to this run; the message is the one line to show."""


@dataclass(frozen=True)
class Invite:
    run: str
    peer_id: str
    issued_at: int
    expires_at: int
    owner_key: bytes


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def when(timestamp: float) -> str:
    """A moment as people read it in a log line or an error: ``2026-07-01 12:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def issue_invite(key: OwnerKey, ref: RunRef, peer_id: str, days: float, now: float | None = None) -> str:
    """A token admitting ``peer_id`` to ``ref`` for ``days`` days (the key must be the run's)."""
    check_peer_id(peer_id)
    if not ref.matches(key.public_key):
        raise InviteError(f"this owner key is not the key of run {ref}")
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise InviteError(f"--days {days:g}: an invite lasts at least one hour (--days {MIN_DAYS:.4f}) and at "
                          f"most {MAX_DAYS:g} days")
    issued = int(time.time() if now is None else now)
    payload = {"run": str(ref), "peer": peer_id, "issued": issued, "expires": issued + round(days * 86400),
               "owner_key": encode_public_key(key.public_key)}
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("ascii")
    return f"{TOKEN_PREFIX}{_b64url(raw)}.{_b64url(key.sign(_SIGNING_DOMAIN + raw))}"


#: A running node warns once that its own invite is about to expire when less than this is left, or
#: less than a tenth of the invite's life, whichever is shorter.
WARN_AHEAD_SECONDS = 86400.0


def warn_ahead(invite: Invite) -> float:
    """Seconds before ``invite`` expires when its node says so (a day for most, less for short ones)."""
    return min(WARN_AHEAD_SECONDS, (invite.expires_at - invite.issued_at) / 10)


def _int(payload: dict[str, Any], name: str) -> int:
    value = payload.get(name)
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError(f"{name} is not a time")
    return value


def parse_invite(token: str) -> tuple[Invite, bytes, bytes]:
    """Decode a token into its claims, the signed bytes and the signature; checks nothing else."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.startswith(TOKEN_PREFIX):
        raise InviteError("not an invite token (expected p2ptrain-invite-v1.<...>, as printed by "
                          "p2ptrain run invite)")
    try:
        body, _, signature_text = token[len(TOKEN_PREFIX):].partition(".")
        raw = decode_b64(body, "payload", urlsafe=True)
        signature = decode_b64(signature_text, "signature", urlsafe=True)
        payload = json.loads(raw.decode("ascii"))
        if not isinstance(payload, dict):
            raise ValueError("payload is not an object")
        invite = Invite(run=str(payload.get("run")), peer_id=str(payload.get("peer")),
                        issued_at=_int(payload, "issued"), expires_at=_int(payload, "expires"),
                        owner_key=decode_public_key(payload.get("owner_key")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InviteError(f"invite token is damaged ({exc}); copy it again from the run's owner") from None
    if not is_peer_id(invite.peer_id):
        raise InviteError("invite token is damaged (no valid peer ID); copy it again from the run's owner")
    return invite, raw, signature


def verify_invite(token: str, *, ref: RunRef, peer_id: str | None = None, now: float | None = None,
                  excluded: frozenset[str] | set[str] = frozenset()) -> Invite:
    """The invite, if it admits ``peer_id`` (any peer when None) to ``ref`` now; else one
    :class:`InviteError` line saying which check failed."""
    invite, raw, signature = parse_invite(token)
    if invite.run != str(ref):
        raise InviteError(f"invite is for run {invite.run[:100]!r}, not {ref}")
    if not ref.matches(invite.owner_key):
        raise InviteError(f"invite is not signed with the key of run {ref}'s owner")
    if not verify(invite.owner_key, _SIGNING_DOMAIN + raw, signature):
        raise InviteError("invite signature does not verify (the token was altered); "
                          "copy it again from the run's owner")
    if peer_id is not None and invite.peer_id != peer_id:
        raise InviteError(f"invite is for peer {invite.peer_id}, not {peer_id}")
    current = time.time() if now is None else now
    if current >= invite.expires_at:
        raise InviteError(f"invite for peer {invite.peer_id} expired on {when(invite.expires_at)}; "
                          "ask the run's owner for a new one")
    if invite.peer_id in excluded:
        raise InviteError(f"peer {invite.peer_id} was banned or its invite revoked by the run's owner")
    return invite
