"""Can the swarm dial this node?  Ask a peer to try, over a connection this node opened.

A volunteer behind a home router can dial out, so joining, downloading the state and the DHT all
work, and nothing looks wrong; but no peer can open a connection to it, so every averaging round
that needs one fails.  libp2p's own check (AutoNAT) dials back only public addresses and waits for
several peers to agree; this one asks the peers the node joined through, once, at start.

The asked peer opens one plain TCP connection to the address the request came from (the IP it
observes, so it cannot be pointed at another host) at a port the requester listens on, and says
whether it connected.  Both sides bound what they read (:data:`MAX_LINE` bytes) and how long they
wait; a peer answers at most :data:`MAX_CONCURRENT` checks at a time and one per requester every
:data:`PER_PEER_INTERVAL` seconds, so the service cannot be turned into a port scanner or a load.

Wire format, one ASCII line each way: ``dialback <port>[,<port>...]`` (at most :data:`MAX_PORTS`)
and ``ok <ip> <port>``, ``no <ip>`` or ``busy``.  The handler runs in the DHT's process, where the
node's libp2p daemon lives (:meth:`hivemind.DHT.run_coroutine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import hivemind
from hivemind.p2p import PeerID
from multiaddr import Multiaddr

logger = logging.getLogger(__name__)

PROTOCOL = "p2ptrain.dialback.v1"
MAX_LINE = 128
MAX_PORTS = 4
MAX_CONCURRENT = 2
PER_PEER_INTERVAL = 2.0
DIAL_TIMEOUT = 3.0
#: How long the requester waits for one answer: the peer's dial plus the exchange.
ANSWER_TIMEOUT = DIAL_TIMEOUT + 4.0
#: Peers asked at once: the check costs at most one :data:`ANSWER_TIMEOUT` however many are given.
MAX_ASKED = 3
#: Requesters remembered for the per-peer interval (the oldest are forgotten first).
_REMEMBERED = 1024


@dataclass(frozen=True)
class Dialback:
    """What the asked peers said: ``dialable`` True when one connected, False when at least one
    answered and none connected, None when none answered.  ``address`` is where a peer connected
    (``ip:port``) or the IP it tried; ``peer`` the peer that said so."""

    dialable: bool | None
    address: str = ""
    peer: str = ""


def parse_request(line: bytes) -> list[int] | None:
    """The ports of a request line, or None when it is not one (a bounded line, bounded ports)."""
    text = line.decode("ascii", errors="replace").strip()
    word, _, rest = text.partition(" ")
    if word != "dialback" or not rest:
        return None
    ports = [_port_or_none(item) for item in rest.split(",")[:MAX_PORTS]]
    return None if None in ports else [port for port in ports if port is not None]


def parse_answer(line: bytes) -> tuple[bool | None, str]:
    """(connected, address) from an answer line; (None, "") for ``busy`` or anything else.  The address
    is shown in the node's log and status, so it must be an IP address (and a port), nothing else."""
    words = line.decode("ascii", errors="replace").split()
    ip = _ip_or_none(words[1]) if len(words) in (2, 3) else None
    if ip is not None and len(words) == 3 and words[0] == "ok" and _port_or_none(words[2]) is not None:
        return True, f"{ip}:{int(words[2])}"
    if ip is not None and len(words) == 2 and words[0] == "no":
        return False, ip
    return None, ""


def _ip_or_none(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _port_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def observed_ip(addr: Multiaddr) -> str | None:
    """The IP a stream came from, when it came straight over IP (not through a relay)."""
    text = str(addr)
    if "/p2p-circuit" in text:
        return None
    parts = text.split("/")
    return _ip_or_none(parts[2]) if len(parts) >= 3 and parts[1] in ("ip4", "ip6") else None


async def _read_line(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """At most :data:`MAX_LINE` bytes, up to the first newline (or what came before the peer closed)."""
    data = b""
    async with asyncio.timeout(timeout):
        while b"\n" not in data and len(data) < MAX_LINE:
            chunk = await reader.read(MAX_LINE - len(data))
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0]


async def _connects(ip: str, port: int) -> bool:
    try:
        async with asyncio.timeout(DIAL_TIMEOUT):
            _, writer = await asyncio.open_connection(ip, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


class DialbackService:
    """The answering side: one instance in the DHT's process."""

    def __init__(self) -> None:
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self._last: OrderedDict[str, float] = OrderedDict()

    def _allowed(self, peer: str, now: float) -> bool:
        last = self._last.get(peer)
        if last is not None and now - last < PER_PEER_INTERVAL:
            return False
        self._last[peer] = now
        self._last.move_to_end(peer)
        while len(self._last) > _REMEMBERED:
            self._last.popitem(last=False)
        return True

    async def handle(self, info: object, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer = await self._answer(info, reader)
            writer.write(answer + b"\n")
            async with asyncio.timeout(DIAL_TIMEOUT):
                await writer.drain()
        except Exception as error:  # the requester went away, or sent what no check allows: never raise here
            logger.debug("dial-back check for %s not answered: %r", getattr(info, "peer_id", "?"), error)
        finally:
            writer.close()

    async def _answer(self, info: object, reader: asyncio.StreamReader) -> bytes:
        ports = parse_request(await _read_line(reader, DIAL_TIMEOUT))
        ip = observed_ip(getattr(info, "addr", Multiaddr("/ip4/0.0.0.0")))
        if ports is None or ip is None:
            return b"busy"  # nothing this peer can check; the requester learns nothing either way
        if self._slots.locked() or not self._allowed(str(getattr(info, "peer_id", "")), time.monotonic()):
            return b"busy"
        async with self._slots:
            for port in ports:
                if await _connects(ip, port):
                    return f"ok {ip} {port}".encode()
        return f"no {ip}".encode()


async def _serve(_dht: hivemind.DHT, node: hivemind.dht.DHTNode) -> None:
    await node.p2p.add_binary_stream_handler(PROTOCOL, DialbackService().handle)


def serve_dialback(dht: hivemind.DHT) -> None:
    """Answer peers' dial-back checks (every node that accepts connections does)."""
    dht.run_coroutine(_serve)


async def _ask_one(node: hivemind.dht.DHTNode, peer: str, request: bytes) -> tuple[bool | None, str]:
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            _, reader, writer = await node.p2p.call_binary_stream_handler(PeerID.from_base58(peer), PROTOCOL)
            try:
                writer.write(request)
                await writer.drain()
                return parse_answer(await _read_line(reader, ANSWER_TIMEOUT))
            finally:
                writer.close()
    except Exception as error:  # an older peer without the protocol, a peer gone: no answer
        logger.debug("dial-back check by %s: %r", peer, error)
        return None, ""


async def _ask(peers: Sequence[str], ports: Sequence[int], _dht: hivemind.DHT,
               node: hivemind.dht.DHTNode) -> Dialback:
    request = f"dialback {','.join(str(p) for p in ports[:MAX_PORTS])}\n".encode()
    asked = list(dict.fromkeys(peers))[:MAX_ASKED]
    answers = [Dialback(*answer, peer) for peer, answer in
               zip(asked, await asyncio.gather(*(_ask_one(node, peer, request) for peer in asked)), strict=True)]
    decisive = [a for a in answers if a.dialable] or [a for a in answers if a.dialable is False]
    return decisive[0] if decisive else Dialback(None)


def listen_ports(maddrs: Sequence[str]) -> list[int]:
    """The TCP ports this node listens on, as its visible addresses show them (relay addresses aside)."""
    ports: list[int] = []
    for addr in maddrs:
        if "/p2p-circuit" in addr:
            continue
        parts = addr.split("/")
        if "tcp" in parts:
            value = parts[parts.index("tcp") + 1]
            if value.isdigit() and int(value) not in ports:
                ports.append(int(value))
    return ports[:MAX_PORTS]


def ask_dialback(dht: hivemind.DHT, peers: Sequence[str], maddrs: Sequence[str]) -> Dialback:
    """Ask ``peers`` (the first :data:`MAX_ASKED`, at once) to dial this node back at the ports of
    ``maddrs``: dialable when one connected, not when one answered and none did; within :data:`ANSWER_TIMEOUT`."""
    ports = listen_ports(maddrs)
    if not peers or not ports:
        return Dialback(None)
    return dht.run_coroutine(functools.partial(_ask, list(peers), ports))
