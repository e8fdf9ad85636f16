"""A throw-away shaped network: one namespace per peer, joined by a bridge, each link tbf-limited.

Addresses are this harness's own (10.213.0.x/24 on veths inside namespaces it creates), so all
traffic stays between those namespaces.  :func:`shaped_network` always deletes what it created.

Namespaces outlive a process that is killed (a CI job cancelled, a machine's session stopped), so
every name carries its maker's process ID, two runs on one machine never share a name, and a new
topology first deletes the namespaces whose maker is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
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
        return sum(_tx_bytes(ns, dev) for ns, dev in zip(self.namespaces, self.interfaces, strict=True))


def _tx_bytes(ns: str, dev: str) -> int:
    """Bytes sent so far on interface ``dev`` of namespace ``ns``."""
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"],
                         capture_output=True, text=True, check=True, timeout=10)
    return int(out.stdout.strip())


def _ip(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=20)


#: This harness's namespace names: a prefix, the maker's process ID, then the namespace's role
#: (``p2pnat-wan`` and the like, with no process ID, are from versions before the ID was added).
_OURS = re.compile(r"^(?:p2pbench|p2pnat)(?P<tag>(?P<pid>\d+)x\d+)?-\S+$")
_topologies = itertools.count()
#: Tags of the topologies this process has up now (the only ones of its own that are not stale).
_live_tags: set[str] = set()


def _new_tag() -> str:
    """A tag no other topology on this machine has now: this process's ID and a per-process count."""
    tag = f"{os.getpid()}x{next(_topologies)}"
    _live_tags.add(tag)
    return tag


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_namespaces(listing: str, own_pid: int, live_tags: set[str]) -> list[str]:
    """The names in ``ip netns list`` output that this harness made and whose maker is gone."""
    stale = []
    for line in listing.splitlines():
        name = line.split(" ", 1)[0]
        match = _OURS.match(name)
        if match is None:
            continue
        pid, tag = match.group("pid"), match.group("tag")
        if pid is None or (int(pid) == own_pid and tag not in live_tags) or (
                int(pid) != own_pid and not _alive(int(pid))):
            stale.append(name)
    return stale


def _remove_stale_namespaces() -> None:
    """Delete the namespaces a killed run of this harness left behind (they hold no live peer)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    for name in stale_namespaces(listing, os.getpid(), _live_tags):
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


def netns_unavailable() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    probe = f"{PREFIX}{os.getpid()}x0-probe"
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
    _remove_stale_namespaces()
    tag = _new_tag()
    bridge_ns = f"{PREFIX}{tag}-br"
    names = [f"{PREFIX}{tag}-{i}" for i in range(peers)]
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
        _delete(created, tag)


def _delete(namespaces: list[str], tag: str) -> None:
    for ns in reversed(namespaces):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
    _live_tags.discard(tag)


NAT_PREFIX = "p2pnat"
#: The "internet" between the public peer and the routers' WAN sides.
WAN_SUBNET = "10.214.0"


@dataclass(frozen=True)
class NatNet:
    """One public peer and volunteers each behind its own NAT router (all in namespaces made here).

    ``public_ns``/``public_address``: the public peer, dialable at its address.  ``homes[i]``: the
    namespace a volunteer runs in, ``router_addresses[i]`` the WAN address its router masquerades it
    as.  Routers drop every connection opened from the WAN (unless they forward a port).
    """

    public_ns: str
    public_address: str
    homes: list[str]
    routers: list[str]
    router_addresses: list[str]

    def wan_tx_bytes(self) -> int:
        """Bytes sent so far on every WAN link (the public peer's and each router's)."""
        return sum(_tx_bytes(ns, "wan0") for ns in (self.public_ns, *self.routers))


def nat_unavailable() -> str | None:
    """None when NAT routers can be built here (namespaces and iptables), else why not."""
    reason = netns_unavailable()
    if reason is not None:
        return reason
    try:
        subprocess.run(["iptables", "--version"], capture_output=True, check=True, timeout=10)
    except (FileNotFoundError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "iptables is not installed (make test installs it as root)"
    return None


def _veth(ns_a: str, dev_a: str, ns_b: str, dev_b: str) -> None:
    _ip("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
    _ip("ip", "-n", ns_a, "link", "set", dev_a, "up")
    _ip("ip", "-n", ns_b, "link", "set", dev_b, "up")


@contextlib.contextmanager
def nat_network(volunteers: int = 2, rate: str | None = None, forward: int | None = None) -> Iterator[NatNet]:
    """A public peer and ``volunteers`` homes, each behind a MASQUERADE router that drops inbound
    connections (a home router without forwarded ports).  ``rate``: every WAN link tbf-shaped.
    ``forward``: a TCP port each router forwards to its home (the same port inside), as a volunteer
    who set up port forwarding has it."""
    _remove_stale_namespaces()
    tag = _new_tag()
    wan, public = f"{NAT_PREFIX}{tag}-wan", f"{NAT_PREFIX}{tag}-pub"
    homes = [f"{NAT_PREFIX}{tag}-home{i}" for i in range(volunteers)]
    routers = [f"{NAT_PREFIX}{tag}-rtr{i}" for i in range(volunteers)]
    created: list[str] = []
    try:
        for ns in [wan, public, *routers, *homes]:
            _ip("ip", "netns", "add", ns)
            created.append(ns)
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
        _ip("ip", "-n", wan, "link", "add", "br0", "type", "bridge")
        _ip("ip", "-n", wan, "link", "set", "br0", "up")
        wan_links = [(public, "wan0", f"{WAN_SUBNET}.1")]
        wan_links += [(router, "wan0", f"{WAN_SUBNET}.{10 + i}") for i, router in enumerate(routers)]
        for i, (ns, dev, address) in enumerate(wan_links):
            _veth(ns, dev, wan, f"port{i}")
            _ip("ip", "-n", wan, "link", "set", f"port{i}", "master", "br0")
            _ip("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            if rate:
                for where, link in ((ns, dev), (wan, f"port{i}")):
                    _ip("tc", "-n", where, "qdisc", "add", "dev", link, "root", "tbf", "rate", rate,
                        "burst", "64kb", "latency", "100ms")
        for i, (router, home) in enumerate(zip(routers, homes, strict=True)):
            lan = f"192.168.{10 + i}"
            _veth(router, "lan0", home, "eth0")
            _ip("ip", "-n", router, "addr", "add", f"{lan}.1/24", "dev", "lan0")
            _ip("ip", "-n", home, "addr", "add", f"{lan}.2/24", "dev", "eth0")
            _ip("ip", "-n", home, "route", "add", "default", "via", f"{lan}.1")
            router_cmd = ["ip", "netns", "exec", router]
            _ip(*router_cmd, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            _ip(*router_cmd, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE")
            _ip(*router_cmd, "iptables", "-A", "FORWARD", "-i", "wan0", "-o", "lan0", "-m", "conntrack",
                "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
            if forward is not None:
                _ip(*router_cmd, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "wan0", "-p", "tcp", "--dport",
                    str(forward), "-j", "DNAT", "--to-destination", f"{lan}.2:{forward}")
                _ip(*router_cmd, "iptables", "-A", "FORWARD", "-i", "wan0", "-p", "tcp", "-d", f"{lan}.2",
                    "--dport", str(forward), "-j", "ACCEPT")
            _ip(*router_cmd, "iptables", "-A", "FORWARD", "-i", "wan0", "-j", "DROP")
            # Nothing on the WAN may open a connection to the router itself either.
            _ip(*router_cmd, "iptables", "-A", "INPUT", "-i", "wan0", "-m", "conntrack",
                "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
            _ip(*router_cmd, "iptables", "-A", "INPUT", "-i", "wan0", "-j", "DROP")
        yield NatNet(public, f"{WAN_SUBNET}.1", homes, routers, [f"{WAN_SUBNET}.{10 + i}" for i in range(volunteers)])
    finally:
        _delete(created, tag)
