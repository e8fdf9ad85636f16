"""The dial-back check between real hivemind peers on 127.0.0.1: a peer that serves it connects back
to a port that listens, says so for one that does not, and a peer without the service gives no answer."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import hivemind
import pytest

from p2ptrain.swarm.dialback import ANSWER_TIMEOUT, ask_dialback, serve_dialback

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def _dht(**options: object) -> hivemind.DHT:
    return hivemind.DHT(host_maddrs=[LOOPBACK], start=True, nat_port_map=False, auto_nat=False, **options)


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[hivemind.DHT, hivemind.DHT]]:
    """A peer that answers checks and one that does not (an older node)."""
    serving, silent = _dht(), _dht()
    serve_dialback(serving)
    try:
        yield serving, silent
    finally:
        for dht in (silent, serving):
            dht.shutdown()


@pytest.fixture
def asking(peers: tuple[hivemind.DHT, hivemind.DHT]) -> Iterator[hivemind.DHT]:
    """A node joining through both (a new identity each test: a peer answers one check a requester per 2 s)."""
    dht = _dht(initial_peers=[str(a) for peer in peers for a in peer.get_visible_maddrs()])
    try:
        yield dht
    finally:
        dht.shutdown()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_serving_peer_connects_back_to_a_listening_port(peers: tuple[hivemind.DHT, hivemind.DHT],
                                                          asking: hivemind.DHT) -> None:
    serving, silent = peers
    own = [str(a) for a in asking.get_visible_maddrs()]
    port = own[0].split("/")[4]
    found = ask_dialback(asking, [str(silent.peer_id), str(serving.peer_id)], own)
    assert (found.dialable, found.address, found.peer) == (True, f"127.0.0.1:{port}", str(serving.peer_id))


def test_a_closed_port_is_not_dialable_and_a_peer_without_the_service_says_nothing(
        peers: tuple[hivemind.DHT, hivemind.DHT], asking: hivemind.DHT) -> None:
    serving, silent = peers
    closed = [f"/ip4/127.0.0.1/tcp/{_closed_port()}"]
    started = time.monotonic()
    refused = ask_dialback(asking, [str(serving.peer_id), str(silent.peer_id)], closed)
    assert (refused.dialable, refused.address, refused.peer) == (False, "127.0.0.1", str(serving.peer_id))
    assert ask_dialback(asking, [str(silent.peer_id)], closed).dialable is None
    assert time.monotonic() - started < 2 * ANSWER_TIMEOUT  # the peers are asked at once, each bounded


def test_a_second_check_within_the_interval_gets_no_answer(peers: tuple[hivemind.DHT, hivemind.DHT],
                                                          asking: hivemind.DHT) -> None:
    serving, _ = peers
    own = [str(a) for a in asking.get_visible_maddrs()]
    assert ask_dialback(asking, [str(serving.peer_id)], own).dialable is True
    assert ask_dialback(asking, [str(serving.peer_id)], own).dialable is None  # "busy": not a port scanner
