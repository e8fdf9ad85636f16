"""Where a node or ``p2ptrain run show`` gets a run's manifest: a file, a running DHT, or a swarm to dial.

Each source returns a manifest that verified (for the run reference, when one is known) or
raises one line: :class:`~p2ptrain.run.manifest.ManifestError` for a bad manifest (exit 78),
:class:`SourceUnavailable` when nothing could be fetched (swarm weather, exit 1).
:func:`fetch_before_join` is the one-line join's: it dials the swarm with a short-lived client
DHT, before the node has written anything, so that a manifest the node's config contradicts
ends it with nothing left behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p2ptrain.run.layout import manifest_path
from p2ptrain.run.manifest import Manifest, ManifestError, read_manifest_file
from p2ptrain.runref import RunRef
from p2ptrain.waiting import GaveUp, StopEvent, retry


class SourceUnavailable(Exception):
    """No manifest could be fetched (nobody answered, or nobody holds one); the one line to show."""


class ManifestSource(Protocol):
    def describe(self) -> str: ...

    def fetch(self) -> Manifest: ...


@dataclass(frozen=True)
class FileSource:
    """A manifest file, e.g. ``--manifest run.toml``; checked against ``ref`` when given."""

    path: Path
    ref: RunRef | None = None

    def describe(self) -> str:
        return f"file {self.path}"

    def fetch(self) -> Manifest:
        return read_manifest_file(self.path, self.ref)


@dataclass(frozen=True)
class DhtSource:
    """The newest valid manifest in an already running DHT (the node's own)."""

    dht: Any
    ref: RunRef
    timeout: float = 10.0

    def describe(self) -> str:
        return f"the swarm of run {self.ref}"

    def fetch(self) -> Manifest:
        from p2ptrain.swarm.run_entries import fetch_manifest

        found = fetch_manifest(self.dht, self.ref, timeout=self.timeout)
        if found.manifest is None:
            ignored = f" ({found.invalid} invalid entries ignored: {found.problem})" if found.invalid else ""
            raise SourceUnavailable(f"no valid manifest of run {self.ref} found in the swarm{ignored}")
        return found.manifest


@dataclass(frozen=True)
class SwarmSource:
    """Dial ``join`` with a short-lived client-mode DHT on loopback, fetch, leave. Open runs only:
    an invite run's DHT answers only its invited peers."""

    ref: RunRef
    join: tuple[str, ...]
    timeout: float = 15.0
    dht_options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"the swarm of run {self.ref} via {self.join[0]}"

    def fetch(self) -> Manifest:
        import hivemind

        from p2ptrain.swarm.run_entries import run_validators

        options = {**_CLIENT_DHT, **self.dht_options}
        try:
            dht = hivemind.DHT(start=True, initial_peers=list(self.join), record_validators=run_validators(self.ref),
                               **options)
        except Exception as exc:
            raise SourceUnavailable(f"could not join the swarm via {', '.join(self.join)}: "
                                    f"{str(exc).splitlines()[-1][:200] if str(exc) else type(exc).__name__} "
                                    "(an invite run's DHT answers only invited peers)") from None
        try:
            return DhtSource(dht, self.ref, self.timeout).fetch()
        finally:
            dht.shutdown()


#: A DHT that only asks: dials out, listens on loopback alone, no NAT traversal, a throwaway identity.
_CLIENT_DHT: dict[str, Any] = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True, nat_port_map=False,
                                   auto_nat=False)


def fetch_before_join(ref: RunRef, peers: Sequence[str], *, timeout: float, stop: StopEvent,
                      dht_options: dict[str, Any] | None = None, invited: bool = False,
                      dht_factory: Callable[..., Any] | None = None,
                      clock: Callable[[], float] = time.monotonic) -> Manifest:
    """The newest valid manifest of ``ref``, fetched through ``peers`` within ``timeout`` seconds.

    A client-mode DHT with a throwaway identity (in a temporary directory, removed after) joins,
    looks the manifest up (again, with backoff, while none is found) and leaves; the node's state
    directory is not touched. ``dht_options`` carry an invite run's authorizer, which signs with
    the node's own key. Raises :class:`SourceUnavailable`, one line saying whether the peers could
    not be reached, refused to answer (``invited`` False: a hint that the run may be invite-only),
    or hold no manifest.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="p2ptrain-join-") as scratch:
        identity = Path(scratch) / "identity.key"
        try:
            return _fetch_through(ref, peers, timeout, stop, {**(dht_options or {}), "identity_path": str(identity)},
                                  invited, dht_factory, clock)
        finally:
            from p2ptrain.swarm.dht import stop_stale_daemons

            stop_stale_daemons(identity)  # a DHT whose bootstrap failed leaves its p2pd behind


def _fetch_through(ref: RunRef, peers: Sequence[str], timeout: float, stop: StopEvent,
                   options: dict[str, Any], invited: bool, dht_factory: Callable[..., Any] | None,
                   clock: Callable[[], float]) -> Manifest:
    import hivemind
    from hivemind.p2p import P2PDaemonError

    from p2ptrain.swarm.dht import BOOTSTRAP_FAILED, invite_only_hint, unanswered
    from p2ptrain.swarm.run_entries import run_validators

    factory = dht_factory or hivemind.DHT
    deadline = clock() + timeout
    refused = False

    def attempt() -> Manifest | None:
        nonlocal refused
        try:
            dht = factory(start=True, initial_peers=list(peers), record_validators=run_validators(ref),
                          check_if_identity_free=False, **{**_CLIENT_DHT, **options})
        except (P2PDaemonError, RuntimeError) as exc:
            refused = not isinstance(exc, P2PDaemonError)
            if refused and BOOTSTRAP_FAILED not in str(exc):
                raise
            return None
        try:
            return _await_manifest(dht, ref, deadline - clock(), stop, clock=clock, shown_timeout=timeout)
        finally:
            dht.shutdown()

    try:
        return retry(attempt, timeout=timeout, clock=clock, sleep=stop.wait)
    except GaveUp as gave_up:
        hint = "" if invited or not refused else invite_only_hint(ref)
        raise SourceUnavailable(unanswered(refused, gave_up.tries, timeout, peers, hint)) from None


def _await_manifest(dht: Any, ref: RunRef, timeout: float, stop: StopEvent, *,
                   clock: Callable[[], float] = time.monotonic, shown_timeout: float | None = None) -> Manifest:
    """The newest valid manifest of ``ref`` in a running DHT, looked up again (:func:`p2ptrain.waiting.retry`)
    while none is found, for ``timeout`` seconds; then, or when ``stop`` is set, :func:`not_found`
    (saying ``shown_timeout``, default ``timeout``)."""
    from p2ptrain.swarm.run_entries import fetch_manifest

    deadline, invalid = clock() + timeout, 0

    def lookup() -> Manifest | None:
        nonlocal invalid
        found = fetch_manifest(dht, ref, timeout=max(1.0, min(10.0, deadline - clock())))
        invalid += found.invalid
        return found.manifest

    try:
        return retry(lookup, timeout=timeout, clock=clock, sleep=stop.wait)
    except GaveUp:
        raise not_found(ref, timeout if shown_timeout is None else shown_timeout, invalid) from None


def not_found(ref: RunRef, timeout: float, invalid: int) -> SourceUnavailable:
    """The one line for a swarm that held no valid manifest of ``ref`` for ``timeout`` seconds."""
    ignored = f" ({invalid} invalid entries ignored)" if invalid else ""
    return SourceUnavailable(f"no valid manifest of run {ref} found in the swarm within {timeout:.0f}s{ignored}")


def open_source(target: str, *, join: list[str] | tuple[str, ...] = (), timeout: float = 15.0) -> ManifestSource:
    """A manifest file if ``target`` names one, else a run reference fetched through ``join``."""
    path = manifest_path(Path(target))
    if path.exists():
        return FileSource(path)
    if path.suffix == ".toml" or "/" in target:
        raise ManifestError(f"manifest {path}: no such file")
    ref = RunRef.parse(target)
    if not join:
        raise ManifestError(f"run {ref}: fetching its manifest from a swarm needs --join ADDR (a node of the run); "
                            "or pass the manifest file")
    from p2ptrain.config.schema import parse_multiaddr

    for addr in join:
        try:
            parse_multiaddr(addr, need_peer_id=True)
        except ValueError as exc:
            raise ManifestError(f"--join: {exc}") from None
    return SwarmSource(ref, tuple(join), timeout)
