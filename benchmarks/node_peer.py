"""One peer of the node-loop benchmarks: the real node loop, with the service hooks or without.

Started by :mod:`benchmarks.overhead` and :mod:`benchmarks.defences` as ``python -m
benchmarks.node_peer``.  Both variants run
:class:`p2ptrain.daemon.node.Node` on the same config; ``--hooks service`` adds what ``p2ptrain
run`` adds (HTTP API with /metrics, signed peer records on their own timer, the volunteer policy
checks), ``--hooks bare`` uses the no-op hooks.  Once the node trains, a meter thread reads its
own counters: when every peer trains it waits ``--warmup`` seconds, counts samples for
``--measure`` seconds (with the averaging rounds that ended meanwhile and the offences counted),
writes the result and stops the node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from p2ptrain.config.schema import load_config
from p2ptrain.daemon.hooks import NodeHooks, SwarmPresence
from p2ptrain.daemon.node import Node
from p2ptrain.daemon.service import ServiceHooks
from p2ptrain.daemon.systemd import SystemdNotifier
from p2ptrain.optim.round_stats import RoundFigures
from p2ptrain.waiting import WaitTimeout, wait_until

#: How long a peer waits for the others before it gives up (the harness kills it later anyway).
BARRIER_TIMEOUT = 180.0
#: Seconds between reads of the trainer's sample counter while measuring.
POLL = 0.01


def _wait_for_files(paths: list[Path], timeout: float, node: Node) -> bool:
    """True once every file exists; False at the deadline or when the node is asked to stop."""
    try:
        wait_until(lambda: node.stopper.is_set() or all(p.exists() for p in paths), timeout, "barrier files",
                   interval=0.1, sleep=node.stopper.wait)
    except WaitTimeout:
        return False
    return not node.stopper.is_set()


def _publish_address(node: Node, run_dir: Path) -> None:
    tmp = run_dir / "peer0.addr.tmp"
    assert node.swarm is not None
    tmp.write_text(" ".join(node.swarm.maddrs[:1]), encoding="utf-8")
    tmp.rename(run_dir / "peer0.addr")


def _step_edges(node: Node, seconds: float) -> tuple[tuple[int, float], tuple[int, float]]:
    """(samples, time) at the first and the last step that ended within the next ``seconds``.

    Timing from step to step, not from window edge to window edge, so the count is not off by a
    partial step (about 1% of a 30 s window); the trainer's counter is read every ``POLL`` s.
    """
    assert node.parts is not None
    trainer = node.parts.trainer
    deadline = time.monotonic() + seconds
    seen = trainer.samples_processed
    with contextlib.suppress(WaitTimeout):  # no step in the whole window: the result says 0
        wait_until(lambda: trainer.samples_processed != seen, seconds, "a step", interval=POLL)
    first = (trainer.samples_processed, time.monotonic())
    last = first
    while time.monotonic() < deadline:
        time.sleep(POLL)
        count = trainer.samples_processed
        if count != last[0]:
            last = (count, time.monotonic())
    return first, last


def _round_figures(before: RoundFigures, after: RoundFigures) -> dict[str, Any]:
    """The averaging rounds that ended in the window: counts by outcome and their mean duration."""
    ended = after.rounds_total - before.rounds_total
    return {"rounds": [after.rounds_ok - before.rounds_ok, after.rounds_partial - before.rounds_partial,
                       after.rounds_failed - before.rounds_failed],
            "round_seconds": (after.duration_sum - before.duration_sum) / ended if ended else None}


def meter(node: Node, args: argparse.Namespace) -> None:
    """Measure this peer's samples/s in the shared window, write the result, stop the node."""
    run_dir = Path(args.run_dir)
    try:
        if args.rank == 0:
            _publish_address(node, run_dir)
        (run_dir / f"training.{args.rank}").touch()
        if not _wait_for_files([run_dir / f"training.{r}" for r in range(args.world)], BARRIER_TIMEOUT, node):
            return
        time.sleep(args.warmup)
        before = node.swarm_stats.rounds.figures()
        (first, began), (last, ended) = _step_edges(node, args.measure)
        result = {"hooks": args.hooks, "rank": args.rank, "samples": last - first, "seconds": ended - began,
                  "seq_per_s": (last - first) / (ended - began) if ended > began else 0.0,
                  **_round_figures(before, node.swarm_stats.rounds.figures()),
                  "peer_checks": node.defences is not None,
                  "offences": node.defences.figures().total if node.defences is not None else 0}
        Path(args.out).write_text(json.dumps(result), encoding="utf-8")
        # Keep training until every peer has measured, so nobody's window loses its partner.
        (run_dir / f"measured.{args.rank}").touch()
        _wait_for_files([run_dir / f"measured.{r}" for r in range(args.world)], BARRIER_TIMEOUT, node)
    finally:
        node.request_stop("benchmark window over")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hooks", choices=("bare", "service"), required=True)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--measure", type=float, default=30.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config)
    hooks = ServiceHooks(config, args.config, SystemdNotifier.from_environ({})) if args.hooks == "service" \
        else NodeHooks()
    join: list[str] = []
    if args.rank > 0:
        addr = Path(args.run_dir) / "peer0.addr"
        try:
            wait_until(addr.exists, BARRIER_TIMEOUT, "address of the first peer", interval=0.1)
        except WaitTimeout:
            print("benchmark peer: the first peer never published its address", file=sys.stderr)
            return 1
        join = addr.read_text(encoding="utf-8").split()
    node = Node(config, extra_peers=join, hooks=hooks)
    on_ready = hooks.ready

    def ready(presence: SwarmPresence) -> None:
        # The meter starts with training, not before: the node forks hivemind's helpers while it
        # joins, and a bare node has no thread of its own at that point.
        on_ready(presence)
        threading.Thread(target=meter, args=(node, args), name="meter", daemon=True).start()

    hooks.ready = ready  # type: ignore[method-assign]
    return node.run()


if __name__ == "__main__":
    sys.exit(main())
