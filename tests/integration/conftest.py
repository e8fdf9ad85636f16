"""Real nodes as separate ``p2ptrain run`` processes on 127.0.0.1, cleaned up after each test."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import p2ptrain.averaging  # noqa: F401  (hivemind processes forked here: bounded starts, safe stops)
from p2ptrain.local.forkserver import ForkServer
from p2ptrain.local.swarm import LocalNode

#: Small and quick: epochs every few seconds on two shared cores.
FAST_TRAINING = {"target_batch_size": 48, "batch_size": 8, "validate_every": 5.0}
#: A model small enough that start-up and checkpoints cost almost nothing (pass as ``task=TINY_TASK``).
TINY_TASK = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32}
#: Test nodes train within a share of the machine (``volunteer.max_cpu_percent``): tests wait for
#: rounds and events, not for throughput, and three tests run side by side (see the Makefile).
TEST_VOLUNTEER = {"max_cpu_percent": 20.0}

NodeFactory = Callable[..., LocalNode]


@pytest.fixture
def make_node(tmp_path: Path, node_forkserver: ForkServer) -> Iterator[NodeFactory]:
    """``make_node(name, run_id=..., env=..., args=..., owned=..., **section_overrides)``; every node is
    stopped at teardown. ``owned``: a node of an owned run (``args`` such as ``("--run", REF)``), whose
    config holds only what the overrides give beyond the loopback defaults' local part."""
    nodes: list[LocalNode] = []
    default_run = f"it-{uuid.uuid4().hex[:8]}"
    counter = itertools.count()

    def factory(name: str | None = None, run_id: str | None = None, env: Mapping[str, str] | None = None,
                args: Sequence[str] = (), owned: bool = False, **sections: Mapping[str, Any]) -> LocalNode:
        overrides: dict[str, dict[str, Any]] = {"volunteer": dict(TEST_VOLUNTEER)}
        if not owned:
            overrides["training"] = dict(FAST_TRAINING)
        for section, values in sections.items():
            overrides.setdefault(section, {}).update(values)
        node_name = name or f"node{next(counter)}"
        node = LocalNode(node_name, tmp_path / node_name, None if owned else run_id or default_run, overrides,
                         env or {}, args=tuple(args), launcher=node_forkserver)
        nodes.append(node)
        return node

    yield factory
    # A clean-up needs no final state: a node still stopping after 5 s (a round in flight, its
    # final checkpoint) is killed with its helpers.
    LocalNode.stop_all(nodes, timeout=5, stacks=False)
