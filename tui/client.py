"""The TUI's only network code: a small, strict HTTP client for one node's local ``/api/v1`` API.

Standard library only (``urllib``) with short timeouts, so ``p2ptrain top`` and the control
commands start fast and never hang on a dead node.  Every failure becomes a :class:`NodeError`
subclass with a message fit to show a human; nothing the node sends can raise anything else.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from typing import Any, TypeVar

from p2ptrain.status import SCHEMA_VERSION, PeerRecord, StatusSnapshot, SwarmView

#: Oldest snapshot schema this client understands; older nodes are reported, not guessed at.
MIN_SCHEMA_VERSION = 1
CONTROL_COMMANDS = ("pause", "resume", "checkpoint", "leave")
#: A node's answer is a few kB; anything far larger is not a node.
_MAX_BODY = 8 * 1024 * 1024


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
        for name in ("round_duration_bucket_counts", "received_fraction_bucket_counts"):
            changes[name] = tuple(c for c in getattr(obj, name) if isinstance(c, int))
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


class NodeClient:
    """One node's API.  Thread-safe: it holds no connection between calls.  The token, when given,
    goes with every request; control commands fail early without one."""

    def __init__(self, url: str, token: str | None, timeout: float = 3.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, path: str, body: dict[str, Any] | None = None, auth: bool = False) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None or auth:
            data = json.dumps(body or {}).encode()
            headers["Content-Type"] = "application/json"
        if auth and not self.token:
            raise NodeAuthError("no control token (is the token file readable?)")
        if self.token:  # a node bound beyond loopback wants it on reads too
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers,
                                         method="POST" if data is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read(_MAX_BODY + 1)
        except urllib.error.HTTPError as error:
            detail = _error_detail(error)
            if error.code in (401, 403):
                raise NodeAuthError(f"node refused the token (HTTP {error.code}{detail})") from None
            raise NodeRequestError(f"{path}: HTTP {error.code}{detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise NodeUnreachable(f"{self.url}: {reason}") from None
        if len(raw) > _MAX_BODY:
            raise NodeProtocolError(f"{path}: answer larger than {_MAX_BODY} bytes")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise NodeProtocolError(f"{path}: answer is not JSON (is {self.url} a p2ptrain node?)") from None

    def _object(self, path: str) -> dict[str, Any]:
        data = self._request(path)
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
        return dataclasses.replace(view, peers=peers)

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
            when = raw.get("time")
            lines.append({
                "seq": raw["seq"],
                "time": float(when) if _finite_or_none(when) is not None else 0.0,
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
        answer = self._request(f"/api/v1/control/{command}", body=body, auth=True)
        if not isinstance(answer, dict):
            raise NodeProtocolError(f"/api/v1/control/{command}: expected a JSON object")
        return answer


def _error_detail(error: urllib.error.HTTPError) -> str:
    """The node's ``{"error": ...}`` text, if it sent one."""
    try:
        data = json.loads(error.read(64 * 1024) or b"{}")
    except (ValueError, OSError):
        return ""
    message = data.get("error") if isinstance(data, dict) else None
    return f": {message}" if isinstance(message, str) and message else ""
