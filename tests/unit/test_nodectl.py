"""`p2ptrain pause/resume/leave` against a loopback HTTP server standing in for the node's API."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.cli.main import main
from p2ptrain.daemon import nodectl
from p2ptrain.errors import EX_FAILURE, EX_NOINPUT, EX_NOPERM, EX_UNAVAILABLE

TOKEN = "s3cret-token"


class FakeNode:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.answer: dict[str, Any] = {"accepted": True}
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                node.requests.append((self.path, self.headers.get("Authorization", ""), body))
                status = 200 if self.headers.get("Authorization") == f"Bearer {TOKEN}" else 401
                payload = json.dumps(node.answer if status == 200 else {"error": "bad token"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture()
def node() -> Iterator[FakeNode]:
    fake = FakeNode()
    thread = threading.Thread(target=fake.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        thread.join(timeout=5)


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "api.token"
    path.write_text(TOKEN + "\n")
    return path


def test_pause_for_duration(node: FakeNode, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pause", "--for", "2h", "--url", node.url, "--token-file", str(token_file)]) == 0
    assert node.requests == [("/api/v1/control/pause", f"Bearer {TOKEN}", {"duration_seconds": 7200.0})]
    assert capsys.readouterr().out == "paused for 2h\n"


def test_resume_and_leave(node: FakeNode, token_file: Path) -> None:
    assert main(["resume", "--url", node.url, "--token-file", str(token_file)]) == 0
    assert main(["leave", "--url", node.url, "--token-file", str(token_file)]) == 0
    assert [(path, body) for path, _, body in node.requests] == [
        ("/api/v1/control/resume", {}), ("/api/v1/control/leave", {})]


def test_url_and_token_found_through_the_config(node: FakeNode, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "api.url").write_text(node.url + "\n")
    (state / "api.token").write_text(TOKEN)
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{state}"\n')
    assert main(["pause", "--config", str(config)]) == 0
    assert node.requests[0][0] == "/api/v1/control/pause"


def test_refused_command_exits_1(node: FakeNode, token_file: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    node.answer = {"accepted": False, "error": "node is stopping"}
    assert main(["pause", "--url", node.url, "--token-file", str(token_file)]) == EX_FAILURE
    assert capsys.readouterr().err == "p2ptrain: the node did not accept 'pause': node is stopping\n"


def test_wrong_token(node: FakeNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    assert main(["resume", "--url", node.url, "--token-file", str(wrong)]) == EX_NOPERM
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused the token" in err


def test_unreadable_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.token"
    assert main(["leave", "--url", "http://127.0.0.1:9", "--token-file", str(missing)]) == EX_NOPERM
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err


def test_unreachable_node(token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Port 9 (discard) on loopback: nothing listens there in a test environment.
    code = main(["pause", "--url", "http://127.0.0.1:9", "--token-file", str(token_file)])
    assert code == EX_UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("p2ptrain: no node answers at http://127.0.0.1:9") and err.count("\n") == 1


def test_unreadable_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pause", "--config", str(tmp_path / "none.toml")]) == EX_NOINPUT
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize(("seconds", "text"), [(7200, "2h"), (5400, "1h30m"), (90, "1m30s"), (86400, "1d")])
def test_format_duration(seconds: float, text: str) -> None:
    assert nodectl.format_duration(seconds) == text


class CheckpointingNode(FakeNode):
    """Answers status reads too; the checkpoint request makes the next status count a write (or a failure)."""

    def __init__(self, fails: bool = False, writes: bool = True) -> None:
        super().__init__()
        from p2ptrain.status import StatusSnapshot

        self.status = StatusSnapshot(local_epoch=7, checkpoint_writes_ok_total=2, checkpoint_writes_failed_total=0)
        node = self
        handler = self.server.RequestHandlerClass
        post = handler.do_POST  # type: ignore[attr-defined]

        def do_get(request: BaseHTTPRequestHandler) -> None:
            payload = json.dumps(node.status.to_dict()).encode()
            request.send_response(200)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(payload)))
            request.end_headers()
            request.wfile.write(payload)

        def do_post(request: BaseHTTPRequestHandler) -> None:
            post(request)
            if request.path.endswith("/checkpoint") and writes:
                if fails:
                    node.status = dataclasses.replace(node.status, checkpoint_writes_failed_total=1,
                                                      last_checkpoint_error="disk full")
                else:
                    node.status = dataclasses.replace(node.status, checkpoint_writes_ok_total=3, local_epoch=8,
                                                      last_checkpoint_path="/var/lib/p2ptrain/ckpt/ckpt-8.pt",
                                                      last_checkpoint_epoch=8)

        handler.do_GET = do_get  # type: ignore[attr-defined]
        handler.do_POST = do_post  # type: ignore[attr-defined]


def _serve(fake: FakeNode) -> threading.Thread:
    thread = threading.Thread(target=fake.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("fails", "writes", "code", "out", "err"), [
    (False, True, 0, "checkpoint written: /var/lib/p2ptrain/ckpt/ckpt-8.pt (epoch 8)\n", ""),
    (True, True, EX_FAILURE, "", "p2ptrain: the node could not write the checkpoint: disk full"),
    (False, False, EX_FAILURE, "", "wrote no checkpoint within 1s"),
])
def test_checkpoint_says_where_and_which_epoch(token_file: Path, capsys: pytest.CaptureFixture[str], fails: bool,
                                               writes: bool, code: int, out: str, err: str) -> None:
    from p2ptrain.cli.main import build_parser

    fake = CheckpointingNode(fails=fails, writes=writes)
    thread = _serve(fake)
    now = [0.0]
    try:
        args = build_parser().parse_args(["checkpoint", "--url", fake.url, "--token-file", str(token_file),
                                          "--timeout", "1s"])
        assert nodectl.checkpoint(args, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) == code
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        thread.join(timeout=5)
    captured = capsys.readouterr()
    assert captured.out == out and err in captured.err and captured.err.count("\n") == (1 if err else 0)
    assert [path for path, _, _ in fake.requests] == ["/api/v1/control/checkpoint"]


def test_checkpoint_without_a_node_is_exit_69(token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "--url", "http://127.0.0.1:9", "--token-file", str(token_file)]) == EX_UNAVAILABLE
    assert capsys.readouterr().err.startswith("p2ptrain: no node answers at http://127.0.0.1:9")
