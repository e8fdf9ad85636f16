"""NodeClient against the fake node over real HTTP: parsing, auth, and every failure mode."""

from __future__ import annotations

import json
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
from fakenode import PEER_IDS, SELF_ID, TOKEN, FakeNode

from p2ptrain.client.http import (
    NodeAuthError,
    NodeClient,
    NodeProtocolError,
    NodeUnreachable,
    UnsupportedSchema,
)
from p2ptrain.status import SCHEMA_VERSION


def test_status_peers_logs_parse(fake_node: FakeNode) -> None:
    client = NodeClient(fake_node.url, None)
    status = client.status()
    assert status.schema_version == SCHEMA_VERSION
    assert status.peer_id == SELF_ID and status.state == "training" and status.target_batch_size == 4096
    assert status.visible_maddrs[1] == "/ip4/127.0.0.1/tcp/31337"
    view = client.peers()
    assert [p.peer_id for p in view.peers] == list(PEER_IDS)
    assert view.peers[3].loss is None and view.peers[1].samples_per_second == pytest.approx(231.9)
    lines, last = client.logs(0)
    assert last == 6 and [line["seq"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert lines[2]["level"] == "WARNING"
    fake_node.add_log("INFO", "new line")
    lines, last = client.logs(6)
    assert last == 7 and [line["message"] for line in lines] == ["new line"]


def test_control_sends_bearer_token_and_body(fake_node: FakeNode) -> None:
    answer = NodeClient(fake_node.url, TOKEN).control("pause", duration_seconds=7200)
    assert answer == {"accepted": True, "command": "pause"}
    assert fake_node.controls == [("pause", f"Bearer {TOKEN}", {"duration_seconds": 7200})]


def test_wrong_token_is_an_auth_error_with_the_nodes_reason(fake_node: FakeNode) -> None:
    with pytest.raises(NodeAuthError, match="HTTP 401: missing or wrong bearer token"):
        NodeClient(fake_node.url, "nope").control("leave")
    assert fake_node.controls == [("leave", "Bearer nope", {})]


def test_no_token_fails_before_sending(fake_node: FakeNode) -> None:
    with pytest.raises(NodeAuthError, match="no control token"):
        NodeClient(fake_node.url, None).control("checkpoint")
    assert fake_node.controls == []


def test_unknown_command_is_a_value_error(fake_node: FakeNode) -> None:
    with pytest.raises(ValueError, match="unknown control command 'reboot'"):
        NodeClient(fake_node.url, TOKEN).control("reboot")


def test_unreachable_node(fake_node: FakeNode) -> None:
    url = fake_node.url
    fake_node.stop()
    with pytest.raises(NodeUnreachable, match=url.replace(".", r"\.")):
        NodeClient(url, None, timeout=1.0).status()


def test_silent_server_times_out_as_unreachable() -> None:
    with socket.socket() as listener:  # accepts (kernel backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(NodeUnreachable):
            NodeClient(url, None, timeout=0.3).status()


def test_garbage_is_a_protocol_error(fake_node: FakeNode) -> None:
    fake_node.mode = "garbage"
    client = NodeClient(fake_node.url, None)
    for call in (client.status, client.peers, lambda: client.logs(0)):
        with pytest.raises(NodeProtocolError, match="not JSON"):
            call()


def test_old_schema_is_reported(fake_node: FakeNode) -> None:
    fake_node.mode = "old"
    with pytest.raises(UnsupportedSchema, match="schema 0"):
        NodeClient(fake_node.url, None).status()


def _serve_json(payload: object) -> tuple[ThreadingHTTPServer, str]:
    body = json.dumps(payload).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("payload, error", [
    ([1, 2, 3], "expected a JSON object"),
    ({"schema_version": "1"}, "schema '1'"),
    ({"schema_version": 1, "visible_maddrs": 7}, "malformed snapshot"),
])
def test_malformed_status(payload: object, error: str) -> None:
    server, url = _serve_json(payload)
    try:
        with pytest.raises(NodeProtocolError, match=error):
            NodeClient(url, None).status()
    finally:
        server.shutdown()
        server.server_close()


def test_wrong_types_are_dropped_not_crashing() -> None:
    server, url = _serve_json({"schema_version": 1, "loss": "low", "val_loss": [1], "state": "training",
                               "visible_maddrs": ["/ip4/1.2.3.4/tcp/1", 5],
                               "recent_round_durations": [1.0, "x", None, 2],
                               "received_fraction_bucket_counts": [1, "2", 3.5, None, 4],
                               "median_received_fraction": "most", "cpu_used_percent": [50],
                               "peers": [{"peer_id": "A", "loss": {"x": 1}}, "junk"]})
    try:
        client = NodeClient(url, None)
        status = client.status()
        assert status.loss is None and status.val_loss is None
        assert status.visible_maddrs == ("/ip4/1.2.3.4/tcp/1",)
        assert status.recent_round_durations == (1.0, 2.0)
        assert status.received_fraction_bucket_counts == (1, 4)
        assert status.median_received_fraction is None and status.cpu_used_percent is None
        view = client.peers()
        assert [(p.peer_id, p.loss) for p in view.peers] == [("A", None)]
        with pytest.raises(NodeProtocolError, match="expected {'lines'"):
            client.logs(0)
    finally:
        server.shutdown()
        server.server_close()


def test_reads_of_a_local_node_carry_no_token(fake_node: FakeNode) -> None:
    client = NodeClient(fake_node.url, TOKEN)
    assert client.status().peer_id == SELF_ID
    client.peers()
    client.logs(0)
    assert fake_node.read_authorizations == [None, None, None]
    assert client.control("checkpoint")["accepted"] is True
    assert fake_node.controls[-1][:2] == ("checkpoint", f"Bearer {TOKEN}")
