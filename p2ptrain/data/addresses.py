"""Which addresses a download may reach: each address's class, and the rule for redirects and index lines.

A data host is a stranger to the volunteer that reads from it.  A host on the public internet
could otherwise send the volunteer's node, by a redirect or by a line of its shard index, to an
address only that node can reach: its own loopback services, its LAN, or a cloud machine's metadata
service at 169.254.169.254.  The rule: the first address of a download (the data path, or the host
that served the index listing the shard) may be any but a link-local one; after it, a public
address may always be reached, a loopback, private or link-local one only while every address
before it in the chain was of that same class.  So a LAN data host may redirect within the LAN,
and a public one only to other public hosts.

The class of an address is a policy, injected where downloads are made (:class:`AddressPolicy`),
so that tests on 127.0.0.1 can stand a loopback server in for a public host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

PUBLIC, PRIVATE, LOOPBACK, LINK_LOCAL = "public", "private", "loopback", "link-local"

Classifier = Callable[[str, int], str]
"""The class of an IP address (and port) a download is about to connect to."""


def address_class(ip: str, port: int = 0) -> str:
    """``public``, ``private``, ``loopback`` or ``link-local``; anything not globally routable is private."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])  # an IPv6 zone index names an interface, not an address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:  # 0.0.0.0 and :: reach this machine
        return LOOPBACK
    if address.is_link_local:
        return LINK_LOCAL
    if address.is_global and not address.is_multicast:
        return PUBLIC
    return PRIVATE  # RFC 1918, unique local, shared (CGNAT), reserved, multicast, documentation


class Refused(Exception):
    """A download the address or scheme rules do not allow; the message says why in one line."""


@dataclass(frozen=True)
class AddressPolicy:
    """The address classes downloads go by (``classify``: :func:`address_class` unless a test says otherwise)."""

    classify: Classifier = address_class

    def check(self, reach: str | None, host: str, ip: str, port: int) -> str:
        """The class of ``ip`` (``host``'s address) when a chain that has reached ``reach`` (None: nothing
        yet) may connect to it; :class:`Refused` with the reason otherwise."""
        target = self.classify(ip, port)
        if reach is None:
            if target == LINK_LOCAL:
                raise Refused(f"{_named(host, ip)} is a link-local address (a machine's own network, such as a "
                              "cloud metadata service); data is never read from one")
            return target
        if target != PUBLIC and target != reach:
            allowed = "public addresses" if reach == PUBLIC else f"public addresses or other {reach} ones"
            raise Refused(f"{_named(host, ip)} is a {target} address, reached from a {reach} one; a data host "
                          f"there may send a download on to {allowed} only")
        return target


def reached(reach: str | None, target: str) -> str:
    """What a chain has reached once it connected to an address of class ``target``."""
    return PUBLIC if reach == PUBLIC or target == PUBLIC else target


def _named(host: str, ip: str) -> str:
    return ip if host.strip("[]") == ip else f"{host} ({ip})"
