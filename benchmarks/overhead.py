"""What the daemon's own services cost: the node loop with API, metrics and records, versus without.

``python -m benchmarks.overhead --peers 2`` runs the same swarm of real node loops
(:mod:`benchmarks.node_peer`) alternately with the service hooks that ``p2ptrain run`` uses and
with no-op hooks, ``--repeats`` times each (bare, service, bare, service, ...), so slow drift of a
shared machine hits both variants alike.  While a service swarm trains, this process reads the
nodes as their users would: every node's ``/metrics`` every ``--scrape-every`` seconds (the shipped
Prometheus config: 15 s) and, like ``p2ptrain top`` attached to the first node, its
``/api/v1/status`` and ``/api/v1/peers`` every ``--watch-every`` seconds (1 s).  Reports samples/s
per run, the mean of each variant and the overhead (1 - service / bare); writes ``overhead.json``
and ``overhead.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.peers import PeerProcess, add_fork_option, kill_group, start_peer, wait_for_peers
from p2ptrain.client.http import NodeClient, NodeError
from p2ptrain.daemon.auth import TOKEN_FILE
from p2ptrain.local.swarm import local_node_config

REPO = Path(__file__).resolve().parent.parent
#: What Prometheus reads from every node, and what ``p2ptrain top`` reads from the node it watches.
SCRAPED = ("/metrics",)
WATCHED = ("/api/v1/status", "/api/v1/peers")


def _read(state_dirs: list[Path], paths: tuple[str, ...]) -> int:
    """GET ``paths`` from every node in ``state_dirs`` with its token; returns how many answered 200."""
    answered = 0
    for state_dir in state_dirs:
        try:
            url = (state_dir / "api.url").read_text(encoding="utf-8").strip()
            token = (state_dir / TOKEN_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        client = NodeClient(url, token, timeout=2.0)
        for path in paths:
            with contextlib.suppress(NodeError):
                answered += client.request("GET", path).status == 200
    return answered


class MonitoringReaders:
    """Prometheus on every node and one ``p2ptrain top`` on the first, each on its own schedule."""

    def __init__(self, state_dirs: list[Path], scrape_every: float, watch_every: float) -> None:
        self.state_dirs, self.scrape_every, self.watch_every = state_dirs, scrape_every, watch_every
        self.next_scrape = self.next_watch = time.monotonic()
        self.answers = 0

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.next_scrape:
            self.answers += _read(self.state_dirs, SCRAPED)
            self.next_scrape += self.scrape_every
        if now >= self.next_watch:
            self.answers += _read(self.state_dirs[:1], WATCHED)
            self.next_watch += self.watch_every


def node_overrides(args: argparse.Namespace, peer_checks: bool = True) -> dict[str, dict[str, Any]]:
    """The node config of every peer: the model, the training mode and its pacing from ``args``."""
    return {
        "task": {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "seq_len": 128},
        "training": {"mode": args.mode, "batch_size": args.micro_batch, "target_batch_size": args.global_batch,
                     "inner_steps": args.inner_steps, "inner_batch_size": args.inner_batch, "threads": 1,
                     "warmup_epochs": 0, "validate_every": 1e6, "averaging_timeout": 30.0},
        "checkpoint": {"interval": 1e6},
        "node": {"log_level": "WARNING"},
        "swarm": {"peer_checks": peer_checks},
    }


def peer_state_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / f"peer{rank}" / "state"


def run_swarm(args: argparse.Namespace, hooks: str, run_dir: Path, overrides: dict[str, dict[str, Any]],
              tick: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """``--peers`` node loops (:mod:`benchmarks.node_peer`) in ``run_dir``, each peer's result.

    Bounded by ``--run-timeout``; every process reaped; ``tick`` runs about every 0.1 s meanwhile.
    """
    procs: list[PeerProcess] = []
    try:
        for rank in range(args.peers):
            config = run_dir / f"peer{rank}" / "node.toml"
            config.parent.mkdir(parents=True)
            config.write_text(local_node_config(peer_state_dir(run_dir, rank), run_dir.name, overrides),
                              encoding="utf-8")
            argv = ["--hooks", hooks, "--config", str(config),
                    "--run-dir", str(run_dir), "--rank", str(rank), "--world", str(args.peers),
                    "--out", str(run_dir / f"result.{rank}.json"), "--warmup", str(args.warmup),
                    "--measure", str(args.measure)]
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
            procs.append(start_peer("benchmarks.node_peer", argv, env, run_dir / f"peer{rank}.log",
                                    fork=args.fork_workers))
        wait_for_peers(procs, args.run_timeout, run_dir.name, lambda rank: run_dir / f"peer{rank}.log", tick=tick)
        return [json.loads((run_dir / f"result.{rank}.json").read_text()) for rank in range(args.peers)]
    finally:
        for proc in procs:
            kill_group(proc)


def run_once(args: argparse.Namespace, hooks: str, index: int) -> dict[str, Any]:
    """One swarm of ``--peers`` node loops with ``hooks``, read by its users while it trains."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"overhead-{index}-{hooks}-", dir=args.out))
    readers = MonitoringReaders([peer_state_dir(run_dir, rank) for rank in range(args.peers)], args.scrape_every,
                      args.watch_every)
    results = run_swarm(args, hooks, run_dir, node_overrides(args), readers.tick if hooks == "service" else None)
    return {"hooks": hooks, "run": index, "seq_per_s": sum(r["seq_per_s"] for r in results),
            "per_peer": [round(r["seq_per_s"], 2) for r in results], "endpoint_answers": readers.answers}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    bare = mean(r["seq_per_s"] for r in runs if r["hooks"] == "bare")
    service = mean(r["seq_per_s"] for r in runs if r["hooks"] == "service")
    if bare <= 0:
        raise RuntimeError("the bare runs trained nothing in their windows: no overhead to compare")
    return {"bare_seq_per_s": bare, "service_seq_per_s": service, "service_vs_bare": service / bare,
            "overhead": 1.0 - service / bare}


def markdown(runs: list[dict[str, Any]], summary: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"### Daemon overhead: {args.peers} peers, {args.mode} mode, {args.measure:.0f} s windows, /metrics "
             f"every {args.scrape_every:g} s, status + peers of node 0 every {args.watch_every:g} s", "",
             "| run | hooks | seq/s (all peers) | per peer | endpoint answers |", "|---:|---|---:|---|---:|"]
    for r in runs:
        lines.append(f"| {r['run']} | {r['hooks']} | {r['seq_per_s']:.1f} | {r['per_peer']} | "
                     f"{r['endpoint_answers']} |")
    lines += ["", f"Mean: bare {summary['bare_seq_per_s']:.1f} seq/s, service {summary['service_seq_per_s']:.1f} "
                  f"seq/s; service / bare = {summary['service_vs_bare']:.3f} "
                  f"(overhead {100 * summary['overhead']:+.1f}%)."]
    return "\n".join(lines) + "\n"


def add_swarm_args(p: argparse.ArgumentParser, *, inner_steps: int, inner_batch: int) -> None:
    """The options of a swarm of node loops measured side by side (also :mod:`benchmarks.defences`)."""
    p.add_argument("--peers", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("reports/benchmarks"))
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of training before the window opens")
    p.add_argument("--measure", type=float, default=30.0, help="seconds in each measurement window")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=128, help="gradient mode: sequences per epoch")
    p.add_argument("--inner-steps", type=int, default=inner_steps, help="DiLoCo: inner steps per round (H)")
    p.add_argument("--inner-batch", type=int, default=inner_batch,
                   help="DiLoCo: sequences per inner step (0: the micro-batch)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--run-timeout", type=float, default=180.0, help="seconds before a run's peers are killed")
    add_fork_option(p)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.splitlines()[0])
    add_swarm_args(p, inner_steps=500, inner_batch=0)
    p.add_argument("--scrape-every", type=float, default=15.0, help="seconds between scrapes of every node's /metrics")
    p.add_argument("--watch-every", type=float, default=1.0,
                   help="seconds between reads of the first node's status and peers (p2ptrain top)")
    p.add_argument("--mode", choices=("gradient", "diloco"), default="diloco",
                   help="diloco (default) keeps averaging rounds out of the window, so the daemon's cost shows")
    args = p.parse_args(argv)
    if args.peers < 1 or args.repeats < 1 or args.measure <= 0 or args.warmup < 0 or args.scrape_every <= 0 \
            or args.watch_every <= 0:
        p.error("--peers and --repeats must be >= 1; --measure, --scrape-every and --watch-every > 0; --warmup >= 0")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: peers killed


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every run, alternating bare and service; raises RuntimeError naming the run that failed."""
    runs = []
    for index in range(args.repeats):
        for hooks in ("bare", "service"):
            print(f"[overhead] run {index}: {hooks} ...", flush=True)
            runs.append(run_once(args, hooks, index))
            print(f"[overhead] run {index}: {hooks} {runs[-1]['seq_per_s']:.1f} seq/s", flush=True)
    return runs, summarize(runs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        runs, summary = measure(args)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"[overhead] FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    command = " ".join(["python -m benchmarks.overhead", *(argv if argv is not None else sys.argv[1:])])
    (args.out / "overhead.json").write_text(json.dumps({"command": command, "runs": runs, **summary}, indent=1))
    text = markdown(runs, summary, args)
    (args.out / "overhead.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
