"""The node's local HTTP API: /metrics, /healthz and /api/v1/..., what each request means and who may ask.

Handlers only read the latest snapshot, the log ring and the metric registry, and only enqueue
control requests, so nothing here can block or crash the training loop.  The connection handling
(deadlines, caps, size limits) is :mod:`p2ptrain.daemon.httpserver`'s; this module adds what keeps
readers from costing the loop more than a bounded share: rendered answers are cached for a moment
(``cache_seconds``, and never past a newer snapshot), and each client is paced
(:mod:`p2ptrain.daemon.ratelimit`, ``429`` with ``Retry-After`` when far over its rate).  On a
loopback bind only requests addressed to a loopback name are answered (no DNS rebinding from a
browser).  Every error is a JSON ``{"error": ...}`` with a 4xx/5xx status.

Who needs the token: control requests always; reads (status, peers, logs) only from another
machine, since a local reader sends none (:mod:`p2ptrain.client.http`): whatever program answers on
the node's port (one that took it while the node restarted) then never receives the token with a
read.  Reads hold nothing secret: the node's own status, the peers' signed records and its log lines.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest

from p2ptrain import health
from p2ptrain.daemon.auth import token_matches
from p2ptrain.daemon.control import Command, ControlQueue, ControlRequest
from p2ptrain.daemon.httpserver import HttpServer, Limits, Request, Response, error_response, json_response
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.daemon.ratelimit import ClientLimiter
from p2ptrain.errors import ConfigError
from p2ptrain.status import LatestSnapshot

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4096
MAX_LOG_LINES = 2000
#: Longest pause the API accepts (30 days); longer ones are almost certainly a unit mistake.
MAX_PAUSE_SECONDS = 30 * 24 * 3600.0
CONTROL_PREFIX = "/api/v1/control/"
CONTROL_COMMANDS = {c.value: c for c in (Command.PAUSE, Command.RESUME, Command.CHECKPOINT, Command.LEAVE)}
GET_PATHS = frozenset({"/metrics", "/healthz", "/livez", "/readyz", "/api/v1/status", "/api/v1/peers", "/api/v1/logs"})
#: Probes: never need the token (even off loopback) and have their own request budget.
PROBE_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
OPEN_PATHS = frozenset({"/metrics"}) | PROBE_PATHS  # never need the token, even off loopback
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
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume it is reachable from outside


def host_header_is_loopback(value: str) -> bool:
    """``Host: localhost``, ``127.0.0.1:41480``, ``[::1]:41480``... (a port is optional)."""
    if value.startswith("["):
        address, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return False
        return ":" in address and is_loopback(address)
    name, _, port = value.partition(":")
    return (not port or port.isdigit()) and is_loopback(name)


def route(path: str) -> tuple[str, str | None]:
    """(the method a path takes, its control command); ApiError 404 for anything else.  A control
    command is exactly ``/api/v1/control/<command>``: nothing in between."""
    if path in GET_PATHS:
        return "GET", None
    command = path.removeprefix(CONTROL_PREFIX)
    if path.startswith(CONTROL_PREFIX) and command in CONTROL_COMMANDS:
        return "POST", command
    raise ApiError(404, f"no such endpoint: {path[:200]}")


def _json_safe(value: Any) -> Any:
    """Replace NaN/inf (a diverged loss) by None: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class RenderCache:
    """Rendered answers, reused while they are younger than ``max_age`` and the snapshot behind them
    is still the newest one: any number of readers cost at most a few renders per second."""

    def __init__(self, max_age: float, clock: Callable[[], float]) -> None:
        self.max_age = max_age
        self.clock = clock
        self._entries: dict[str, tuple[object, float, Response]] = {}
        self.renders = 0

    def get(self, name: str, source: object, render: Callable[[], Response]) -> Response:
        now = self.clock()
        entry = self._entries.get(name)
        if entry is not None and entry[0] is source and now - entry[1] < self.max_age:
            return entry[2]
        response = render()
        self.renders += 1
        self._entries[name] = (source, now, response)
        return response


#: Bind errors that mean "this host is not one of this machine's addresses" (an unknown name,
#: a name without addresses, someone else's address).  EAI_AGAIN (DNS down) may pass: not here.
_NOT_HERE = frozenset({errno.EADDRNOTAVAIL, socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME),
                       getattr(socket, "EAI_ADDRFAMILY", socket.EAI_NONAME)})


def _bind_error(error: OSError, host: str, port: int) -> Exception:
    """A failed bind as the error that says what to do.  A host that does not resolve or is not
    an address of this machine, or a port this user may not take, is the config's fault and stays
    so however often systemd restarts the node: ConfigError (exit 78).  A port in use may free up:
    OSError (exit 1, restarted)."""
    # socket.create_server re-raises a failed lookup as a plain OSError carrying the EAI_* code.
    reason = (error.strerror or str(error)).split(" (while attempting to bind")[0]
    if isinstance(error, socket.gaierror) or error.errno in _NOT_HERE:
        return ConfigError(f"api.host: cannot listen on {host!r}: not an address of this machine ({reason}); "
                           "use 127.0.0.1 (or 0.0.0.0 for every interface)")
    if error.errno == errno.EACCES:
        return ConfigError(f"api.port: cannot listen on port {port}: {reason} (ports below 1024 need privileges)")
    return OSError(f"api.host/api.port: cannot listen on {host}:{port}: {reason}")


class ApiServer:
    """Owns the listening socket and its thread; the node calls :meth:`start` and :meth:`stop`."""

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
        max_connections: int = 256,
        max_client_connections: int = 64,
        max_snapshot_age: float = health.DEFAULT_MAX_SNAPSHOT_AGE,
        max_progress_age: float = health.DEFAULT_MAX_PROGRESS_AGE,
        client_rate: float = 20.0,
        client_burst: int = 40,
        health_rate: float = 50.0,
        health_burst: int = 100,
        max_queue_wait: float = 1.0,
        cache_seconds: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.latest = latest
        self.logs = logs
        self.control_queue = control
        self.registry = registry
        self.token = token or ""
        self.clock = clock
        self.max_snapshot_age = max_snapshot_age
        self.max_progress_age = max_progress_age
        self.loopback = is_loopback(host)
        self.cache = RenderCache(cache_seconds, monotonic)
        self.read_limit = ClientLimiter(client_rate, client_burst, max_queue_wait, clock=monotonic)
        self.health_limit = ClientLimiter(health_rate, health_burst, max_queue_wait, clock=monotonic)
        limits = Limits(request_timeout=request_timeout, max_body_bytes=MAX_BODY_BYTES,
                        max_connections=max_connections, max_client_connections=max_client_connections,
                        over_cap_timeout=min(1.0, request_timeout))
        try:
            # Binding happens here so a bad address or a taken port fails the node's start, naming the field.
            self._server = HttpServer(host, port, self._handle, limits, logger)
        except OSError as error:
            raise _bind_error(error, host, port) from None

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def open_connections(self) -> int:
        return self._server.open_connections

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
        self._server.start()
        logger.info("API listening on %s%s", self.url,
                    "" if self.loopback else " (reads from other machines need the token)")

    def stop(self) -> None:
        self._server.stop()

    # -- one request ------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        try:
            response = await self._answer(request)
        except ApiError as error:
            response = error_response(error.status, error.message, error.headers)
        except Exception:
            logger.exception("API handler failed for %s %s", request.method, request.target[:200])
            response = error_response(500, "internal error")
        logger.debug("API %s %s %s -> %d", request.client, request.method, request.target[:200], response.status)
        return response

    async def _answer(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        self._check_host(request)
        is_health = path in PROBE_PATHS
        if request.over_cap and not is_health:
            raise ApiError(503, f"too many open connections from {request.client}", {"Retry-After": "1"})
        limiter = self.health_limit if is_health else self.read_limit
        # Keyed like the connection cap: every loopback address is one client (any local program
        # can connect from any of 127.0.0.0/8), so local readers share 127.0.0.1's budget.
        admission = limiter.admit(request.group)
        if admission.wait > 0:
            await asyncio.sleep(admission.wait)
        if admission.refused:
            rate = 1.0 / limiter.interval
            raise ApiError(429, f"too many requests from {request.client} (at most {rate:g} per second)",
                           {"Retry-After": str(admission.retry_after)})
        allowed, command = route(path)
        if request.method != allowed and not (allowed == "GET" and request.method == "HEAD"):
            raise ApiError(405, f"{request.method} not allowed on {path}; use {allowed}", {"Allow": allowed})
        if allowed == "POST" or (path not in OPEN_PATHS and not self._local(request)):
            self._require_token(request)
        if command is not None:
            status, payload = self.control(command, request.body)
            return json_response(status, payload)
        return self.get(path, request.query)

    def _check_host(self, request: Request) -> None:
        if not self.loopback:
            return  # reachable from elsewhere by design: the token guards it
        host = request.headers.get("host")
        if host is None:
            if request.version == "HTTP/1.0":
                return  # an old-style client that names no host (browsers always send one)
            raise ApiError(400, "HTTP/1.1 request without a Host header")
        if not host_header_is_loopback(host):
            raise ApiError(421, f"Host {host[:100]!r} is not a loopback name; this API answers only requests "
                                "addressed to localhost, 127.0.0.1 or [::1] (protection against DNS rebinding)")

    def _local(self, request: Request) -> bool:
        """A request from this machine addressed to a loopback name (on a loopback bind every request
        that got this far is one)."""
        if self.loopback:
            return True
        return request.group == "loopback" and host_header_is_loopback(request.headers.get("host", "localhost"))

    def _require_token(self, request: Request) -> None:
        if not self.token:
            raise ApiError(403, "this endpoint needs a token and the node has none configured")
        if not token_matches(self.token, request.headers.get("authorization")):
            raise ApiError(401, "missing or wrong bearer token (see <state_dir>/api.token)",
                           {"WWW-Authenticate": 'Bearer realm="p2ptrain"'})

    # -- endpoint logic (no HTTP details below this line) -------------------------------------------

    def get(self, path: str, query: str) -> Response:
        if path in PROBE_PATHS:
            return self._probe(path)
        if path == "/metrics":
            # Keyed by the status snapshot: the node publishes its swarm view together with it.
            return self.cache.get("metrics", self.latest.status(), lambda: Response(
                200, generate_latest(self.registry), METRICS_CONTENT_TYPE))
        if path == "/api/v1/status":
            snapshot = self.latest.status()
            return self.cache.get("status", snapshot, lambda: json_response(200, _json_safe(snapshot.to_dict())))
        if path == "/api/v1/peers":
            view = self.latest.swarm()
            return self.cache.get("peers", view, lambda: json_response(200, _json_safe(view.to_dict())))
        return json_response(*self._logs(query))

    def _probe(self, path: str) -> Response:
        status = self.latest.status()
        limits = {"max_snapshot_age": self.max_snapshot_age}
        if path == "/livez":
            verdict = health.liveness(status, self.clock(), **limits)
        elif path == "/readyz":
            verdict = health.readiness(status, self.clock(), max_progress_age=self.max_progress_age, **limits)
        else:
            verdict = health.evaluate(status, self.clock(), max_progress_age=self.max_progress_age, **limits)
        return json_response(200 if verdict.healthy else 503, {**verdict.to_dict(), "state": status.state})

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
