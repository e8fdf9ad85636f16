"""The node's local HTTP API: /metrics, /healthz and /api/v1/... served from background threads.

Handlers only read the latest snapshot, the log ring and the metric registry, and only enqueue
control requests, so nothing here can block or crash the training loop.  Every socket has a
timeout, bodies are capped, concurrent connections are bounded, and every error becomes a JSON
``{"error": ...}`` with a 4xx/5xx status instead of an exception.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest

from p2ptrain import health
from p2ptrain.daemon.auth import token_matches
from p2ptrain.daemon.control import Command, ControlQueue, ControlRequest
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.status import LatestSnapshot

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4096
MAX_LOG_LINES = 2000
#: Longest pause the API accepts (30 days); longer ones are almost certainly a unit mistake.
MAX_PAUSE_SECONDS = 30 * 24 * 3600.0
CONTROL_COMMANDS = {c.value: c for c in (Command.PAUSE, Command.RESUME, Command.CHECKPOINT, Command.LEAVE)}
GET_PATHS = frozenset({"/metrics", "/healthz", "/api/v1/status", "/api/v1/peers", "/api/v1/logs"})
OPEN_PATHS = frozenset({"/metrics", "/healthz"})  # never need the token, even off loopback
#: What generate_latest() writes: the classic text format, which every Prometheus version parses.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ApiError(Exception):
    """An error answer: HTTP status, message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume it is reachable from outside


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for a client that never reads
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ApiServer, max_connections: int) -> None:
        self.api = api
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # Over the connection cap: refuse at once instead of queueing behind slow clients.
            try:
                request.settimeout(0.5)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\n\r\n{\"error\": \"too many connections\"}\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver would print a traceback to stderr; a misbehaving client is not news.
        logger.debug("API connection from %s ended with an error", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"
    # Answer even an unparsable request line with a status line and headers (not bare HTTP/0.9).
    default_request_version = "HTTP/1.0"
    server_version = "p2ptrain"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.api.request_timeout  # socket timeout for every read and write
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("API %s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Used by the stdlib for malformed request lines, oversized headers and unknown methods.
        self._send_json(code, {"error": message or http.HTTPStatus(code).phrase})

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def _dispatch(self, method: str) -> None:
        api = self.server.api
        try:
            parts = urlsplit(self.path)
            path = parts.path.rstrip("/") or "/"
            if path in GET_PATHS:
                allowed = "GET"
            elif path.startswith("/api/v1/control/") and path.rsplit("/", 1)[-1] in CONTROL_COMMANDS:
                allowed = "POST"
            else:
                raise ApiError(404, f"no such endpoint: {path}")
            if method != allowed:
                raise ApiError(405, f"{method} not allowed on {path}; use {allowed}", {"Allow": allowed})
            if allowed == "POST" or (path not in OPEN_PATHS and not api.loopback):
                self._require_token()
            if allowed == "POST":
                status, body = api.control(path.rsplit("/", 1)[-1], self._read_body())
            else:
                status, body = api.get(path, parts.query)
            if isinstance(body, bytes):
                self._send(status, body, METRICS_CONTENT_TYPE)
            else:
                self._send_json(status, body)
        except ApiError as exc:
            if exc.status == 413:
                self.close_connection = True  # the unread body must not be parsed as the next request
            self._send_json(exc.status, {"error": exc.message}, exc.headers)
        except OSError:
            self.close_connection = True  # the client went away or stopped reading; nothing to answer
        except Exception:
            logger.exception("API handler failed for %s %s", method, self.path)
            self._send_json(500, {"error": "internal error"})

    def _require_token(self) -> None:
        api = self.server.api
        if not api.token:
            raise ApiError(403, "this endpoint needs a token and the node has none configured")
        if not token_matches(api.token, self.headers.get("Authorization")):
            raise ApiError(401, "missing or wrong bearer token (see <state_dir>/api.token)",
                           {"WWW-Authenticate": 'Bearer realm="p2ptrain"'})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(411, "send the body with a Content-Length, not chunked")
        raw = self.headers.get("Content-Length", "0").strip() or "0"
        if not (raw.isascii() and raw.isdigit()):
            raise ApiError(400, f"bad Content-Length: {raw[:40]!r}")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length) if length else b""

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = (json.dumps(payload, allow_nan=False, default=str) + "\n").encode("utf-8")
        self._send(status, body, "application/json", headers)

    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            self.close_connection = True


def _json_safe(value: Any) -> Any:
    """Replace NaN/inf (a diverged loss) by None: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class ApiServer:
    """Owns the listening socket and its threads; the node calls :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        latest: LatestSnapshot,
        logs: LogRing,
        control: ControlQueue,
        registry: CollectorRegistry,
        token: str | None,
        clock: Callable[[], float] = time.time,
        request_timeout: float = 10.0,
        max_connections: int = 32,
        max_snapshot_age: float = health.DEFAULT_MAX_SNAPSHOT_AGE,
        max_progress_age: float = health.DEFAULT_MAX_PROGRESS_AGE,
    ) -> None:
        self.host = host
        self.latest = latest
        self.logs = logs
        self.control_queue = control
        self.registry = registry
        self.token = token or ""
        self.clock = clock
        self.request_timeout = request_timeout
        self.max_snapshot_age = max_snapshot_age
        self.max_progress_age = max_progress_age
        self.loopback = is_loopback(host)
        server_cls = _Server6 if ":" in host else _Server
        # Binding happens here so a taken port fails the node's start with a clear OSError.
        self._server = server_cls((host, port), self, max_connections)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Where a local client reaches the API (a wildcard bind is reached over loopback)."""
        host = self.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="p2ptrain-api", daemon=True)
        self._thread.start()
        logger.info("API listening on %s%s", self.url, "" if self.loopback else " (token required)")

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    # -- endpoint logic (no HTTP details below this line) --

    def get(self, path: str, query: str) -> tuple[int, Any]:
        if path == "/metrics":
            return 200, generate_latest(self.registry)
        if path == "/healthz":
            status = self.latest.status()
            verdict = health.evaluate(status, self.clock(), max_snapshot_age=self.max_snapshot_age,
                                      max_progress_age=self.max_progress_age)
            return (200 if verdict.healthy else 503), {**verdict.to_dict(), "state": status.state}
        if path == "/api/v1/status":
            return 200, _json_safe(self.latest.status().to_dict())
        if path == "/api/v1/peers":
            return 200, _json_safe(self.latest.swarm().to_dict())
        return self._logs(query)

    def _logs(self, query: str) -> tuple[int, Any]:
        try:
            params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=8)
        except ValueError as exc:
            raise ApiError(400, f"bad query string: {exc}") from None
        unknown = set(params) - {"since", "limit"}
        if unknown:
            raise ApiError(400, f"unknown query parameter(s): {', '.join(sorted(unknown))}")
        since = _int_param(params, "since", 0, 0, 2**62)
        limit = _int_param(params, "limit", 500, 1, MAX_LOG_LINES)
        lines = self.logs.since(since, limit=limit)
        # The last returned line, not the ring's newest: a line logged meanwhile must not be skipped.
        last_seq = lines[-1].seq if lines else min(since, self.logs.last_seq)
        return 200, {"lines": [line.to_dict() for line in lines], "last_seq": last_seq}

    def control(self, name: str, body: bytes) -> tuple[int, Any]:
        command = CONTROL_COMMANDS[name]
        payload = _parse_body(body)
        allowed = {"duration_seconds"} if command is Command.PAUSE else set()
        unknown = set(payload) - allowed
        if unknown:
            raise ApiError(400, f"unknown field(s) for {name}: {', '.join(sorted(unknown))}")
        duration = payload.get("duration_seconds")
        if duration is not None:
            if isinstance(duration, bool) or not isinstance(duration, int | float) \
                    or not math.isfinite(duration) or not 0 < duration <= MAX_PAUSE_SECONDS:
                raise ApiError(400, "duration_seconds must be a number of seconds in "
                                    f"(0, {MAX_PAUSE_SECONDS:.0f}]")
            duration = float(duration)
        if not self.control_queue.submit(ControlRequest(command, duration=duration, source="api")):
            raise ApiError(503, "control queue is full; try again shortly", {"Retry-After": "1"})
        logger.info("API: %s requested%s", name, f" for {duration:.0f} s" if duration else "")
        answer: dict[str, Any] = {"accepted": True, "command": name}
        if duration is not None:
            answer["duration_seconds"] = duration
        return 202, answer


def _parse_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "request body must be a JSON object")
    return payload


def _int_param(params: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = params.get(name)
    if not values:
        return default
    raw = values[-1]
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ApiError(400, f"{name} must be an integer in [{low}, {high}], got {raw[:40]!r}")
    return int(raw)
