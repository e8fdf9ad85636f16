"""``p2ptrain pause [--for 2h]``, ``resume``, ``leave``: control the local node over its API.

Finds the node the same way ``p2ptrain top`` does (flags, then the config's state directory),
sends one authenticated control request and prints one line.  Every failure is one line on
stderr with a distinct exit code, so scripts (cron, a screensaver hook) can tell them apart.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from p2ptrain.client.discovery import DiscoveryError, TokenUnavailable, discover_node, read_token
from p2ptrain.client.http import NodeAuthError, NodeClient, NodeError, NodeUnreachable
from p2ptrain.errors import EX_FAILURE, EX_NOINPUT, EX_NOPERM, EX_OK, EX_UNAVAILABLE


def _fail(message: str, code: int) -> int:
    print(f"p2ptrain: {message}", file=sys.stderr)
    return code


def format_duration(seconds: float) -> str:
    """``7200`` -> ``2h``, ``5400`` -> ``1h30m``, ``90`` -> ``1m30s``."""
    seconds = int(round(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def send(args: argparse.Namespace, command: str, duration: float | None = None) -> tuple[int, dict[str, Any]]:
    """Discover the node, send ``command``; (exit code, the node's answer or {})."""
    try:
        url, token_path = discover_node(getattr(args, "url", None), getattr(args, "token_file", None),
                                        getattr(args, "config", None))
    except DiscoveryError as error:
        return _fail(f"cannot read config: {error}", EX_NOINPUT), {}
    try:
        token = read_token(token_path)
    except TokenUnavailable as error:
        return _fail(str(error), EX_NOPERM), {}
    client = NodeClient(url, token, timeout=float(getattr(args, "timeout", 5.0)))
    try:
        answer = client.control(command, duration_seconds=duration)
    except NodeUnreachable as error:
        return _fail(f"no node answers at {url} ({error}); is it running? (systemctl status p2ptrain)",
                     EX_UNAVAILABLE), {}
    except NodeAuthError as error:
        return _fail(f"{url}: {error}", EX_NOPERM), {}
    except NodeError as error:
        return _fail(f"{url}: {error}", EX_FAILURE), {}  # answered, did not accept
    if answer.get("accepted") is False:
        reason = answer.get("error") or answer.get("reason") or "no reason given"
        return _fail(f"the node did not accept {command!r}: {reason}", EX_FAILURE), answer
    return EX_OK, answer


def pause(args: argparse.Namespace) -> int:
    duration: float | None = getattr(args, "duration", None)
    code, _ = send(args, "pause", duration)
    if code == 0:
        print(f"paused for {format_duration(duration)}" if duration else "paused until `p2ptrain resume`")
    return code


def resume(args: argparse.Namespace) -> int:
    code, _ = send(args, "resume")
    if code == 0:
        print("resumed (time windows and busy-machine rules still apply)")
    return code


def leave(args: argparse.Namespace) -> int:
    code, _ = send(args, "leave")
    if code == 0:
        print("leaving: the node hands off, writes a final checkpoint and exits "
              "(under systemd it stays stopped until started again)")
    return code
