"""Invite tokens: one admits exactly its peer to its run until it expires; every other case is one line."""

from __future__ import annotations

import base64
import json

import pytest

from p2ptrain.run.invite import InviteError, issue_invite, parse_invite, verify_invite
from p2ptrain.run.owner import OwnerKey

PEER = "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF"
OTHER_PEER = "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"
NOW = 1_700_000_000.0
DAY = 86400.0


@pytest.fixture(scope="module")
def key() -> OwnerKey:
    return OwnerKey.generate()


@pytest.fixture(scope="module")
def ref(key):
    return key.ref("private-run")


@pytest.fixture(scope="module")
def token(key, ref) -> str:
    return issue_invite(key, ref, PEER, days=30, now=NOW)


def _line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    return text


def test_invite_admits_its_peer_until_expiry(token, ref, key):
    invite = verify_invite(token, ref=ref, peer_id=PEER, now=NOW + 29 * DAY)
    assert invite.peer_id == PEER and invite.run == str(ref) and invite.owner_key == key.public_key
    assert invite.expires_at == int(NOW + 30 * DAY) and invite.issued_at == int(NOW)
    assert verify_invite(token, ref=ref, now=NOW).peer_id == PEER  # any peer: as read from the members key


def test_expired_invite(token, ref):
    with pytest.raises(InviteError, match=rf"invite for peer {PEER} expired on 20\d\d-\d\d-\d\d .* UTC; ask") as e:
        verify_invite(token, ref=ref, peer_id=PEER, now=NOW + 30 * DAY)
    _line(e)


def test_wrong_peer(token, ref):
    with pytest.raises(InviteError, match=rf"invite is for peer {PEER}, not {OTHER_PEER}") as e:
        verify_invite(token, ref=ref, peer_id=OTHER_PEER, now=NOW)
    _line(e)


def test_wrong_run_same_owner_and_same_name_other_owner(token, key):
    with pytest.raises(InviteError, match=r"invite is for run 'private-run@\w+', not other-run@") as e:
        verify_invite(token, ref=key.ref("other-run"), peer_id=PEER, now=NOW)
    _line(e)
    impostor = OwnerKey.generate()
    with pytest.raises(InviteError, match="invite is for run"):
        verify_invite(token, ref=impostor.ref("private-run"), peer_id=PEER, now=NOW)


def test_invite_signed_by_another_key_for_this_run(ref):
    impostor = OwnerKey.generate()
    forged = _reencode(issue_invite(impostor, impostor.ref("private-run"), PEER, 30, NOW), run=str(ref))
    with pytest.raises(InviteError, match=r"not signed with the key of run private-run@\w+'s owner") as e:
        verify_invite(forged, ref=ref, peer_id=PEER, now=NOW)
    _line(e)


def test_altered_claims_break_the_signature(token, ref):
    for change in ({"peer": OTHER_PEER}, {"expires": int(NOW + 999 * DAY)}):
        with pytest.raises(InviteError, match="invite signature does not verify") as e:
            verify_invite(_reencode(token, **change), ref=ref, peer_id=change.get("peer", PEER), now=NOW)
        _line(e)


def test_revoked_or_banned_peer(token, ref):
    with pytest.raises(InviteError, match=f"peer {PEER} was banned or its invite revoked"):
        verify_invite(token, ref=ref, peer_id=PEER, now=NOW, excluded={PEER})


@pytest.mark.parametrize("bad", [
    "", "hello", "p2ptrain-invite-v1.", "p2ptrain-invite-v1.!!!.x", "p2ptrain-invite-v1.e30.AAAA",
    "p2ptrain-invite-v1." + "A" * 5000, "p2ptrain-invite-v2.abc.def",
])
def test_damaged_tokens_are_one_line(bad, ref):
    with pytest.raises(InviteError, match=r"not an invite token|invite token is damaged") as e:
        verify_invite(bad, ref=ref, peer_id=PEER, now=NOW)
    _line(e)


def test_issue_refuses_bad_input(key, ref):
    with pytest.raises(InviteError, match="this owner key is not the key of run"):
        issue_invite(OwnerKey.generate(), ref, PEER, 30)
    for days in (0, -1, 1e-06, 0.04, float("nan"), float("inf"), 3661):
        with pytest.raises(InviteError, match=rf"^--days {days:g}: an invite lasts at least one hour \(--days "
                                              r"0\.0417\) and at most 3660 days$"):
            issue_invite(key, ref, PEER, days)
    from p2ptrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"peer ID 'not-a-peer': not a libp2p peer ID"):
        issue_invite(key, ref, "not-a-peer", 30)


def _reencode(token: str, **changes) -> str:
    """The same signature over a payload with ``changes`` applied (what a forger can do)."""
    invite, raw, _ = parse_invite(token)
    payload = json.loads(raw)
    payload.update(changes)
    body = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
    prefix, _, rest = token.partition(".")
    return f"{prefix}.{body.decode().rstrip('=')}.{rest.split('.', 1)[1]}"


@pytest.mark.parametrize(("days", "seconds"), [(1 / 24, 3600), (0.5, 43200), (30, 30 * 86400), (1.0000001, 86400)])
def test_an_invite_lasts_what_was_asked_to_the_second(key, ref, days, seconds):
    """A tiny --days used to give a token born expired (the seconds truncated to 0)."""
    invite = verify_invite(issue_invite(key, ref, PEER, days, now=NOW), ref=ref, now=NOW)
    assert invite.expires_at - invite.issued_at == seconds
