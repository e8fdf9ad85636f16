"""An owned run's DHT entries and an invite run's closed DHT, with in-process hivemind DHTs on 127.0.0.1.

Honest nodes refuse to store forged manifests, readers pick the newest owner-signed one, and the
manifest outlives the owner's node; in an invite run a peer without an invite (or with someone
else's) cannot even bootstrap, and a revoked peer is cut off.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hivemind
import pytest
from hivemind.dht.routing import DHTID
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils import get_dht_time
from hivemind.utils.auth import TokenAuthorizerBase

from p2ptrain.cli.main import main
from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.dhtkeys import manifest_key, members_key
from p2ptrain.run.invite import issue_invite
from p2ptrain.run.manifest import new_manifest
from p2ptrain.run.owner import OwnerKey
from p2ptrain.swarm.dhtauth import InviteAuthorizer, forget_peers
from p2ptrain.swarm.identity import IdentityKey, ensure_identity, peer_id_of_identity
from p2ptrain.swarm.run_entries import (
    MAX_VERSIONS_HELD,
    RunEntryValidator,
    admitted_members,
    fetch_manifest,
    keep_newest_versions,
    publish_manifest,
    publish_membership,
    tell_excluded,
)
from p2ptrain.trust.admission import AdmissionGate
from p2ptrain.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False,
            "check_if_identity_free": False}


@pytest.fixture
def dhts() -> Iterator[Callable[..., hivemind.DHT]]:
    started: list[hivemind.DHT] = []

    def start(**kwargs: Any) -> hivemind.DHT:
        dht = hivemind.DHT(start=True, **LOOPBACK, **kwargs)
        started.append(dht)
        return dht

    yield start
    for dht in started:
        if dht.is_alive():
            dht.shutdown()
    for dht in started:
        dht.join(timeout=10)


def _maddrs(dht: hivemind.DHT) -> list[str]:
    return [str(addr) for addr in dht.get_visible_maddrs()]


def _eventually(check: Callable[[], Any], what: str) -> Any:
    """What ``check`` returns once it is truthy: DHT entries take a moment to spread."""
    return wait_until(check, 15.0, what, interval=0.3)


def test_manifest_spreads_forgeries_are_refused_and_it_outlives_the_owner(dhts, capsys):
    key = OwnerKey.generate()
    v1 = new_manifest(key, "dht-run", TaskSection(), TrainingSection())
    ref = v1.ref
    owner_validator, volunteer_validator = RunEntryValidator(ref), RunEntryValidator(ref)
    owner = dhts(record_validators=[owner_validator])
    volunteer = dhts(initial_peers=_maddrs(owner), record_validators=[volunteer_validator])
    stranger = dhts(initial_peers=_maddrs(owner))  # checks nothing, stores whatever it is given

    assert publish_manifest(owner, v1).result(timeout=10)
    assert _eventually(lambda: fetch_manifest(volunteer, ref).manifest, "manifest at the volunteer") == v1

    forger = OwnerKey.generate()
    forged = dataclasses.replace(new_manifest(forger, "dht-run", TaskSection(), TrainingSection(lr=9.0)),
                                 version=99).signed(forger)
    raw = forged.to_toml().encode()
    stranger.store(manifest_key(ref.run_id), raw, get_dht_time() + 60, subkey="99:forged")
    stranger.store(manifest_key(ref.run_id), b"garbage", get_dht_time() + 60, subkey="100:junk")
    assert owner_validator.counter.total + volunteer_validator.counter.total >= 2  # honest nodes refused both

    v2 = dataclasses.replace(v1, version=2, training={**v1.training, "lr": 3e-4}).signed(key)
    assert publish_manifest(owner, v2).result(timeout=10)
    found = _eventually(lambda: (f := fetch_manifest(volunteer, ref)).manifest == v2 and f, "manifest v2")
    assert found and found.manifest.training["lr"] == 3e-4

    assert main(["run", "show", str(ref), "--join", _maddrs(volunteer)[0]]) == 0  # what a volunteer would use
    assert "version      2" in capsys.readouterr().out

    assert publish_manifest(volunteer, found.manifest).result(timeout=10)  # every holder re-publishes
    owner.shutdown()
    latecomer = dhts(initial_peers=_maddrs(volunteer), record_validators=[RunEntryValidator(ref)])
    assert _eventually(lambda: fetch_manifest(latecomer, ref).manifest, "manifest at the latecomer") == v2


async def _held_versions(key: str, _dht: Any, node: Any) -> list[int]:
    found = node.protocol.storage.get(DHTID.generate(source=key))
    return sorted(int(subkey.split(":")[0]) for subkey, _ in found.value.items()) if found else []


def test_each_node_holds_only_the_newest_versions_however_many_are_replayed(dhts):
    key = OwnerKey.generate()
    v1 = new_manifest(key, "dht-run", TaskSection(), TrainingSection())
    versions = [v1, *(dataclasses.replace(v1, version=v, training={**v1.training, "seed": v}).signed(key)
                      for v in range(2, 8))]
    validator = RunEntryValidator(v1.ref)
    owner = dhts(record_validators=[validator])
    assert keep_newest_versions(owner)
    replayer = dhts(initial_peers=_maddrs(owner))  # checks nothing: replays every version, oldest first
    for manifest in versions:
        assert publish_manifest(replayer, manifest).result(timeout=10)
    held = owner.run_coroutine(functools.partial(_held_versions, manifest_key(v1.ref.run_id)))
    assert held == [4, 5, 6, 7] and len(held) == MAX_VERSIONS_HELD
    publish_manifest(replayer, v1).result(timeout=10)  # too old now: refused and counted
    assert owner.run_coroutine(functools.partial(_held_versions, manifest_key(v1.ref.run_id))) == held
    assert validator.counter.by_reason()["over_cap"] >= 1
    assert fetch_manifest(owner, v1.ref).manifest == versions[-1]


class _Borrower(TokenAuthorizerBase):
    """A stranger presenting an invited peer's access token, signing with its own key."""

    def __init__(self, token: AccessToken) -> None:
        super().__init__()
        self._token = token

    async def get_token(self) -> AccessToken:
        return self._token

    def is_token_valid(self, access_token: AccessToken) -> bool:
        return True

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        return False


def test_invite_run_dht_admits_invited_peers_only_and_cuts_off_revoked_ones(dhts, tmp_path: Path):
    key = OwnerKey.generate()
    ref = key.ref("private-run")
    identities, peers, gates, authorizers, tokens = {}, {}, {}, {}, {}
    for name in ("owner", "invited", "stranger"):
        identities[name] = tmp_path / f"{name}.key"
        ensure_identity(identities[name])
        peers[name] = peer_id_of_identity(identities[name])
    for name in ("owner", "invited"):
        gates[name] = AdmissionGate("invite")
        tokens[name] = issue_invite(key, ref, peers[name], days=1)
        identity_key = IdentityKey.from_file(identities[name]).hivemind_key()
        authorizers[name] = InviteAuthorizer(ref, tokens[name], identity_key, gates[name])

    owner = dhts(identity_path=str(identities["owner"]), authorizer=authorizers["owner"],
                 record_validators=[RunEntryValidator(ref)])
    invited = dhts(initial_peers=_maddrs(owner), identity_path=str(identities["invited"]),
                   authorizer=authorizers["invited"], record_validators=[RunEntryValidator(ref)])
    assert str(owner.peer_id) == peers["owner"] and str(invited.peer_id) == peers["invited"]

    for dht, name in ((owner, "owner"), (invited, "invited")):
        assert publish_membership(dht, ref, tokens[name]).result(timeout=10)
    _eventually(lambda: admitted_members(invited.get(members_key(ref.run_id), latest=True), ref)[0]
                == {peers["owner"], peers["invited"]}, "both members admitted")

    with pytest.raises(Exception, match="bootstrap failed"):  # no invite at all: every request refused
        dhts(initial_peers=_maddrs(owner), identity_path=str(identities["stranger"]))
    invited_key = IdentityKey.from_file(identities["invited"]).hivemind_key()
    invited_token = AccessToken(username=tokens["invited"], public_key=invited_key.get_public_key().to_bytes())
    with pytest.raises(Exception, match="bootstrap failed"):  # a copied token without the invited peer's key
        dhts(initial_peers=_maddrs(owner), identity_path=str(identities["stranger"]),
             authorizer=_Borrower(invited_token))
    assert authorizers["owner"].refused_total >= 2

    owner.store("secret-ish", b"v1", get_dht_time() + 60)
    _eventually(lambda: invited.get("secret-ish"), "an entry stored by the owner")

    gates["owner"].update("invite", [peers["owner"]], [peers["invited"]])  # revoked in a new manifest version
    assert forget_peers(owner, [peers["invited"]]) == 1
    refused_before = authorizers["owner"].refused_total
    owner.store("after-revocation", b"v2", get_dht_time() + 60)
    assert invited.get("after-revocation", latest=True) is None
    assert authorizers["owner"].refused_total > refused_before

    # Cut off as it is, the revoked peer is handed the version that revokes it, straight into its own
    # DHT (which checks the owner's signature), so it can stop instead of training on alone.
    revoking = dataclasses.replace(new_manifest(key, "private-run", TaskSection(), TrainingSection(), policy="invite"),
                                   revoked=(peers["invited"],)).signed(key)
    assert tell_excluded(owner, revoking, [peers["invited"]]).result(timeout=15) == 1
    assert fetch_manifest(invited, ref).manifest == revoking
