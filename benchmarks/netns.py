"""A throw-away shaped network: one namespace per peer, joined by a bridge, each link tbf-limited.

Addresses are this harness's own (10.213.0.x/24 on veths inside namespaces it creates), so all
traffic stays between those namespaces.  :func:`shaped_network` always deletes what it created.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "p2pbench"
SUBNET = "10.213.0"


@dataclass(frozen=True)
class ShapedNet:
    namespaces: list[str]
    addresses: list[str]
    interfaces: list[str]
    rate: str

    def exec_prefix(self, rank: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[rank]]

    def tx_bytes(self) -> int:
        """Bytes the peers have sent on their links so far (their upload, protocol overhead included)."""
        total = 0
        for ns, dev in zip(self.namespaces, self.interfaces, strict=True):
            out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"],
                                 capture_output=True, text=True, check=True, timeout=10)
            total += int(out.stdout.strip())
        return total


def _ip(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=20)


def netns_unavailable() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    probe = f"{PREFIX}-probe"
    try:
        _ip("ip", "netns", "add", probe)
    except FileNotFoundError:
        return "the 'ip' tool is not installed"
    except subprocess.CalledProcessError as exc:
        return f"'ip netns add' failed: {exc.stderr.strip() or exc}"
    except subprocess.TimeoutExpired:
        return "'ip netns add' timed out"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


@contextlib.contextmanager
def shaped_network(peers: int, rate: str = "20mbit") -> Iterator[ShapedNet]:
    """``peers`` namespaces on a bridge; every peer's upload and download limited to ``rate``."""
    bridge_ns = f"{PREFIX}-br"
    names = [f"{PREFIX}-{i}" for i in range(peers)]
    created: list[str] = []
    try:
        for ns in [bridge_ns, *names]:
            _ip("ip", "netns", "add", ns)
            created.append(ns)
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
        _ip("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("ip", "-n", bridge_ns, "link", "set", "br0", "up")
        for i, ns in enumerate(names):
            peer_dev, bridge_dev = f"vp{i}", f"vb{i}"
            _ip("ip", "link", "add", peer_dev, "netns", ns, "type", "veth", "peer", "name", bridge_dev,
                "netns", bridge_ns)
            _ip("ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", peer_dev)
            _ip("ip", "-n", ns, "link", "set", peer_dev, "up")
            _ip("ip", "-n", bridge_ns, "link", "set", bridge_dev, "master", "br0")
            _ip("ip", "-n", bridge_ns, "link", "set", bridge_dev, "up")
            # tbf on both ends: the peer's egress is its upload, the bridge port's egress its download.
            for where, dev in ((ns, peer_dev), (bridge_ns, bridge_dev)):
                _ip("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "64kb", "latency", "100ms")
        yield ShapedNet(names, [f"{SUBNET}.{i + 1}" for i in range(peers)], [f"vp{i}" for i in range(peers)], rate)
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
