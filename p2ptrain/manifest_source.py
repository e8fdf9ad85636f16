"""Where a node or ``p2ptrain run show`` gets a run's manifest: a file, a running DHT, or a swarm to dial.

Each source returns a manifest that verified (for the run reference, when one is known) or
raises one line: :class:`~p2ptrain.manifest.ManifestError` for a bad manifest (exit 78),
:class:`SourceUnavailable` when nothing could be fetched (swarm weather, exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p2ptrain.manifest import Manifest, ManifestError, read_manifest_file
from p2ptrain.runref import RunRef


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
        from p2ptrain.rundht import fetch_manifest

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

        from p2ptrain.rundht import run_validators

        options = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True, nat_port_map=False,
                       auto_nat=False)
        options.update(self.dht_options)
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


def manifest_path(path: Path) -> Path:
    """``path``, or the ``manifest.toml`` inside it when it is a run's directory."""
    return path / "manifest.toml" if path.is_dir() and (path / "manifest.toml").is_file() else path


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
    from p2ptrain.config import parse_multiaddr

    for addr in join:
        try:
            parse_multiaddr(addr, need_peer_id=True)
        except ValueError as exc:
            raise ManifestError(f"--join: {exc}") from None
    return SwarmSource(ref, tuple(join), timeout)
