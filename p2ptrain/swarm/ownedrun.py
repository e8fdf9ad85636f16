"""A node's part in an owned run: what to decide before the DHT starts, and what to keep doing after.

:func:`prepare_run` turns ``swarm.run`` / ``swarm.manifest`` / ``swarm.invite`` into a
:class:`RunPlan` before anything is started or written: the run id, the merged config when a
manifest is at hand (the file, or the newest version this node accepted before, kept in its
state directory), the admission gate (created here, before hivemind forks anything) and, for
an invite run, the DHT authorizer. Every problem is one :class:`ConfigError` line naming the field.
:func:`settle` takes a manifest fetched later (the one-line join) into the plan the same way.

:class:`RunKeeper` then runs beside the node's loop without ever blocking it: once joined it
looks up the swarm's newest manifest version (so an outdated manifest file is never trained
with), re-publishes the manifest and this node's invite, polls the swarm (and the
``swarm.manifest`` file, where the owner runs ``p2ptrain run update``) for newer versions, keeps
the gate's lists current, and remembers the newest version it accepted in the state directory.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import ConfigError, NodeConfig
from p2ptrain.dhtkeys import manifest_key, members_key
from p2ptrain.run.invite import Invite, InviteError, verify_invite
from p2ptrain.run.manifest import Manifest
from p2ptrain.run.manifest_store import ManifestStore
from p2ptrain.run.runconfig import merge_manifest
from p2ptrain.run.updates import ManifestTracker, Offer
from p2ptrain.runref import RunRef
from p2ptrain.swarm.manifest_source import FileSource, SourceUnavailable, not_found
from p2ptrain.trust.admission import AdmissionGate
from p2ptrain.waiting import GaveUp, StopEvent, retry

logger = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """Everything decided about an owned run before the node's DHT starts."""

    config: NodeConfig
    ref: RunRef
    manifest: Manifest | None  # None: to be fetched from the swarm (the one-line join)
    gate: AdmissionGate
    authorizer: Any = None  # an InviteAuthorizer in invite runs
    validators: list[Any] = field(default_factory=list)
    #: The node's own config as loaded: every manifest version is merged into this, never into a
    #: config merged before (what the node's config sets is what it says).
    local: NodeConfig | None = None
    store: ManifestStore | None = None
    #: Where ``manifest`` came from, in words (``run show`` / ``config check``).
    source: str = ""
    #: Set when the manifest at hand (the file, or the version kept from an earlier start) bans this
    #: node or revokes its invite: the one line to end with unless the swarm holds a newer version
    #: that readmits it (``run update --unrevoke`` / ``--unban``), which is fetched before anything else.
    excluded_by: str | None = None

    def dht_kwargs(self) -> dict[str, Any]:
        """Extra ``hivemind.DHT`` keyword arguments (the authorizer of an invite run)."""
        return {"authorizer": self.authorizer} if self.authorizer is not None else {}


def apply_run_flags(config: NodeConfig, run_ref: str | None, manifest: Path | None) -> NodeConfig:
    """``p2ptrain run --run REF --manifest FILE`` on top of the config (flags win over swarm.run and
    swarm.manifest)."""
    update: dict[str, Any] = {}
    if run_ref is not None:
        try:
            update["run"] = str(RunRef.parse(run_ref))
        except ConfigError as error:
            raise ConfigError(f"--run: {error}") from None
    if manifest is not None:
        update["manifest"] = manifest
    if not update:
        return config
    return config.model_copy(update={"swarm": config.swarm.model_copy(update=update)})


def keep_run_settings(local: NodeConfig, running: NodeConfig) -> NodeConfig:
    """A re-read node config (SIGHUP) with the running owned run's settings in place of its own.

    The manifest decides [task], the run-wide [training] fields and the run id; comparing them
    with a node config that does not hold them would report every one of them as changed.
    """
    from p2ptrain.run.manifest import LOCAL_TASK, RUN_WIDE_TRAINING

    training = local.training.model_copy(update={n: getattr(running.training, n) for n in RUN_WIDE_TRAINING})
    own = {n: getattr(local.task, n) for n in LOCAL_TASK}
    if local.task.data_path is not None:  # this machine's copy of the run's data
        own["data_path"] = local.task.data_path
    task = running.task.model_copy(update=own)
    swarm = local.swarm.model_copy(update={"run_id": running.swarm.run_id, "run": running.swarm.run})
    return local.model_copy(update={"task": task, "training": training, "swarm": swarm})


def _check_policy(manifest: Manifest, invite: str | None, manifest_file: Path | None = None) -> None:
    where = f"run {manifest.ref} (manifest version {manifest.version})"
    if manifest.policy == "invite" and invite is None:
        if manifest_file is not None and (manifest_file.parent / "owner.key").exists():
            raise ConfigError(f"swarm.invite: {where} is invite-only, its owner's nodes too: invite this node with "
                              f"p2ptrain run invite {manifest_file} PEER_ID (PEER_ID: what p2ptrain run peer-id "
                              "--config <this node's config> prints) and put the token in swarm.invite")
        raise ConfigError(f"swarm.invite: {where} is invite-only; ask its owner for an invite for this node's peer ID "
                          "(p2ptrain run peer-id prints it)")
    if manifest.policy == "open" and invite is not None:
        raise ConfigError(f"swarm.invite: {where} is open to everyone; remove swarm.invite")


def settle(plan: RunPlan, manifest: Manifest) -> RunPlan:
    """``plan`` with ``manifest`` (verified) taking effect: the merged config, the policy checked
    against this node's invite, the gate's policy and exclusions. One :class:`ConfigError` line,
    saying which manifest version it came from, when this node cannot take part with it."""
    local = plan.local if plan.local is not None else plan.config
    config = merge_manifest(local, manifest)
    _check_policy(manifest, local.swarm.invite, local.swarm.manifest)
    own = plan.authorizer.peer_id if plan.authorizer is not None else None
    if own is not None and own in manifest.excluded():
        raise ConfigError(f"swarm.invite: this node ({own}) was banned or its invite revoked in run {manifest.ref} "
                          f"(manifest version {manifest.version})")
    plan.gate.update(manifest.policy, (own,) if own else (), manifest.excluded())
    return dataclasses.replace(plan, config=config, manifest=manifest, excluded_by=None)


def fetch_readmitting(plan: RunPlan, initial_peers: Sequence[str], stopping: Callable[[], bool],
                      fetch: Callable[[RunPlan], RunPlan]) -> RunPlan:
    """``fetch(plan)``: the swarm's manifest settled into a plan that has none yet (the one-line join).

    A node whose own manifest excluded it (``plan.excluded_by``) is looking for a newer version that
    readmits it: when the swarm gives none, it ends with that line (exit 78, not restarted) instead
    of a swarm error that the service manager would retry forever.
    """
    from p2ptrain.swarm.dht import SwarmError  # hivemind

    if plan.excluded_by is not None and not initial_peers:
        raise ConfigError(f"{plan.excluded_by}; to look for a newer version that readmits it, give --join ADDR")
    try:
        return fetch(plan)
    except (SwarmError, SourceUnavailable) as error:
        if plan.excluded_by is None or stopping():
            raise
        raise ConfigError(f"{plan.excluded_by}; no newer version that readmits it came from the swarm "
                          f"({error})") from None


def _newest(*manifests: Manifest | None) -> Manifest | None:
    return max((m for m in manifests if m is not None), key=lambda m: m.version, default=None)


def prepare_run(config: NodeConfig, identity_file: Path, *, now: float | None = None,
                clock: Callable[[], float] = time.time) -> RunPlan | None:
    """The plan for ``config``'s owned run, or None for a plain run (neither swarm.run nor swarm.manifest;
    then no swarm.invite either).

    Reads the manifest file, the manifest kept from an earlier start (the newer of the two is
    used) and the identity; writes nothing.
    """
    swarm = config.swarm
    if swarm.run is None and swarm.manifest is None:
        if swarm.invite is not None:  # else the node would train in a plain run, its invite ignored
            raise ConfigError("swarm.invite: an invite admits a node to an owned run, and this config names none: it "
                              "needs swarm.run (the run's reference; or --run REF) or swarm.manifest")
        return None
    ref = RunRef.parse(swarm.run) if swarm.run is not None else None
    from_file = FileSource(swarm.manifest, ref).fetch() if swarm.manifest is not None else None
    if ref is None:
        assert from_file is not None
        ref = from_file.ref
    store = ManifestStore(config.state_dir(), ref)
    manifest = _newest(from_file, store.load())
    source = f"file {swarm.manifest}" if manifest is not None and manifest is from_file else f"file {store.path}"
    if from_file is not None and manifest is not from_file:
        assert manifest is not None
        logger.info("run %s: the manifest file %s holds version %d, this node already followed version %d: "
                    "using that", ref, swarm.manifest, from_file.version, manifest.version)
    merged = None
    if manifest is not None:
        merged = merge_manifest(config, manifest)
        _check_policy(manifest, swarm.invite, swarm.manifest)
    elif "run_id" in swarm.model_fields_set and swarm.run_id != ref.run_id:
        raise ConfigError(f"swarm.run_id: this node's config says {swarm.run_id!r} but run {ref} uses "
                          f"{ref.run_id!r}; remove swarm.run_id from the node config")
    unmerged = config.model_copy(update={"swarm": swarm.model_copy(update={"run_id": ref.run_id,
                                                                           "run": str(ref)})})
    excluded = manifest.excluded() if manifest is not None else frozenset()
    policy = manifest.policy if manifest is not None else ("invite" if swarm.invite else "open")
    gate = AdmissionGate(policy)
    gate.update(policy, (), excluded)
    from p2ptrain.swarm.run_entries import run_validators  # hivemind

    plan = RunPlan(merged or unmerged, ref, manifest, gate, validators=run_validators(ref), local=config,
                   store=store, source=source if manifest is not None else "")
    if swarm.invite is not None:
        current = clock() if now is None else now
        try:
            invite = verify_invite(swarm.invite, ref=ref, now=current)
        except InviteError as error:
            raise ConfigError(f"swarm.invite: {error}") from None
        if manifest is not None and invite.peer_id in excluded:
            # Only a newer version can readmit this node, and the swarm may hold one: the node asks
            # it first (as a one-line join does), and ends with this line if none comes.
            plan.excluded_by = (f"swarm.invite: this node ({invite.peer_id}) was banned or its invite revoked in run "
                                f"{ref} (manifest version {manifest.version}, {source})")
            plan.config, plan.manifest, plan.source = unmerged, None, ""
            excluded = excluded - {invite.peer_id}
            gate.update(policy, (), excluded)
        if not identity_file.exists():
            raise ConfigError(f"swarm.invite: is for peer {invite.peer_id}, but this node has no identity yet "
                              f"({identity_file}); create it with p2ptrain run peer-id and ask for an invite for it")
        from p2ptrain.swarm.dhtauth import InviteAuthorizer
        from p2ptrain.swarm.identity import IdentityKey

        key = IdentityKey.from_file(identity_file).hivemind_key()
        try:
            plan.authorizer = InviteAuthorizer(ref, swarm.invite, key, gate, clock=clock)
        except InviteError as error:
            raise ConfigError(f"swarm.invite: {error}") from None
        gate.update(policy, (plan.authorizer.peer_id,), excluded)
    return plan


class RunKeeper:
    """Keeps a running node's view of its owned run current; every method returns at once."""

    def __init__(self, plan: RunPlan, dht: Any, *, clock: Callable[[], float] = time.time,
                 poll_every: float = 15.0, members_every: float = 3.0, republish_every: float = 300.0,
                 lookup_timeout: float = 10.0) -> None:
        self.plan, self._dht, self._clock = plan, dht, clock
        self._poll_every, self._republish_every, self._timeout = poll_every, republish_every, lookup_timeout
        # Invite runs: a newcomer is refused by the averagers until its invite is seen here, so the
        # members are looked up more often than the manifest.
        self._members_every = members_every
        self.tracker = ManifestTracker(plan.ref, plan.manifest)
        self._store = plan.store
        self.invalid_manifests_total = 0
        self.invalid_members_total = 0
        self._file = plan.config.swarm.manifest
        self._file_seen = _file_stamp(self._file)
        self._admitted: frozenset[str] = frozenset({plan.authorizer.peer_id} if plan.authorizer else ())
        self._pending: dict[str, tuple[Any, float]] = {}
        self._told: set[str] = set()  # excluded peers handed the manifest that excludes them
        self._next_poll = 0.0
        self._next_members = 0.0
        self._next_publish = 0.0

    @property
    def manifest(self) -> Manifest | None:
        return self.tracker.current

    def join(self, stop: StopEvent, timeout: float) -> NodeConfig:
        """Once the DHT is up: the newest manifest version there is (the swarm's, looked up once
        even when the plan holds one, so an outdated manifest file is never built with; fetched
        with retries when the plan has none) merged into the config. Raises
        :class:`SourceUnavailable` after ``timeout`` without one."""
        from p2ptrain.swarm.run_entries import fetch_manifest

        invalid = 0

        def lookup() -> Manifest | None:
            nonlocal invalid
            found = fetch_manifest(self._dht, self.plan.ref, timeout=self._timeout)
            self.invalid_manifests_total += found.invalid
            invalid += found.invalid
            if found.manifest is not None:
                offer = self.tracker.offer(found.manifest)
                if offer.accepted and self.plan.manifest is not None:
                    logger.info("run %s: the swarm holds a newer manifest than this node started with: %s",
                                self.plan.ref, offer.reason)
            return self.tracker.current

        try:
            manifest = retry(lookup, timeout=timeout, clock=self._clock, sleep=stop.wait)
        except GaveUp:
            raise not_found(self.plan.ref, timeout, invalid) from None
        self.plan = settle(self.plan, manifest)
        self._keep(manifest)
        if self.plan.config.swarm.invite is not None:
            self._join_members()
        self._refresh_gate()
        return self.plan.config

    def _keep(self, manifest: Manifest) -> None:
        """Remember the newest accepted version across restarts (the state directory's copy)."""
        if self._store is not None:
            self._store.save(manifest)

    def _join_members(self) -> None:
        """An invite run: announce this node's invite now and learn who else is admitted before the
        node first averages or downloads state (bounded; the polls keep the list current)."""
        from p2ptrain.swarm.run_entries import publish_membership

        assert self.plan.config.swarm.invite is not None
        publish_membership(self._dht, self.plan.ref, self.plan.config.swarm.invite)
        future = self._dht.get(members_key(self.plan.ref.run_id), latest=True, return_future=True)
        try:
            found = future.result(timeout=self._timeout)
        except Exception as exc:  # swarm weather: the polls try again
            future.cancel()
            logger.info("run %s: members lookup failed (%s)", self.plan.ref, type(exc).__name__)
            return
        self._take_members(found, self._clock())

    def _take_members(self, found: Any, now: float) -> None:
        from p2ptrain.swarm.run_entries import admitted_members

        admitted, invalid = admitted_members(found, self.plan.ref, now=now, excluded=self._excluded())
        self.invalid_members_total += invalid
        if self.plan.authorizer is not None:
            admitted.add(self.plan.authorizer.peer_id)
        if admitted != self._admitted:
            self._admitted = frozenset(admitted)
            self._refresh_gate()

    def check_fingerprint(self, fingerprint: str) -> None:
        """Raise one line naming both fingerprints when the manifest records another model."""
        manifest = self.tracker.current
        if manifest is not None and manifest.fingerprint is not None and manifest.fingerprint != fingerprint:
            raise ConfigError(f"model fingerprint {fingerprint} differs from run {manifest.ref}'s model "
                              f"{manifest.fingerprint} (manifest version {manifest.version}); take [task] from the "
                              "manifest only")

    def poll(self) -> Offer | None:
        """Re-publish, look for a newer manifest and current members; returns the offer of a newly
        accepted manifest version. Its bans and revocations are in the gate when this returns; the node
        applies its training settings at the next epoch boundary, or restarts for the rest."""
        from p2ptrain.swarm.run_entries import newest_manifest, publish_manifest, publish_membership

        now = self._clock()
        accepted: Offer | None = None
        if now >= self._next_poll and self._file is not None:
            accepted = self._reread_file()
        manifest = self.tracker.current
        if manifest is not None and now >= self._next_publish:
            self._next_publish = now + self._republish_every
            publish_manifest(self._dht, manifest)
            if self.plan.config.swarm.invite is not None:
                publish_membership(self._dht, self.plan.ref, self.plan.config.swarm.invite)
        found = self._finished("manifest", now)
        if found is not None:
            result = newest_manifest(found, self.plan.ref)
            self.invalid_manifests_total += result.invalid
            if result.manifest is not None:
                offer = self.tracker.offer(result.manifest)
                if offer.accepted:
                    logger.info("run %s: %s", self.plan.ref, offer.reason)
                    self._keep(result.manifest)
                    accepted = offer
                    self._refresh_gate()
                    self._next_publish = now  # every holder spreads a new version at once
        members = self._finished("members", now)
        if members is not None and self.gate_policy == "invite":
            self._take_members(members, now)
        if now >= self._next_poll and "manifest" not in self._pending:
            self._next_poll = now + self._poll_every
            self._pending["manifest"] = (self._dht.get(manifest_key(self.plan.ref.run_id), latest=True,
                                                       return_future=True), now)
        if self.gate_policy == "invite" and now >= self._next_members and "members" not in self._pending:
            self._next_members = now + self._members_every
            self._pending["members"] = (self._dht.get(members_key(self.plan.ref.run_id), latest=True,
                                                      return_future=True), now)
        return accepted

    def _reread_file(self) -> Offer | None:
        """The owner's node: a newer version written to its ``swarm.manifest`` file (by ``p2ptrain
        run update``) is taken up and published at once."""
        assert self._file is not None
        stamp = _file_stamp(self._file)
        if stamp == self._file_seen:
            return None
        self._file_seen = stamp
        try:
            manifest = FileSource(self._file, self.plan.ref).fetch()
        except ConfigError as error:
            self.invalid_manifests_total += 1
            logger.warning("run %s: keeping manifest version %d: %s", self.plan.ref,
                           self.manifest.version if self.manifest else 0, error)
            return None
        offer = self.tracker.offer(manifest)
        if not offer.accepted:
            return None
        logger.info("run %s: %s (from %s)", self.plan.ref, offer.reason, self._file)
        self._keep(manifest)
        self._refresh_gate()
        self._next_publish = self._clock()
        return offer

    @property
    def own_invite(self) -> Invite | None:
        """This node's own invite (an invite run), whose expiry ends its part in the run."""
        return self.plan.authorizer.own_invite if self.plan.authorizer is not None else None

    def is_excluded(self, peer_id: str) -> bool:
        """Whether the current manifest bans ``peer_id`` or revokes its invite."""
        return peer_id in self._excluded()

    @property
    def gate_policy(self) -> str:
        return self.plan.gate.policy

    def _excluded(self) -> frozenset[str]:
        manifest = self.tracker.current
        return manifest.excluded() if manifest is not None else frozenset()

    def _refresh_gate(self) -> None:
        manifest = self.tracker.current
        policy = manifest.policy if manifest is not None else self.plan.gate.policy
        excluded = self._excluded()
        self.plan.gate.update(policy, self._admitted, excluded)
        if excluded:
            from p2ptrain.swarm.dhtauth import forget_peers
            from p2ptrain.swarm.run_entries import tell_excluded

            try:
                forget_peers(self._dht, excluded)
            except Exception as exc:  # the DHT's process is busy or gone: the authorizer still refuses them
                logger.debug("could not drop excluded peers from the routing table: %s", exc)
            untold = excluded - self._told - ({self.plan.authorizer.peer_id} if self.plan.authorizer else set())
            if manifest is not None and untold:
                self._told |= untold
                try:  # so that a peer our DHT no longer answers still learns it was excluded, and stops
                    tell_excluded(self._dht, manifest, untold)
                except Exception as exc:
                    logger.debug("could not hand the manifest to excluded peers: %s", exc)

    def _finished(self, name: str, now: float) -> Any:
        pending = self._pending.get(name)
        if pending is None:
            return None
        future, started = pending
        if future.done():
            del self._pending[name]
            try:
                return future.result()
            except Exception as exc:
                logger.info("run %s: %s lookup failed (%s)", self.plan.ref, name, type(exc).__name__)
                return None
        if now - started > self._timeout:
            future.cancel()
            del self._pending[name]
        return None

    def status(self) -> dict[str, Any]:
        """Fields for the status snapshot, the API and the dashboards."""
        manifest = self.tracker.current
        return {
            "run_ref": str(self.plan.ref),
            "manifest_version": manifest.version if manifest is not None else 0,
            "admission_policy": self.gate_policy,
            "manifest_fingerprint": (manifest.fingerprint or "") if manifest is not None else "",
            "manifests_ignored_total": self.tracker.ignored_total + self.invalid_manifests_total,
            "invalid_members_total": self.invalid_members_total,
            "dht_requests_refused_total": self.plan.authorizer.refused_total if self.plan.authorizer else 0,
            "run_entries_refused_total": sum(_counter_total(v, "counter") for v in self.plan.validators),
            "fingerprint_entries_refused_total": sum(_counter_total(v, "fingerprint_counter")
                                                     for v in self.plan.validators),
            "averaging_refused_total": self.plan.gate.refused_total,
            "invite_expires_at": float(self.own_invite.expires_at) if self.own_invite is not None else 0.0,
        }


def _counter_total(validator: Any, name: str) -> int:
    counter = getattr(validator, name, None)
    return int(counter.total) if counter is not None else 0


def _file_stamp(path: Path | None) -> tuple[int, int] | None:
    """What tells a rewritten file from the one read before (``run update`` replaces it atomically)."""
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_ino
