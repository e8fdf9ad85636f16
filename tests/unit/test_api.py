"""The HTTP API on 127.0.0.1: every endpoint, auth, bad requests, and clients that misbehave."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import os
import socket
import stat
import time

import pytest
from monitoring_fixtures import populated_status, populated_swarm

from p2ptrain.client.http import NodeClient
from p2ptrain.daemon.api import ApiServer, host_header_is_loopback, is_loopback
from p2ptrain.daemon.auth import load_or_create_token, token_matches
from p2ptrain.daemon.control import Command, ControlQueue, ControlRequest
from p2ptrain.daemon.httpserver import Request
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.errors import ConfigError
from p2ptrain.metrics import build_registry
from p2ptrain.status import SCHEMA_VERSION, LatestSnapshot
from p2ptrain.waiting import wait_until

TOKEN = "t" * 43


class Node:
    """An API server with its inputs, as the node wires them."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **kwargs) -> None:
        self.now = time.time()
        self.latest = LatestSnapshot()
        self.latest.publish(populated_status(self.now), populated_swarm())
        self.logs = LogRing(capacity=50)
        self.control = ControlQueue(maxsize=2)
        self.server = ApiServer(host=host, port=port, latest=self.latest, logs=self.logs,
                                control=self.control, registry=build_registry(self.latest), token=TOKEN,
                                clock=lambda: self.now, **kwargs)
        self.server.start()

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request carrying exactly ``token`` (or none), whatever the client would send."""
        sent = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
        answer = NodeClient(self.server.url, None, timeout=5).request(method, path, body, headers=sent)
        return answer.status, answer.headers, answer.body

    def from_elsewhere(self, path: str, token: str | None = None) -> int:
        """The status a GET from another machine (192.0.2.7) gets."""
        headers = {"host": f"node.example:{self.server.port}",
                   **({"authorization": f"Bearer {token}"} if token else {})}
        request = Request("GET", path, path, "", "HTTP/1.1", headers, b"", "192.0.2.7")
        return asyncio.run(self.server._handle(request)).status

    def json(self, method: str, path: str, **kw) -> tuple[int, dict]:
        status, headers, body = self.request(method, path, **kw)
        assert headers["Content-Type"] == "application/json"
        return status, json.loads(body)


@pytest.fixture
def node():
    n = Node(request_timeout=1.0, max_connections=4)
    yield n
    n.server.stop()


def test_reads_status_peers_metrics(node):
    assert node.server.url == f"http://127.0.0.1:{node.server.port}" and node.server.port > 0
    status, body = node.json("GET", "/api/v1/status")
    assert status == 200 and body["peer_id"] == "QmSelf" and body["local_epoch"] == 7
    assert body["visible_maddrs"] == ["/ip4/127.0.0.1/tcp/41400"] and body["schema_version"] == SCHEMA_VERSION
    status, body = node.json("GET", "/api/v1/peers")
    assert status == 200 and body["peers_online"] == 2 and body["fastest_peer"] == "QmB"
    assert [p["peer_id"] for p in body["peers"]] == ["QmA", "QmB"]
    status, headers, text = node.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"p2ptrain_samples_processed_total 12345.0" in text and b"process_cpu_seconds_total" in text


def test_non_finite_numbers_become_null(node):
    node.latest.publish(dataclasses.replace(populated_status(node.now), loss=float("nan")))
    assert node.json("GET", "/api/v1/status")[1]["loss"] is None


def test_healthz_follows_snapshot_and_clock(node):
    status, body = node.json("GET", "/healthz")
    assert status == 200 and body["healthy"] and body["state"] == "training"
    node.now += 1000  # the node loop stopped publishing
    status, body = node.json("GET", "/healthz")
    assert status == 503 and "not refreshed" in body["reason"]
    paused = dataclasses.replace(populated_status(node.now), state="paused", pause_reason="manual")
    node.latest.publish(paused)
    assert node.json("GET", "/healthz") == (503, {"healthy": False, "reason": "state is paused (manual)",
                                                   "state": "paused"})


def test_livez_and_readyz_tell_a_stuck_loop_from_an_owner_s_pause(node):
    """A liveness probe restarts what is stuck, never a node paused by its schedule; readiness says why."""
    assert node.json("GET", "/livez")[0] == 200 and node.json("GET", "/readyz")[0] == 200
    for reason in ("schedule", "busy", "manual"):
        node.latest.publish(dataclasses.replace(populated_status(node.now), state="paused", pause_reason=reason))
        assert node.json("GET", "/livez")[0] == 200
        assert node.json("GET", "/readyz") == (200, {"healthy": True, "reason": f"paused on purpose ({reason})",
                                                      "state": "paused"})
        assert node.json("GET", "/healthz")[0] == 503  # the older combined check: not training
    node.latest.publish(dataclasses.replace(populated_status(node.now), state="syncing"))
    assert node.json("GET", "/livez")[0] == 200
    assert node.json("GET", "/readyz") == (503, {"healthy": False, "reason": "state is syncing", "state": "syncing"})
    node.now += 1000  # the node loop stopped publishing: not alive, so not ready either
    for path in ("/livez", "/readyz"):
        status, body = node.json("GET", path)
        assert status == 503 and "not refreshed" in body["reason"], path


def test_logs_paging_and_bad_queries(node):
    log = logging.getLogger("p2ptrain.test_api_logs")
    log.addHandler(node.logs)
    log.setLevel(logging.INFO)
    try:
        for i in range(5):
            log.info("line %d", i)
    finally:
        log.removeHandler(node.logs)
    status, body = node.json("GET", "/api/v1/logs")
    assert status == 200 and [x["message"] for x in body["lines"]] == [f"line {i}" for i in range(5)]
    assert body["last_seq"] == 5
    status, body = node.json("GET", "/api/v1/logs?since=3")
    assert [x["seq"] for x in body["lines"]] == [4, 5] and body["last_seq"] == 5
    assert node.json("GET", "/api/v1/logs?since=5")[1] == {"lines": [], "last_seq": 5}
    assert [x["seq"] for x in node.json("GET", "/api/v1/logs?since=0&limit=2")[1]["lines"]] == [4, 5]
    for bad in ("since=-1", "since=abc", "since=%C2%B2", "limit=0", "limit=99999", "foo=1", "since=1&&"):
        status, body = node.json("GET", f"/api/v1/logs?{bad}")
        assert status == 400 and body["error"], bad


def test_control_needs_token(node):
    for token in (None, "wrong", TOKEN[:-1]):
        status, headers, body = node.request("POST", "/api/v1/control/pause", token=token)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert "token" in json.loads(body)["error"]
    status, _, _ = node.request("POST", "/api/v1/control/pause", headers={"Authorization": f"Basic {TOKEN}"})
    assert status == 401
    assert node.control.drain() == []


def test_control_commands_are_queued(node):
    status, body = node.json("POST", "/api/v1/control/pause", body=b'{"duration_seconds": 7200}', token=TOKEN)
    assert status == 202 and body == {"accepted": True, "command": "pause", "duration_seconds": 7200.0}
    assert node.json("POST", "/api/v1/control/checkpoint", token=TOKEN)[0] == 202
    # The queue holds two: a third request is refused, not buffered.
    status, headers, _ = node.request("POST", "/api/v1/control/resume", token=TOKEN)
    assert status == 503 and headers["Retry-After"] == "1"
    assert node.control.drain() == [ControlRequest(Command.PAUSE, 7200.0, "api"),
                                    ControlRequest(Command.CHECKPOINT, None, "api")]
    assert node.json("POST", "/api/v1/control/leave", body=b"", token=TOKEN)[0] == 202
    assert node.control.drain() == [ControlRequest(Command.LEAVE, None, "api")]


@pytest.mark.parametrize("body", [b"{", b"[1]", b'{"duration_seconds": -5}', b'{"duration_seconds": "1h"}',
                                  b'{"duration_seconds": true}', b'{"duration_seconds": 1e99}', b'{"x": 1}',
                                  b"\xff\xfe"])
def test_bad_pause_bodies_are_400(node, body):
    status, answer = node.json("POST", "/api/v1/control/pause", body=body, token=TOKEN)
    assert status == 400 and answer["error"]
    assert node.control.drain() == []


def test_wrong_path_method_and_size(node):
    assert node.json("GET", "/nope")[0] == 404
    assert node.json("POST", "/api/v1/control/reboot", token=TOKEN)[0] == 404
    status, headers, _ = node.request("POST", "/api/v1/status", body=b"{}")
    assert status == 405 and headers["Allow"] == "GET"
    assert node.json("GET", "/api/v1/control/pause")[0] == 405
    assert node.json("DELETE", "/metrics")[0] == 405
    status, body = node.json("POST", "/api/v1/control/resume", body=b"x" * 10_000, token=TOKEN)
    assert status == 413 and "4096" in body["error"]
    assert node.json("GET", "/api/v1/status/")[0] == 200  # a trailing slash is the same endpoint


def raw(node: Node, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", node.server.port), timeout=5) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_requests_get_json_errors(node):
    answer = raw(node, b"GARBAGE\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 400") and b"Bad request syntax" in answer
    answer = raw(node, b"GET / HTTP/1.1 extra\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 400") and b'"error"' in answer
    answer = raw(node, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
    assert answer.split(b" ")[1].startswith(b"4")
    answer = raw(node, b"POST /api/v1/control/pause HTTP/1.1\r\nAuthorization: Bearer " + TOKEN.encode()
                 + b"\r\nContent-Length: nope\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 400")
    answer = raw(node, b"POST /api/v1/control/pause HTTP/1.1\r\nAuthorization: Bearer " + TOKEN.encode()
                 + b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 411")
    assert node.json("GET", "/healthz")[0] == 200  # still serving


def test_silent_and_non_reading_clients_do_not_block_others(node):
    idle = [socket.create_connection(("127.0.0.1", node.server.port)) for _ in range(2)]
    # This one asks for the biggest answer and never reads it.
    greedy = socket.create_connection(("127.0.0.1", node.server.port))
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    greedy.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    try:
        started = time.monotonic()
        assert node.json("GET", "/api/v1/status")[0] == 200
        assert time.monotonic() - started < 1.0
        # The server drops the silent ones after its 1 s request timeout.
        idle[0].settimeout(5)
        assert idle[0].recv(100) == b""
    finally:
        for sock in (*idle, greedy):
            sock.close()


def test_connection_cap_refuses_then_recovers(node):
    hogs = [socket.create_connection(("127.0.0.1", node.server.port)) for _ in range(4)]
    try:
        wait_until(lambda: node.server.open_connections >= 4, 10, "the four connections taken", interval=0.01)
        status, headers, body = node.request("GET", "/api/v1/status")
        assert status == 503 and b"too many connections" in body
    finally:
        for sock in hogs:
            sock.close()
    wait_until(lambda: node.request("GET", "/healthz")[0] == 200, 5, "/healthz answering again", interval=0.1)


def test_off_loopback_reads_from_elsewhere_need_token_but_metrics_and_healthz_do_not(node):
    node.server.loopback = False  # what binding to a non-loopback address sets
    for path in ("/api/v1/status", "/api/v1/peers", "/api/v1/logs"):
        assert node.from_elsewhere(path) == 401
        assert node.from_elsewhere(path, token="wrong") == 401
        assert node.from_elsewhere(path, token=TOKEN) == 200
        # From this machine, addressed to a loopback name: a local reader sends no token.
        assert node.request("GET", path)[0] == 200
        # Addressed to another name (a proxy on this machine, a web page rebinding a name): the token.
        assert node.request("GET", path, headers={"Host": "node.example"})[0] == 401
    for path in ("/metrics", "/healthz", "/livez", "/readyz"):
        assert node.from_elsewhere(path) == 200
    assert node.request("POST", "/api/v1/control/pause")[0] == 401  # control: always the token
    assert node.control.drain() == []


def test_without_token_control_is_refused():
    n = Node()
    n.server.token = ""
    try:
        assert n.json("POST", "/api/v1/control/pause", token="anything")[0] == 403
    finally:
        n.server.stop()


@pytest.mark.parametrize("path", ["/api/v1/control/anything/at/all/checkpoint", "/api/v1/control/x/pause",
                                  "/api/v1/control//checkpoint", "/api/v1/controlcheckpoint",
                                  "/api/v1/control/checkpoint/extra", "/api/v1/control/CHECKPOINT",
                                  "/prefix/api/v1/control/checkpoint", "/api/v1/control/checkpoint%2F"])
def test_control_commands_live_at_exactly_one_path(node, path):
    status, body = node.json("POST", path, token=TOKEN)
    assert status == 404 and body["error"].startswith("no such endpoint")
    assert node.control.drain() == []


def test_host_header_must_name_loopback_on_a_loopback_bind(node):
    for host in ("evil.example", "evil.example:41480", "10.0.0.1", "127.0.0.1.evil.example", "[::2]",
                 "localhost.evil.example", "0.0.0.0"):
        status, body = node.json("GET", "/api/v1/status", headers={"Host": host})
        assert status == 421 and "not a loopback name" in body["error"] and "DNS rebinding" in body["error"]
        assert "peer_id" not in body
        assert node.json("GET", "/metrics", headers={"Host": host})[0] == 421
        assert node.json("POST", "/api/v1/control/pause", token=TOKEN, headers={"Host": host})[0] == 421
    assert node.control.drain() == []
    for host in ("localhost", f"localhost:{node.server.port}", "127.0.0.1", "127.1.2.3:80", "[::1]",
                 f"[::1]:{node.server.port}", "LOCALHOST"):
        assert node.request("GET", "/api/v1/status", headers={"Host": host})[0] == 200, host


def test_host_header_absent_or_off_loopback(node):
    # HTTP/1.0 may name no host (browsers, the DNS-rebinding vehicle, always do); HTTP/1.1 must.
    assert raw(node, b"GET /healthz HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200")
    answer = raw(node, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 400") and b"without a Host header" in answer
    node.server.loopback = False  # bound beyond loopback: any name may reach it, the token guards reads
    assert node.request("GET", "/api/v1/status", token=TOKEN, headers={"Host": "node.example"})[0] == 200


@pytest.mark.parametrize(("value", "expected"), [
    ("localhost", True), ("localhost:1", True), ("127.0.0.1", True), ("127.255.0.9:65535", True),
    ("[::1]", True), ("[::1]:80", True), ("LocalHost.", True),
    ("evil.example", False), ("127.0.0.1:x", False), ("[::1", False), ("[::1]x", False), ("::1", False),
    ("[127.0.0.1]", False), ("", False), ("localhost:80:80", False), ("127.0.0.1.nip.io", False),
])
def test_host_header_is_loopback(value, expected):
    assert host_header_is_loopback(value) is expected


def test_head_gets_headers_only(node):
    answer = raw(node, b"HEAD /healthz HTTP/1.0\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"Content-Length: " in head and body == b""


def test_a_bad_bind_names_the_config_fields():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"^api.host/api.port: cannot listen on 127.0.0.1:{port}: "):
            Node(port=port)

@pytest.mark.parametrize("host", ["192.0.2.1",  # a documentation address no machine has
                                  "nonexistent.invalid"])  # .invalid never resolves (RFC 6761)
def test_a_host_this_machine_cannot_listen_on_is_a_config_error(host):
    # Restarting cannot fix it: exit 78 (EX_CONFIG), not 1, so systemd does not restart it forever.
    with pytest.raises(ConfigError, match=rf"^api.host: cannot listen on '{host}': not an address of this machine"):
        Node(host=host)


def test_which_bind_errors_are_the_config_s_fault():
    from p2ptrain.daemon.api import _bind_error

    in_use = _bind_error(OSError(errno.EADDRINUSE, "Address already in use (while attempting to bind on x)"),
                         "127.0.0.1", 41480)
    assert type(in_use) is OSError and str(in_use).endswith(":41480: Address already in use")  # may free up
    privileged = _bind_error(OSError(errno.EACCES, "Permission denied"), "127.0.0.1", 80)
    assert isinstance(privileged, ConfigError) and str(privileged).startswith("api.port: cannot listen on port 80")


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("127.5.0.1") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("node.example")


def test_token_file_created_0600_and_reused(tmp_path):
    state = tmp_path / "state"
    token = load_or_create_token(state)
    path = state / "api.token"
    assert len(token) >= 40 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(state) == token
    path.chmod(0o644)
    assert load_or_create_token(state) == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    fresh = load_or_create_token(state)
    assert fresh != token and len(fresh) >= 40 and path.read_text().strip() == fresh
    assert [p.name for p in state.iterdir()] == ["api.token"]  # no temp files left behind
    assert os.access(path, os.R_OK)


def test_token_matches():
    assert token_matches(TOKEN, f"Bearer {TOKEN}") and token_matches(TOKEN, f"bearer  {TOKEN} ")
    assert not token_matches(TOKEN, None) and not token_matches(TOKEN, TOKEN)
    assert not token_matches("", "Bearer ") and not token_matches(TOKEN, f"Bearer {TOKEN}x")
