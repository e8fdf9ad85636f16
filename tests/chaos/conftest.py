"""Fixtures of the fault-injection suite: tiny real nodes, and the JSON report of measured figures.

Every scenario records what it measured (time to recover, epochs and samples lost, RSS) with the
``chaos_report`` fixture; at the end of the session the figures are merged into
``reports/chaos.json`` (or ``$P2PTRAIN_CHAOS_REPORT``), so running one scenario keeps the others'.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.local.forkserver import ForkServer
from p2ptrain.local.swarm import LocalNode, NodeLauncher

REPO = Path(__file__).resolve().parents[2]

#: A model of a few thousand parameters: epochs every few seconds on two shared cores.
TINY_TASK = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "validation_batches": 2}
#: Short timeouts so a failure shows within seconds; the suite asserts bounds in multiples of these.
#: DiLoCo scenarios count rounds of inner_steps micro-batches (inner_batch_size = batch_size).
CHAOS_TRAINING = {"target_batch_size": 192, "batch_size": 8, "validate_every": 60.0, "matchmaking_time": 0.5,
                  "averaging_timeout": 10.0, "load_state_timeout": 10.0, "load_state_attempts": 2,
                  "warmup_epochs": 1, "inner_batch_size": 8}
AVERAGING_TIMEOUT = CHAOS_TRAINING["averaging_timeout"]
#: Scenario nodes train within a quarter of the machine: what they measure is counted in rounds and
#: averaging timeouts, and three tests run side by side (see the Makefile).  A scenario that needs a
#: peer at full speed says so (``volunteer={"max_cpu_percent": 0.0}``) and is marked ``alone``.
CHAOS_VOLUNTEER = {"max_cpu_percent": 25.0}

NodeFactory = Callable[..., LocalNode]


def report_path() -> Path:
    return Path(os.environ.get("P2PTRAIN_CHAOS_REPORT", REPO / "reports" / "chaos.json"))


class ChaosReport:
    """Figures per scenario, written once at the end of the session (merged with an existing file)."""

    def __init__(self) -> None:
        self.scenarios: dict[str, dict[str, Any]] = {}

    def record(self, scenario: str, **figures: Any) -> None:
        entry = self.scenarios.setdefault(scenario, {})
        entry.update(figures)
        entry["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def write(self, path: Path) -> None:
        if not self.scenarios:
            return
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            existing = {}
        scenarios = existing.get("scenarios", {}) if isinstance(existing, dict) else {}
        scenarios.update(self.scenarios)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"scenarios": dict(sorted(scenarios.items()))}, indent=2) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)


@pytest.fixture(scope="session")
def chaos_report() -> Iterator[ChaosReport]:
    report = ChaosReport()
    yield report
    report.write(report_path())


@contextlib.contextmanager
def node_factory(base: Path, launcher: NodeLauncher | None = None) -> Iterator[NodeFactory]:
    """``factory(name, run_id=..., env=..., **section_overrides)``: nodes with the tiny task under ``base``,
    started by ``launcher`` (None: each its own interpreter), all stopped on leaving."""
    nodes: list[LocalNode] = []
    default_run = f"chaos-{uuid.uuid4().hex[:8]}"
    counter = itertools.count()

    def factory(name: str | None = None, run_id: str | None = None, env: Mapping[str, str] | None = None,
                **sections: Mapping[str, Any]) -> LocalNode:
        overrides: dict[str, dict[str, Any]] = {"task": dict(TINY_TASK), "training": dict(CHAOS_TRAINING),
                                                "checkpoint": {"interval": 600.0, "keep": 3},
                                                "volunteer": dict(CHAOS_VOLUNTEER)}
        for section, values in sections.items():
            overrides.setdefault(section, {}).update(values)
        node_name = name or f"node{next(counter)}"
        node = LocalNode(node_name, base / node_name, run_id or default_run, overrides, env=dict(env or {}),
                         launcher=launcher)
        nodes.append(node)
        return node

    try:
        yield factory
    finally:
        # A clean-up needs no final state: a node still stopping after 5 s (a round in flight, its
        # final checkpoint) is killed with its helpers.
        LocalNode.stop_all(nodes, timeout=5, stacks=False)


@pytest.fixture
def make_node(tmp_path: Path, node_forkserver: ForkServer) -> Iterator[NodeFactory]:
    """``make_node(name, run_id=..., env=..., **section_overrides)`` with the tiny task; all stopped at teardown."""
    with node_factory(tmp_path, node_forkserver) as factory:
        yield factory
