"""One process's time in a run's swarm: the life cycle a node (``p2ptrain run``) and ``p2ptrain fetch`` share.

:class:`SwarmSession` holds what that time is made of (the owned run's plan and keeper, the peer
checks, the joined swarm, the built parts, the state directory's lock) and walks it in steps, each
one method that its owner calls in turn, doing its own work in between (a node's status board,
API and training loop; a fetch's download):

1. :meth:`~SwarmSession.prepare`      an owned run's plan, checked before anything is written; for a
                                      node, the one-line join's manifest fetched from the swarm first
2. :meth:`~SwarmSession.open`         the state directory made and locked (one live process per
                                      identity), the peer checks made before hivemind forks anything
3. :meth:`~SwarmSession.join`         the DHT started, with the records' and the run's validators
4. :meth:`~SwarmSession.follow_run`   an owned run's keeper: the swarm's newest manifest settles the config
5. :meth:`~SwarmSession.read_records` the run's peer records read from now on (a node's published
                                      too), handed to the peer checks
6. :meth:`~SwarmSession.build`        the model and optimizer, made by the owner's builder method
7. :meth:`~SwarmSession.leave`        records, parts and swarm closed within the shutdown deadline (past
                                      it the process ends with the code earned), the lock released

The hooks are where records are read and published: a node's :class:`~p2ptrain.daemon.hooks.NodeHooks`
(``record_validators``, ``joined``, ``stopping``); ``p2ptrain fetch`` hands over a reader that
publishes nothing.  Failures propagate as they are: what each ends with (an exit code, one line) is
the owner's to say.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from p2ptrain.config.schema import NodeConfig
from p2ptrain.daemon.builder import JoinedSwarm
from p2ptrain.daemon.hooks import NodeHooks, SwarmPresence
from p2ptrain.daemon.shutdown import close_within_deadline
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.optim.defences import Defences
from p2ptrain.swarm.dht import IdentityLock
from p2ptrain.swarm.ownedrun import RunKeeper, RunPlan
from p2ptrain.trust.vouching import VouchLedger

_Parts = TypeVar("_Parts", bound="Closable")


class Closable(Protocol):
    def close(self) -> None: ...


class SwarmSession:
    """A node's or a fetch's part in one run's swarm, from its plan to leaving (see the module doc)."""

    def __init__(self, config: NodeConfig, *, builder: Any, hooks: NodeHooks, stopper: Stopper,
                 initial_peers: Callable[[], Sequence[str]], wall_clock: Callable[[], float] = time.time,
                 vouches: VouchLedger | None = None) -> None:
        #: The config in force: the node's own, then the owned run's plan's, then its manifest's.
        self.config = config
        self.state_dir: Path = config.state_dir()
        self.builder, self.hooks, self.stopper = builder, hooks, stopper
        self.initial_peers, self.wall_clock = initial_peers, wall_clock
        #: Where the peer checks' rounds record whom they vouch for (None: a fetcher, which averages with nobody).
        self.vouches = vouches
        self.plan: RunPlan | None = None
        self.keeper: RunKeeper | None = None
        #: The peer checks (p2ptrain.optim.defences.Defences); None when off.
        self.defences: Defences | None = None
        self.swarm: JoinedSwarm | None = None
        self.presence: SwarmPresence | None = None
        self.parts: Closable | None = None
        self._lock: IdentityLock | None = None

    def prepare(self, *, fetch_manifest: bool) -> NodeConfig:
        """An owned run's plan (None: a plain run) and the config it gives; reads the manifest file and
        the identity, writes nothing.  With ``fetch_manifest`` a plan without a manifest (only the
        run's reference) gets the swarm's now, through a short-lived DHT, before anything is written
        (a node: a config the manifest contradicts leaves its state directory untouched); without it,
        :meth:`follow_run` fetches it once joined."""
        self.plan = self.builder.prepare(self.config, self.state_dir)
        if fetch_manifest and self.plan is not None and self.plan.manifest is None:
            self.plan = self.builder.fetch_manifest(self.plan, self.initial_peers(), self.stopper)
        if self.plan is not None:
            self.config = self.plan.config
        return self.config

    def open(self) -> None:
        """Make and lock the state directory (:class:`~p2ptrain.swarm.dht.IdentityInUse` when another live
        process holds it), then the peer checks: their gate and round reports live in memory shared
        with the averagers' processes, so they are made before hivemind forks any."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = IdentityLock(self.state_dir)
        lock.acquire()
        self._lock = lock
        try:
            self.defences = Defences.from_config(self.config.swarm, vouches=self.vouches)
        except BaseException:
            self._release()
            raise

    def join(self) -> JoinedSwarm:
        """Start the DHT (bounded by ``swarm.bootstrap_timeout``), validating the hooks' records and the
        owned run's entries."""
        validators = self.hooks.record_validators(self.config.swarm.run_id)
        self.swarm = self.builder.join(self.config, self.state_dir, self.initial_peers, validators, self.stopper,
                                       self.wall_clock, plan=self.plan)
        return self.swarm

    def follow_run(self, timeout: float) -> NodeConfig:
        """An owned run: its keeper looks up the swarm's newest manifest (for up to ``timeout`` seconds when
        the plan has none), which decides the run-wide settings from here on.  A plain run: the config
        as it is."""
        if self.plan is not None:
            assert self.swarm is not None, "join first"
            self.keeper = self.builder.follow_run(self.plan, self.swarm)
            self.config = self.keeper.join(self.stopper, timeout)
        return self.config

    def read_records(self) -> bool:
        """Hand the hooks this process's presence in the swarm: the run's peer records are read (and a
        node's published) from now on, into the peer checks' evidence.  True when records are read."""
        assert self.swarm is not None, "join first"
        evidence = self.defences.joined_through(self.swarm.trusted) if self.defences is not None else None
        self.presence = SwarmPresence(self.swarm.dht, self.config.swarm.run_id, self.swarm.peer_id, evidence)
        return self.hooks.joined(self.presence)

    def build(self, make: Callable[..., _Parts]) -> _Parts:
        """The parts this process runs with, from ``make(config, swarm, run=keeper, defences=defences)``
        (a builder's ``build_training`` or ``build_client``); closed by :meth:`leave`."""
        assert self.swarm is not None, "join first"
        parts = make(self.config, self.swarm, run=self.keeper, defences=self.defences)
        self.parts = parts
        return parts

    def leave(self, exit_code: Callable[[], int]) -> None:
        """Close the hooks (records, services), the parts and the swarm in that order; if they have not
        all returned within the shutdown deadline, every helper is stopped and the process ends with
        ``exit_code()`` (read then).  Then the state directory's lock is released."""
        closers = [self.hooks.stopping]
        if self.parts is not None:
            closers.append(self.parts.close)
        if self.swarm is not None:
            closers.append(self.swarm.close)
        try:
            close_within_deadline(closers, exit_code)
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
