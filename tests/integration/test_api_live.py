"""The HTTP API of a live node: every endpoint, auth on control, bad requests, stalled clients,
and what pause / resume / checkpoint / leave really do to a node in a swarm of two."""

from __future__ import annotations

import socket
import time

import pytest

from p2ptrain.client.http import NodeClient
from p2ptrain.waiting import wait_until
from tests.integration.conftest import TINY_TASK
from tests.support.nodeapi import node_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CONTROLS = ("pause", "resume", "checkpoint", "leave")


def _stalled_clients(url: str, count: int = 4) -> list[socket.socket]:
    """Clients that connect and never finish their request (or never send one), and never read."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    clients = []
    for i in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        if i % 2:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")  # no end of headers
        clients.append(sock)
    return clients


def test_api_of_a_live_node(make_node):
    a = make_node("a", task=TINY_TASK, checkpoint={"interval": 3600.0})
    a.start()
    b = make_node("b", task=TINY_TASK)
    b.start(join=a.join_addrs()[:1])
    a.wait_for(lambda s: s.state == "training" and s.samples_processed_total > 0, 90, "training steps")
    b.wait_for(lambda s: s.state == "training", 90, "B training")
    a_id = a.status().peer_id
    wait_until(lambda: _record_of(b, a_id, "training"), 60, "A's record in B's swarm view")
    url, token = a.api_url(), node_token(a)
    assert url is not None and len(token) >= 16
    api, admin = NodeClient(url, None, timeout=10), NodeClient(url, token, timeout=10)

    # -- every read endpoint
    status = api.request("GET", "/api/v1/status")
    assert status.status == 200 and status.headers["Content-Type"] == "application/json"
    body = status.json()
    assert body["state"] == "training" and body["peer_id"] and body["schema_version"] >= 1
    assert body["run_id"] == a.run_id and body["model_fingerprint"]
    peers = api.request("GET", "/api/v1/peers")
    assert peers.status == 200 and isinstance(peers.json()["peers"], list)
    logs = api.request("GET", "/api/v1/logs?since=0").json()
    assert any("API listening on" in line["message"] for line in logs["lines"]), logs
    newer = api.request("GET", f"/api/v1/logs?since={logs['last_seq']}&limit=5")
    assert newer.status == 200 and len(newer.json()["lines"]) <= 5
    metrics = api.request("GET", "/metrics")
    assert metrics.status == 200 and metrics.headers["Content-Type"].startswith("text/plain")
    assert b'p2ptrain_node_state{p2ptrain_node_state="training"} 1.0' in metrics.body
    health = api.request("GET", "/healthz")
    assert health.status == 200 and health.json()["healthy"] is True

    # -- bad requests: JSON errors, never a crash
    for method, path, expected in (("GET", "/nope", 404), ("POST", "/api/v1/status", 405),
                                   ("GET", "/api/v1/control/pause", 405), ("GET", "/api/v1/logs?since=x", 400),
                                   ("GET", "/api/v1/logs?bogus=1", 400), ("DELETE", "/metrics", 405)):
        answer = api.request(method, path)
        assert answer.status == expected, (method, path, answer)
        assert "error" in answer.json()
    bad_json = admin.request("POST", "/api/v1/control/pause", b"{not json")
    assert bad_json.status == 400
    bad_duration = admin.request("POST", "/api/v1/control/pause", b'{"duration_seconds": -1}')
    assert bad_duration.status == 400

    # -- control needs the token: nothing happens without it
    for command in CONTROLS:
        for given in (None, "wrong-token-" + "x" * 20):
            answer = NodeClient(url, given).request("POST", f"/api/v1/control/{command}")
            assert answer.status == 401, (command, given, answer)
            assert answer.headers.get("WWW-Authenticate", "").startswith("Bearer")
    time.sleep(1.0)
    assert a.running and a.status().state == "training"

    # -- stalled clients do not block anyone else
    stalled = _stalled_clients(url)
    try:
        started = time.monotonic()
        for _ in range(5):
            assert api.request("GET", "/healthz", timeout=5).status == 200
        assert time.monotonic() - started < 5, "healthz slowed down by clients that never read"

        # -- pause: stops contributing, keeps serving and stays in the swarm
        answer = admin.request("POST", "/api/v1/control/pause")
        assert answer.status == 202 and answer.json() == {"accepted": True, "command": "pause"}
        paused = a.wait_for(lambda s: s.state == "paused", 20, "PAUSED state")
        assert paused.pause_reason == "manual"
        health = api.request("GET", "/healthz")
        assert health.status == 503 and "paused (manual)" in health.json()["reason"]
        assert b'p2ptrain_pause_reason{p2ptrain_pause_reason="manual"} 1.0' in api.request("GET", "/metrics").body
        frozen = a.status().samples_processed_total
        # A stays in the swarm: its signed record, read back from the DHT, now says paused, and B
        # still lists A.  (B's view catches up only between B's steps, which may take a while.)
        mine = wait_until(lambda: _record_of(a, a_id, "paused"), 30, "A's paused record in the DHT")
        assert mine.pause_reason == "manual"
        wait_until(lambda: _record_of(b, a_id, None), 30, "B listing the paused A")
        assert a.status().samples_processed_total == frozen, "a paused node kept training"
        # ... and B is not left waiting for A in its averaging rounds: it keeps making epochs
        # (without the step-aside each of B's rounds would stall for averaging_timeout).
        b_epoch = b.status().local_epoch
        b.wait_for(lambda s: s.local_epoch >= b_epoch + 5, 40, "five epochs of B while A is paused")
    finally:
        for sock in stalled:
            sock.close()

    # -- resume
    assert admin.request("POST", "/api/v1/control/resume").status == 202
    a.wait_for(lambda s: s.state == "training" and s.samples_processed_total > frozen, 30, "training after resume")

    # -- checkpoint now
    before = a.status().checkpoint_writes_ok_total
    assert admin.request("POST", "/api/v1/control/checkpoint").status == 202
    written = a.wait_for(lambda s: s.checkpoint_writes_ok_total == before + 1, 30, "one more checkpoint")
    assert written.last_checkpoint_time is not None
    assert list((a.state_dir / "checkpoints").glob("*.pt"))

    # -- leave: a clean exit
    assert admin.request("POST", "/api/v1/control/leave").status == 202
    assert a.wait(60) == 0, a.report()
    assert "leave requested by api" in a.log_path.read_text()
    assert b.running, "B went down with A"


def _record_of(node, peer_id: str, state: str | None):
    """``peer_id``'s record in ``node``'s swarm view (in ``state``, unless None)."""
    view = node.peers()
    if view is None:
        return None
    return next((p for p in view.peers if p.peer_id == peer_id and state in (None, p.state)), None)
