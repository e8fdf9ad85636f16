"""The one HTTP client for a node's local API, used by ``p2ptrain top``, ``p2ptrain pause/resume/leave``,
:class:`~p2ptrain.local.swarm.LocalNode` and the tests.

Standard library only (``http.client``), with short timeouts, so the monitor and the control
commands start fast and never hang on a dead node.  It talks to the node directly: no proxy from
the environment, no redirects.  :meth:`NodeClient.request` is one raw exchange (any status is
returned); the typed methods on top turn every failure into a :class:`NodeError` subclass with a
message fit to show a human, and nothing the node sends can raise anything else.

The API token goes only where it is needed: with control requests, and with reads only to a node
on another machine (which wants it there).  A local reader polls all the time, through restarts of
the node, when any local program may have taken the node's port; it must hand that program nothing.
"""

from __future__ import annotations

import dataclasses
import http.client
import ipaddress
import json
import math
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from p2ptrain.status import SCHEMA_VERSION, PeerRecord, StatusSnapshot, SwarmView

#: Oldest snapshot schema this client understands; older nodes are reported, not guessed at.
MIN_SCHEMA_VERSION = 1
CONTROL_COMMANDS = ("pause", "resume", "checkpoint", "leave")
#: A node's answer is at most a few hundred kB (/metrics); anything far larger is not a node.
MAX_ANSWER_BYTES = 8 * 1024 * 1024


class NodeError(Exception):
    """Base of every error the client raises."""


class NodeUnreachable(NodeError):
    """Nothing answered at the URL (refused, timed out, DNS, reset)."""


class NodeProtocolError(NodeError):
    """Something answered, but not with what a p2ptrain node sends."""


class UnsupportedSchema(NodeProtocolError):
    """The node speaks an older snapshot schema than this client can read."""

    def __init__(self, found: object) -> None:
        super().__init__(f"node speaks status schema {found!r}; this p2ptrain needs "
                         f"{MIN_SCHEMA_VERSION}..{SCHEMA_VERSION} (upgrade the node)")
        self.found = found


class NodeAuthError(NodeError):
    """The node refused the control token (HTTP 401/403) or there is no token to send."""


class NodeRequestError(NodeError):
    """The node answered a request with an HTTP error other than an auth failure."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Answer:
    """One raw HTTP answer: status, headers (as sent), body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error_detail(self) -> str:
        """``": <message>"`` from the node's ``{"error": ...}`` body, or "" when there is none."""
        try:
            data = self.json()
        except (ValueError, UnicodeDecodeError):
            return ""
        message = data.get("error") if isinstance(data, dict) else None
        return f": {message}" if isinstance(message, str) and message else ""


_D = TypeVar("_D")


def _finite_or_none(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _sanitize(obj: _D) -> _D:
    """``from_dict`` accepts anything for fields that default to None; in the contract those are
    all optional numbers, so drop what is not one (a string loss must not crash a formatter)."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if f.default is None and value is not None:
            changes[f.name] = _finite_or_none(value)
    if isinstance(obj, StatusSnapshot):
        changes["visible_maddrs"] = tuple(a for a in obj.visible_maddrs if isinstance(a, str))
        changes["recent_round_durations"] = tuple(
            float(d) for d in obj.recent_round_durations if _finite_or_none(d) is not None)
        for name in ("round_duration_bucket_counts", "received_fraction_bucket_counts", "data_past_pass_shards"):
            changes[name] = tuple(c for c in getattr(obj, name) if isinstance(c, int))
        for epochs, values in (("loss_history_epochs", "loss_history"),
                               ("val_loss_history_epochs", "val_loss_history")):
            points = [(e, float(v)) for e, v in zip(getattr(obj, epochs), getattr(obj, values), strict=False)
                      if isinstance(e, int) and not isinstance(e, bool) and _finite_or_none(v) is not None
                      and math.isfinite(v)]
            changes[epochs], changes[values] = tuple(e for e, _ in points), tuple(v for _, v in points)
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


def is_local_host(host: str | None) -> bool:
    """``localhost`` or a loopback address: a node on this machine."""
    if host is None:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NodeClient:
    """One node's API.  Thread-safe: it holds no connection between calls.  The token, when given,
    goes with control commands (which fail early without one), and with reads only to a node on
    another machine: a node reads to a local client without it."""

    def __init__(self, url: str, token: str | None, timeout: float = 3.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.local = is_local_host(urlsplit(self.url).hostname)

    def sends_token(self, method: str) -> bool:
        """Whether a ``method`` request carries the token: control always, reads only off this machine."""
        return bool(self.token) and (method not in ("GET", "HEAD") or not self.local)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NodeUnreachable(f"{self.url}: not an http:// URL")
        try:
            port = parts.port
        except ValueError:
            raise NodeUnreachable(f"{self.url}: bad port") from None
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.hostname, port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None, *,
                headers: dict[str, str] | None = None, timeout: float | None = None) -> Answer:
        """One HTTP exchange with the node.  Every status comes back as an :class:`Answer`;
        only a node that does not answer (or answers too much) raises."""
        sent = {"Accept": "application/json", "Connection": "close"}
        if self.sends_token(method):
            sent["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        connection = self._connection(self.timeout if timeout is None else timeout)
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            raw = response.read(MAX_ANSWER_BYTES + 1)
            answer = Answer(response.status, dict(response.getheaders()), raw)
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise NodeUnreachable(f"{self.url}: {error or error.__class__.__name__}") from None
        finally:
            connection.close()
        if len(raw) > MAX_ANSWER_BYTES:
            raise NodeProtocolError(f"{path}: answer larger than {MAX_ANSWER_BYTES} bytes")
        return answer

    def get_json(self, path: str) -> Any:
        """GET ``path`` and return the parsed JSON answer (NodeError subclasses for everything else)."""
        return self._json("GET", path)

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        answer = self.request(method, path, data)
        if answer.status in (401, 403):
            raise NodeAuthError(f"node refused the token (HTTP {answer.status}{answer.error_detail()})")
        if answer.status >= 400:
            raise NodeRequestError(f"{path}: HTTP {answer.status}{answer.error_detail()}", answer.status)
        try:
            return answer.json()
        except (ValueError, UnicodeDecodeError):
            raise NodeProtocolError(f"{path}: answer is not JSON (is {self.url} a p2ptrain node?)") from None

    def _object(self, path: str) -> dict[str, Any]:
        data = self.get_json(path)
        if not isinstance(data, dict):
            raise NodeProtocolError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return data

    def status(self) -> StatusSnapshot:
        data = self._object("/api/v1/status")
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < MIN_SCHEMA_VERSION:
            raise UnsupportedSchema(version)
        try:
            return _sanitize(StatusSnapshot.from_dict(data))
        except (TypeError, ValueError) as error:
            raise NodeProtocolError(f"/api/v1/status: malformed snapshot ({error})") from None

    def peers(self) -> SwarmView:
        data = self._object("/api/v1/peers")
        if not isinstance(data.get("peers", []), list):
            raise NodeProtocolError("/api/v1/peers: 'peers' is not a list")
        try:
            view = SwarmView.from_dict(data)
        except (TypeError, ValueError) as error:
            raise NodeProtocolError(f"/api/v1/peers: malformed swarm view ({error})") from None
        peers: tuple[PeerRecord, ...] = tuple(_sanitize(p) for p in view.peers)
        return dataclasses.replace(_sanitize(view), peers=peers)

    def logs(self, since: int) -> tuple[list[dict[str, Any]], int]:
        """Lines with ``seq > since`` (each with str level/logger/message, float time, int seq) and
        the node's last sequence number."""
        data = self._object(f"/api/v1/logs?since={int(since)}")
        raw_lines, last_seq = data.get("lines"), data.get("last_seq")
        if not isinstance(raw_lines, list) or not isinstance(last_seq, int):
            raise NodeProtocolError("/api/v1/logs: expected {'lines': [...], 'last_seq': N}")
        lines = []
        for raw in raw_lines:
            if not isinstance(raw, dict) or not isinstance(raw.get("seq"), int):
                continue
            when = _finite_or_none(raw.get("time"))
            lines.append({
                "seq": raw["seq"],
                "time": when if when is not None else 0.0,
                "level": str(raw.get("level", "")),
                "logger": str(raw.get("logger", "")),
                "message": str(raw.get("message", "")),
            })
        return lines, last_seq

    def control(self, command: str, duration_seconds: float | None = None) -> dict[str, Any]:
        """POST a control command with the bearer token; the node's JSON answer (``{"accepted": ...}``)."""
        if command not in CONTROL_COMMANDS:
            raise ValueError(f"unknown control command {command!r}; expected one of {CONTROL_COMMANDS}")
        body: dict[str, Any] = {}
        if duration_seconds is not None:
            body["duration_seconds"] = duration_seconds
        if not self.token:
            raise NodeAuthError("no control token (is the token file readable?)")
        answer = self._json("POST", f"/api/v1/control/{command}", body)
        if not isinstance(answer, dict):
            raise NodeProtocolError(f"/api/v1/control/{command}: expected a JSON object")
        return answer
