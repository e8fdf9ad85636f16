"""Talking to a live node's API from a test: its token, and the project's client pointed at it."""

from __future__ import annotations

from p2ptrain.client.http import NodeClient
from p2ptrain.local.swarm import LocalNode


def node_token(node: LocalNode) -> str:
    return (node.state_dir / "api.token").read_text(encoding="utf-8").strip()


def node_client(node: LocalNode, token: str | None = None, timeout: float = 10.0) -> NodeClient:
    """A client for ``node``'s API (it must be up: its api.url written)."""
    url = node.api_url()
    assert url is not None, f"{node.name} has no API URL yet"
    return NodeClient(url, token, timeout)
