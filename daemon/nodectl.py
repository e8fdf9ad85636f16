"""``p2ptrain pause [--for 2h]``, ``resume``, ``checkpoint``, ``leave``: control the local node over its API.

Finds the node the same way ``p2ptrain top`` does (flags, then the config's state directory),
sends one authenticated control request and prints one line (``checkpoint`` then watches the node's
status until the checkpoint is written, and says where and at which epoch).  Every failure is one line on
stderr with a distinct exit code, so scripts (cron, a screensaver hook) can tell them apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
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


def _connect(args: argparse.Namespace) -> tuple[int, NodeClient | None, str]:
    """The client of the node the flags (or the config's state directory) name: (0, client, url), or
    (exit code, None, url) after one line on stderr."""
    try:
        url, token_path = discover_node(getattr(args, "url", None), getattr(args, "token_file", None),
                                        getattr(args, "config", None))
    except DiscoveryError as error:
        return _fail(f"cannot read config: {error}", EX_NOINPUT), None, ""
    try:
        token = read_token(token_path)
    except TokenUnavailable as error:
        return _fail(str(error), EX_NOPERM), None, url
    return EX_OK, NodeClient(url, token, timeout=float(getattr(args, "request_timeout", 5.0))), url


def _failed_request(error: NodeError, url: str) -> int:
    if isinstance(error, NodeUnreachable):
        return _fail(f"no node answers at {url} ({error}); is it running? (systemctl status p2ptrain)", EX_UNAVAILABLE)
    if isinstance(error, NodeAuthError):
        return _fail(f"{url}: {error}", EX_NOPERM)
    return _fail(f"{url}: {error}", EX_FAILURE)  # answered, did not accept


def send(args: argparse.Namespace, command: str, duration: float | None = None,
         connected: tuple[NodeClient, str] | None = None) -> tuple[int, dict[str, Any]]:
    """Discover the node (unless ``connected``), send ``command``; (exit code, the node's answer or {})."""
    if connected is None:
        code, found, url = _connect(args)
        if found is None:
            return code, {}
        client = found
    else:
        client, url = connected
    try:
        answer = client.control(command, duration_seconds=duration)
    except NodeError as error:
        return _failed_request(error, url), {}
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


#: How often ``p2ptrain checkpoint`` reads the node's status while it waits for the checkpoint.
CHECKPOINT_POLL = 0.25


def checkpoint(args: argparse.Namespace, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], object] = time.sleep) -> int:
    """Ask the node to checkpoint now, then wait (``--timeout``) until its status counts a new write.

    The node acts on the request between steps, so the answer to the request only says it was queued;
    the written file and its epoch come from the status (``last_checkpoint_path``, ``last_checkpoint_epoch``).
    """
    code, client, url = _connect(args)
    if client is None:
        return code
    try:
        before = client.status()
    except NodeError as error:
        return _failed_request(error, url)
    code, _ = send(args, "checkpoint", connected=(client, url))
    if code:
        return code
    deadline = clock() + float(args.timeout)
    while True:
        try:
            now = client.status()
        except NodeError as error:
            return _failed_request(error, url)
        if now.checkpoint_writes_ok_total > before.checkpoint_writes_ok_total:
            where = now.last_checkpoint_path or "the node's checkpoint directory"
            epoch = int(now.last_checkpoint_epoch if now.last_checkpoint_epoch is not None else now.local_epoch)
            print(f"checkpoint written: {where} (epoch {epoch})")
            return EX_OK
        if now.checkpoint_writes_failed_total > before.checkpoint_writes_failed_total:
            return _fail(f"the node could not write the checkpoint: {now.last_checkpoint_error or 'no reason given'} "
                         "(its previous checkpoint is kept)", EX_FAILURE)
        if clock() >= deadline:
            return _fail(f"the node accepted the request but wrote no checkpoint within {args.timeout:g}s "
                         f"(state {now.state}: it checkpoints between steps; see p2ptrain top)", EX_FAILURE)
        sleep(CHECKPOINT_POLL)
