"""The dial-back check's wire: bounded request and answer lines, the observed address, the answering
side's limits.  (A real exchange between two DHT peers is in tests/integration/test_dialback.py.)"""

from __future__ import annotations

import asyncio

from multiaddr import Multiaddr

from p2ptrain.swarm.dialback import (
    MAX_LINE,
    MAX_PORTS,
    PER_PEER_INTERVAL,
    DialbackService,
    listen_ports,
    observed_ip,
    parse_answer,
    parse_request,
)


def test_a_request_names_at_most_four_valid_ports() -> None:
    assert parse_request(b"dialback 41400\n") == [41400]
    assert parse_request(b"dialback 1,2,3,4,5,6") == [1, 2, 3, 4][:MAX_PORTS]
    for bad in (b"dialback 0", b"dialback 65536", b"dialback -1", b"dialback x", b"dialback", b"hello 1", b"\xff"):
        assert parse_request(bad) is None, bad


def test_answers_parse_and_anything_else_is_no_answer() -> None:
    assert parse_answer(b"ok 198.51.100.7 41400") == (True, "198.51.100.7:41400")
    assert parse_answer(b"no 198.51.100.7") == (False, "198.51.100.7")
    assert parse_answer(b"busy") == (None, "")
    assert parse_answer(b"ok") == (None, "")
    # What a peer answers ends up in the log and the status: only an IP address and a port get through.
    for hostile in (b"ok \x1b[31mred 41400", b"ok 198.51.100.7 99999", b"ok 198.51.100.7 x", b"no evil.example",
                    b"no 198.51.100.7 41400 extra", b"ok 198.51.100.7 41400 extra"):
        assert parse_answer(hostile) == (None, ""), hostile


def test_the_observed_ip_is_taken_only_from_a_direct_ip_address() -> None:
    assert observed_ip(Multiaddr("/ip4/198.51.100.7/tcp/5555")) == "198.51.100.7"
    assert observed_ip(Multiaddr("/ip6/::1/tcp/5555")) == "::1"
    relay = "/ip4/203.0.113.5/tcp/1/p2p/QmSvV9gjzaXmyVnNYEWuk2R95Rf3wRZuYJhDTvMKeFCebX"
    assert observed_ip(Multiaddr(f"{relay}/p2p-circuit")) is None
    assert observed_ip(Multiaddr("/dns4/example.org/tcp/1")) is None


def test_listen_ports_skip_relay_addresses_and_repeats() -> None:
    maddrs = ["/ip4/127.0.0.1/tcp/41400/p2p/QmA", "/ip4/192.168.1.2/tcp/41400/p2p/QmA",
              "/ip4/203.0.113.5/tcp/9/p2p/QmR/p2p-circuit/p2p/QmA", "/ip4/192.168.1.2/tcp/41401"]
    assert listen_ports(maddrs) == [41400, 41401]


class _Info:
    def __init__(self, addr: str, peer: str) -> None:
        self.addr, self.peer_id = Multiaddr(addr), peer


async def _exchange(service: DialbackService, info: _Info, request: bytes) -> bytes:
    reader = asyncio.StreamReader()
    reader.feed_data(request)
    reader.feed_eof()
    return await service._answer(info, reader)


def test_the_service_dials_only_the_observed_ip_and_once_per_peer_per_interval() -> None:
    async def scenario() -> list[bytes]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        service = DialbackService()
        try:
            first = await _exchange(service, _Info("/ip4/127.0.0.1/tcp/5555", "QmA"), f"dialback {port}\n".encode())
            again = await _exchange(service, _Info("/ip4/127.0.0.1/tcp/5555", "QmA"), f"dialback {port}\n".encode())
            other = await _exchange(service, _Info("/ip4/127.0.0.1/tcp/5556", "QmB"), b"dialback 1\n")
            garbage = await _exchange(service, _Info("/ip4/127.0.0.1/tcp/5557", "QmC"), b"x" * (MAX_LINE * 4))
        finally:
            server.close()
        return [first, again, other, garbage]

    first, again, other, garbage = asyncio.run(scenario())
    assert first.startswith(b"ok 127.0.0.1 ")
    assert again == b"busy", f"a second check within {PER_PEER_INTERVAL} s"
    assert other == b"no 127.0.0.1"  # nothing listens on port 1
    assert garbage == b"busy"
