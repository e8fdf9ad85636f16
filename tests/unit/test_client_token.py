"""Where the API client sends the node's token: with control requests, never with a local read.

A reader (``p2ptrain top``) polls through the node's restarts, when any local program may have taken
the node's port; whatever answers there must not be handed the token that controls the node.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from monitoring_fixtures import populated_status, populated_swarm

from p2ptrain.client.http import NodeAuthError, NodeClient
from p2ptrain.daemon.api import ApiServer
from p2ptrain.daemon.control import ControlQueue
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.metrics import build_registry
from p2ptrain.status import SCHEMA_VERSION, LatestSnapshot

TOKEN = "k" * 43


class _Impostor(BaseHTTPRequestHandler):
    """Whatever took the node's port: answers like a node and keeps every Authorization it is sent."""

    seen: list[tuple[str, str, str | None]] = []

    def _answer(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        self._answer(200, {"/api/v1/status": {"schema_version": SCHEMA_VERSION}, "/api/v1/peers": {"peers": []},
                           "/api/v1/logs": {"lines": [], "last_seq": 0}}.get(path, {}))

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        self._answer(202, {"accepted": True})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[tuple[str, list[tuple[str, str, str | None]]]]:
    seen: list[tuple[str, str, str | None]] = []
    handler = type("Handler", (_Impostor,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_reads_carry_no_token_only_control_does(impostor, host):
    address, seen = impostor
    client = NodeClient(f"http://{address}".replace("127.0.0.1", host), TOKEN, timeout=5)
    client.status()
    client.peers()
    client.logs(0)
    client.get_json("/metrics")
    assert [(method, auth) for method, _, auth in seen] == [("GET", None)] * 4, seen
    seen.clear()
    assert client.control("pause") == {"accepted": True}
    assert seen == [("POST", "/api/v1/control/pause", f"Bearer {TOKEN}")]


def test_the_token_goes_with_reads_only_to_a_node_on_another_machine():
    for url in ("http://127.0.0.1:41480", "http://localhost:41480", "http://[::1]:41480", "http://127.3.4.5"):
        client = NodeClient(url, TOKEN)
        assert client.local and not client.sends_token("GET") and not client.sends_token("HEAD"), url
        assert client.sends_token("POST"), url
    remote = NodeClient("http://192.0.2.7:41480", TOKEN)  # a node bound beyond loopback wants it there
    assert not remote.local and remote.sends_token("GET") and remote.sends_token("POST")
    assert not NodeClient("http://192.0.2.7:41480", None).sends_token("POST")


@pytest.fixture
def node() -> Iterator[ApiServer]:
    latest = LatestSnapshot()
    latest.publish(populated_status(0.0), populated_swarm())
    server = ApiServer(host="127.0.0.1", port=0, latest=latest, logs=LogRing(capacity=10),
                       control=ControlQueue(maxsize=4), registry=build_registry(latest), token=TOKEN)
    server.start()
    yield server
    server.stop()


def test_a_node_serves_reads_without_the_token_and_control_only_with_it(node):
    reader = NodeClient(node.url, None, timeout=5)
    assert reader.status().peer_id and reader.peers() is not None and reader.logs(0)[1] >= 0
    with pytest.raises(NodeAuthError, match="no control token"):
        reader.control("pause")
    assert reader.request("POST", "/api/v1/control/pause").status == 401
    with pytest.raises(NodeAuthError, match="HTTP 401"):
        NodeClient(node.url, "wrong" * 9, timeout=5).control("pause")
    assert node.control_queue.drain() == []
    assert NodeClient(node.url, TOKEN, timeout=5).control("pause")["accepted"] is True
    assert [request.command.value for request in node.control_queue.drain()] == ["pause"]
