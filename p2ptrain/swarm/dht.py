"""The only place that creates a ``hivemind.DHT``: identity, addresses, bootstrap, model fingerprint.

A node keeps its libp2p identity in its state directory, so its peer ID survives restarts, and
holds an exclusive lock next to it so that two live processes can never share one identity (peer
records sign with it: :mod:`p2ptrain.swarm.identity`).  Joining an existing swarm retries with exponential
backoff until ``swarm.bootstrap_timeout``; after that it fails with one line that names the peers it
tried.  The run's model fingerprint entry is a hint anyone can write; only the identity-bound record of
a peer the node trusts (one it joined through, or averaged with) naming another model makes it refuse
to join.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hivemind
from hivemind.p2p import P2PDaemonError
from hivemind.utils import get_dht_time

from p2ptrain.config.schema import SwarmSection
from p2ptrain.dhtkeys import fingerprint_key, peers_key
from p2ptrain.proc import processes_matching, stop_processes
from p2ptrain.swarm.daemon_flags import extra_daemon_flags, relay_flags
from p2ptrain.swarm.identity import identity_path
from p2ptrain.waiting import GaveUp, StopEvent, retry

logger = logging.getLogger(__name__)

FINGERPRINT_TTL = 600.0
#: What hivemind's DHT raises when initial peers were reached but none answered a ping (e.g. the
#: closed DHT of an invite run refusing a stranger).
BOOTSTRAP_FAILED = "bootstrap failed"
#: Foreign fingerprints looked into (oldest first) and progress entries read per key: a flood of
#: entries costs a bounded number of lookups.
_MAX_FOREIGN_FINGERPRINTS = 4
#: (run, fingerprint) entries already warned about: each conflicting entry is one warning per process.
_ignored: set[tuple[str, str]] = set()


class SwarmError(Exception):
    """The swarm could not be joined; the message is the one line to show."""


class IdentityInUse(SwarmError):
    """Another live process holds this state directory (and so this peer identity)."""


class PeersRefused(SwarmError):
    """Initial peers were reached but answered none of this node's DHT requests (a closed swarm)."""


class FingerprintMismatch(SwarmError):
    """This node's model differs from the one the run is training."""


class IdentityLock:
    """An exclusive ``flock`` on ``<state_dir>/node.lock``; released when the process dies, however."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "node.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise IdentityInUse(
                f"another p2ptrain node (pid {holder}) is running with state directory {self.path.parent}; "
                "give each node its own node.state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


#: Kademlia's k: contacts per routing-table bucket, and how many of the nodes nearest to a key a
#: search visits.  hivemind's default is 20; every search for a key of the run (the records, the
#: progress entries, the averagers' groups, and the search that precedes each store) then visits
#: every node of a swarm of up to 20, so each node's share of the answering grows with the swarm:
#: 25 answers a second per paused node at 16 nodes, against 8 with k = 8 (docs/benchmarks.md,
#: ``benchmarks.scale``).  Values are stored on the 5 nodes nearest to their key (hivemind's
#: ``num_replicas``), all within any search of 8; BitTorrent's DHT runs on k = 8 at any size.
DHT_BUCKET_SIZE = 8


def dht_kwargs(cfg: SwarmSection, identity_path: Path, initial_peers: Sequence[str]) -> dict[str, Any]:
    """Everything hivemind.DHT / P2P.create needs from config; loopback-safe when config says so."""
    kwargs: dict[str, Any] = dict(
        host_maddrs=list(cfg.listen_addrs),
        initial_peers=list(initial_peers),
        client_mode=cfg.client_mode,
        nat_port_map=cfg.nat_port_map,
        auto_nat=cfg.auto_nat,
        use_relay=cfg.use_relay,
        # p2pd refuses to start with auto relay but no relay transport.
        use_auto_relay=cfg.use_auto_relay and cfg.use_relay,
        identity_path=str(identity_path),
        # A fresh identity cannot be taken; an old one is protected by IdentityLock locally, and the
        # remote check costs seconds on every start.
        check_if_identity_free=False,
        bucket_size=DHT_BUCKET_SIZE,
    )
    if cfg.announce_addrs:
        kwargs["announce_maddrs"] = list(cfg.announce_addrs)
    if cfg.relays:  # p2pd's default trusted relays are the bootstrap peers
        kwargs["trusted_relays"] = list(cfg.relays)
    return kwargs


def start_dht(
    cfg: SwarmSection,
    state_dir: Path,
    initial_peers: Sequence[str],
    record_validators: Sequence[Any],
    stop: StopEvent,
    *,
    dht_factory: Callable[..., hivemind.DHT] = hivemind.DHT,
    clock: Callable[[], float] = time.monotonic,
    metrics_port: int | None = None,
    **options: Any,
) -> hivemind.DHT:
    """Start the DHT, retrying (:func:`p2ptrain.waiting.retry`) while no initial peer answers, bounded by
    bootstrap_timeout.

    Its p2p daemon relays within the config's budget and, given ``metrics_port``, serves its own
    metrics there on 127.0.0.1 (:mod:`p2ptrain.swarm.relay_meter` reads them).  ``options`` go to
    ``hivemind.DHT`` as they are (an owned run's ``authorizer``).
    """
    kwargs = {**dht_kwargs(cfg, identity_path(state_dir), initial_peers), **options}
    flags = relay_flags(cfg, metrics_port)
    refused, last = False, ""

    def attempt() -> hivemind.DHT | None:
        nonlocal refused, last
        try:
            with extra_daemon_flags(flags):
                return dht_factory(start=True, record_validators=list(record_validators), **kwargs)
        except (P2PDaemonError, RuntimeError) as exc:
            refused = not isinstance(exc, P2PDaemonError)
            if refused and BOOTSTRAP_FAILED not in str(exc):
                raise
            if not initial_peers:
                raise SwarmError(f"cannot start the p2p daemon on {list(cfg.listen_addrs)}: {exc}") from None
            if refused:  # the failed DHT process may leave its p2pd behind, with our identity
                stop_stale_daemons(identity_path(state_dir))
            last = str(exc).splitlines()[-1][:200]
            return None

    def say_retry(tries: int, wait: float) -> None:
        logger.warning("no initial peer answered%s (attempt %d: %s); retrying in %.1fs",
                       " our DHT requests" if refused else "", tries, last, wait)

    try:
        return retry(attempt, timeout=cfg.bootstrap_timeout, on_retry=say_retry, clock=clock, sleep=stop.wait)
    except GaveUp as gave_up:
        if gave_up.stopped:
            raise SwarmError("stopped while joining the swarm") from None
        raise (PeersRefused if refused else SwarmError)(
            unanswered(refused, gave_up.tries, cfg.bootstrap_timeout, initial_peers)) from None


def unanswered(refused: bool, tries: int, timeout: float, peers: Sequence[str], hint: str = "") -> str:
    """The one line for initial peers that never answered (``refused``: reached, but refusing our DHT
    requests, as an invite run's closed DHT does with a stranger)."""
    how = "answered our DHT requests" if refused else "answered"
    return (f"no initial peer {how} after {tries} attempts in {timeout:.0f}s (swarm.bootstrap_timeout); "
            f"tried {', '.join(peers)}{hint}")


def invite_only_hint(run: object) -> str:
    """What to add when an owned run's peers refused a node without an invite."""
    return (f"; run {run} may be invite-only: ask its owner for an invite for this node's peer ID "
            "(p2ptrain run peer-id prints it) and set swarm.invite")


def stop_stale_daemons(identity_path: Path, grace: float = 2.0) -> int:
    """Stop p2pd processes still running with this node's identity; returns how many there were.

    A p2pd outlives its node by up to its 30 s idle timeout when the node was killed, or when
    hivemind had to kill its DHT process on shutdown.  A restarted node would then share its peer
    ID with that stale daemon, and peers may keep dialling the dead one.  Only called while this
    process holds the state directory's :class:`IdentityLock`, so no live node owns them.
    """
    marker = f"-id={identity_path}"
    stale = processes_matching(lambda command: "p2pd" in command and marker in command.split())
    stop_processes(stale, grace)
    return len(stale)


async def _visible_maddrs(_dht: hivemind.DHT, node: Any, latest: bool) -> list[Any]:
    return list(await node.get_visible_maddrs(latest=latest))


def visible_maddrs(dht: hivemind.DHT, latest: bool = False, timeout: float | None = None) -> list[str]:
    """The node's addresses as peers see them; ``latest`` asks the p2p daemon again (a relay slot taken
    or lost since the start changes them) instead of hivemind's copy from the start.  With ``timeout``,
    a DHT process that has not answered by then raises TimeoutError instead of holding the caller (the
    training loop asks every minute, and hivemind's own call waits for ever)."""
    future = dht.run_coroutine(functools.partial(_visible_maddrs, latest=latest), return_future=True)
    try:
        addrs = future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise TimeoutError(f"the DHT's process did not say this node's addresses within {timeout:g} s") from None
    return [str(addr) for addr in addrs]


@dataclass(frozen=True)
class FingerprintEntry:
    fingerprint: str
    first_seen: float


def read_run_fingerprints(dht: hivemind.DHT, run_id: str) -> list[FingerprintEntry]:
    """All model fingerprints published under the run, oldest first."""
    found = dht.get(fingerprint_key(run_id), latest=True)
    if found is None or not isinstance(found.value, dict):
        return []
    entries = []
    for subkey, item in found.value.items():
        value = getattr(item, "value", None)
        if isinstance(subkey, str) and isinstance(value, int | float):
            entries.append(FingerprintEntry(subkey, float(value)))
    return sorted(entries, key=lambda e: (e.first_seen, e.fingerprint))


def fingerprint_evidence(dht: Any, run_id: str, fingerprints: Sequence[str],
                         trusted: Collection[str] = ()) -> tuple[dict[str, int], dict[str, int]]:
    """How many distinct live peers (not us) are seen training each fingerprint, by their identity-bound
    peer records, and how many of those are ``trusted``.  hivemind's progress entries do not count: their
    peer ID is self-declared, so anyone can write one under any model's keys."""
    from p2ptrain.swarm.records import bound_fingerprints  # records pull in hivemind's validators

    own = str(getattr(dht, "peer_id", ""))
    try:
        records = bound_fingerprints(dht.get(peers_key(run_id), latest=True), run_id, get_dht_time())
    except Exception:  # no records to read: no evidence either way
        records = {}
    seen: dict[str, set[str]] = {fingerprint: set() for fingerprint in fingerprints}
    for peer, fingerprint in records.items():
        if fingerprint in seen and peer != own:
            seen[fingerprint].add(peer)
    trusted = set(trusted)
    return ({fingerprint: len(peers) for fingerprint, peers in seen.items()},
            {fingerprint: len(peers & trusted) for fingerprint, peers in seen.items()})


def claim_fingerprint(dht: hivemind.DHT, run_id: str, fingerprint: str, first_seen: float,
                      trusted: Collection[str] = (), *, publish: bool = True) -> float:
    """Refuse to join a run whose peers train another model; otherwise (re)publish ours. Returns first_seen.

    The fingerprint entries are unsigned: anyone can write one, so an entry alone never stops a node.
    When the oldest entry differs from ours, the node looks at who actually trains what: the
    identity-bound records of live peers.  Identities are free (one process can bind thousands), so only
    the records of ``trusted`` peers are witnesses: the peers the operator had this node join through,
    and the peers it has averaged with.  It raises :class:`FingerprintMismatch` only when no record names
    ours and a witness's record names another model: this node's own config then demonstrably differs
    from what the run's peers train.  Otherwise (strangers' records, however many, or none) it warns once
    per entry, ignores it and looks again at the next refresh.  ``publish=False`` only checks (a peer
    that never trains, such as ``p2ptrain fetch``, claims nothing).
    """
    entries = read_run_fingerprints(dht, run_id)
    if entries and entries[0].fingerprint != fingerprint:
        others = [e.fingerprint for e in entries if e.fingerprint != fingerprint][:_MAX_FOREIGN_FINGERPRINTS]
        evidence, witnesses = fingerprint_evidence(dht, run_id, [fingerprint, *others], trusted)
        # The other model most witnesses train, then the one most records name.
        ranked = sorted(((witnesses[other], evidence[other], other) for other in others if evidence[other] > 0),
                        reverse=True)
        if evidence[fingerprint] == 0 and ranked and ranked[0][0] > 0:
            count, _, theirs = ranked[0]
            raise FingerprintMismatch(
                f"model fingerprint {fingerprint} differs from run {run_id!r}'s model {theirs} ({count} peer(s) "
                "this node joined through or averaged with train it); use the same [task] settings as the swarm, "
                "or another swarm.run_id"
            )
        if (run_id, entries[0].fingerprint) not in _ignored:
            _ignored.add((run_id, entries[0].fingerprint))  # one warning per entry and process
            if evidence[fingerprint]:
                why = f"{evidence[fingerprint]} peer(s) train ours ({fingerprint})"
            elif ranked:
                why = (f"{ranked[0][1]} peer(s) name it in their records, none of them a peer this node joined "
                       "through or averaged with")
            else:
                why = "no live peer is seen training it"
            logger.warning("ignoring model fingerprint %s published under run %r: %s", entries[0].fingerprint,
                           run_id, why)
    first_seen = next((e.first_seen for e in entries if e.fingerprint == fingerprint), first_seen)
    if not publish:
        return first_seen
    dht.store(fingerprint_key(run_id), subkey=fingerprint, value=first_seen,
              expiration_time=get_dht_time() + FINGERPRINT_TTL, return_future=True)
    return first_seen


def peer_ids_of(maddrs: Sequence[str]) -> list[str]:
    """The peer IDs named in multiaddrs (``.../p2p/<id>``), e.g. a node's initial peers."""
    return [addr.rsplit("/p2p/", 1)[1].split("/")[0] for addr in maddrs if "/p2p/" in addr]
