"""N real nodes on this machine: what each node costs, and whether its rounds hold the whole swarm.

``python -m benchmarks.scale --nodes 4 8 16 32`` starts, for each N, N ``p2ptrain run`` processes on
127.0.0.1 (the tiny model, the shipped round settings, each node's training capped to
``--train-percent`` of a core so that training does not hide what the node's own helpers cost).
They join one after another through the first node.  Reported per N:

- join -> first averaged round, p50 and p95 over the nodes (from the moment a node's status first
  shows it past joining the DHT to the first round in which it received parts from its group);
- over a ``--seconds`` window once every node has averaged: each node's rounds full / partial /
  failed (full: every part of its group arrived), the share of full rounds of the worst node and
  the median one, the group sizes seen, bytes sent per sequence trained;
- each node's CPU per averaging round and, with every node paused (still in the swarm, serving its
  state), its idle CPU in percent of one core, split into the node process, hivemind's forked
  helpers (DHT, averagers) and the p2p daemon; PSS and processes per node;
- the replicas' spread at the end: each node's final parameters against the nodes' mean (relative
  L2 distance), and the spread of the validation losses the nodes last reported.

``--against DIR`` runs every N with another checkout's code as well (same interpreter and packages,
:mod:`benchmarks.startup`), in alternating order, for a before/after side by side.  ``--count-dht``
also counts every node's DHT operations by key (:mod:`benchmarks.dht_ops`): per node and second,
over the window and while paused.  ``--link RATE``
puts each node in its own network namespace behind a tbf-shaped link (root; 10.213.0.x addresses
made here and deleted after).
Before each N the harness checks the machine's available memory against what the nodes measured so
far need, and reports the N it could not start instead of starting it.  Writes ``scale.json`` and
``scale.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.dht_ops import read_counts
from benchmarks.footprint import ROLES, TreeSample, cpu_percent, sample_tree
from benchmarks.netns import ShapedNet, netns_unavailable, shaped_network
from benchmarks.startup import node_environment
from p2ptrain.averaging.progress import STALE_AFTER
from p2ptrain.config.schema import TrainingSection
from p2ptrain.local.swarm import LocalNode, NodeLauncher
from p2ptrain.status import NodeState, StatusSnapshot

#: The chaos suite's tiny model: the node's own costs, not the model's, are measured.
TASK = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "validation_batches": 2}
#: Round settings taken as shipped (from the config schema, so the benchmark follows the defaults).
SHIPPED = ("target_batch_size", "matchmaking_time", "averaging_timeout", "load_state_timeout", "validate_every")
#: A node's PSS assumed before one was measured, for the memory check (MiB).
FIRST_GUESS_MIB = 700.0
#: Memory the machine keeps for everything else while the nodes run (MiB).
HEADROOM_MIB = 2048.0
PAST_JOINING = {NodeState.SYNCING.value, NodeState.TRAINING.value, NodeState.PAUSED.value}


def training_overrides() -> dict[str, Any]:
    shipped = {key: TrainingSection.model_fields[key].default for key in SHIPPED}
    return {**shipped, "threads": 1, "warmup_epochs": 1}


@dataclass
class NodeTrace:
    """What the watcher saw of one node."""

    started: float
    joined: float | None = None
    first_round: float | None = None
    last: StatusSnapshot | None = None
    rounds_seen: int = 0
    #: (group size, share of the group's parts received) of each round seen, in order.
    rounds: list[tuple[int, float | None]] = field(default_factory=list)

    def update(self, status: StatusSnapshot, now: float) -> None:
        if self.joined is None and status.state in PAST_JOINING:
            self.joined = now
        total = (status.averaging_rounds_ok_total + status.averaging_rounds_partial_total
                 + status.averaging_rounds_failed_total)
        averaged = status.averaging_rounds_ok_total + status.averaging_rounds_partial_total
        if self.first_round is None and averaged > 0:
            self.first_round = now
        if total > self.rounds_seen:
            self.rounds.append((status.last_round_group_size, status.last_round_received_fraction))
            self.rounds_seen = total
        self.last = status


class Watcher:
    """Reads every started node's status about once a ``interval``, in a thread, into its trace."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.nodes: list[tuple[LocalNode, NodeTrace]] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8)
        self._thread = threading.Thread(target=self._loop, name="scale-watcher", daemon=True)

    def add(self, node: LocalNode) -> NodeTrace:
        trace = NodeTrace(started=time.monotonic())
        self.nodes.append((node, trace))
        return trace

    def poll(self) -> None:
        nodes = list(self.nodes)
        statuses = list(self._pool.map(lambda pair: pair[0].status(timeout=5.0), nodes))
        now = time.monotonic()
        for (_, trace), status in zip(nodes, statuses, strict=True):
            if status is not None:
                trace.update(status, now)

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.poll()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)


def available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def parameter_spread(nodes: list[LocalNode]) -> list[float]:
    """Each node's final parameters' relative L2 distance from the nodes' mean (their newest checkpoints)."""
    import torch

    from p2ptrain.model.checkpoint import CheckpointStore, read_checkpoint

    vectors = []
    for node in nodes:
        paths = CheckpointStore(node.state_dir / "checkpoints", keep=1).paths()
        if paths:
            model = read_checkpoint(paths[0])["model"]
            vectors.append(torch.cat([t.detach().float().flatten() for t in model.values()]))
    if len(vectors) < 2:
        return []
    mean = torch.stack(vectors).mean(dim=0)
    norm = float(mean.norm()) or 1.0
    return [float((v - mean).norm()) / norm for v in vectors]


def _diff(after: StatusSnapshot, before: StatusSnapshot, name: str) -> int:
    return int(getattr(after, name) - getattr(before, name))


@contextlib.contextmanager
def _network(n: int, link: str | None) -> Iterator[ShapedNet | None]:
    if link is None:
        yield None
        return
    with shaped_network(n, link) as net:
        yield net


def _make_node(base: Path, i: int, run_id: str, args: argparse.Namespace, checkout: Path | None,
               net: ShapedNet | None, launcher: NodeLauncher | None) -> LocalNode:
    """Node ``i`` of a swarm; with ``checkout``, running that checkout's code (in an interpreter of its
    own, as a node that counts its DHT operations is: their hooks are installed as it starts)."""
    swarm: dict[str, Any] = {"bootstrap_timeout": 120.0}
    if net is not None:
        swarm["listen_addrs"] = [f"/ip4/{net.addresses[i]}/tcp/0"]
    overrides = {"task": TASK, "training": training_overrides(), "swarm": swarm,
                 "volunteer": {"max_cpu_percent": args.train_percent / (os.cpu_count() or 1)},
                 "checkpoint": {"interval": 3600.0, "keep": 1}}
    env = node_environment(base / "site", checkout, base / "dht" if args.count_dht else None, run_id)
    return LocalNode(f"n{i}", base / f"n{i}", run_id, overrides, env=env,
                     netns=net.namespaces[i] if net is not None else None, launcher=None if env else launcher)


def run_swarm(n: int, args: argparse.Namespace, base: Path, checkout: Path | None,
              launcher: NodeLauncher | None = None) -> dict[str, Any]:
    """Start ``n`` nodes, let them average, measure; the figures of this N.  ``launcher``: how the nodes
    start (a test's fork server); None, as the benchmark runs, gives each its own interpreter, whose
    imports its memory figures then count."""
    run_id = f"scale-{uuid.uuid4().hex[:8]}"
    with _network(n, args.link) as net, Watcher() as watcher:
        nodes = [_make_node(base, i, run_id, args, checkout, net, launcher) for i in range(n)]
        try:
            return _measure(nodes, watcher, args)
        finally:
            LocalNode.stop_all(nodes, timeout=60)


def _measure(nodes: list[LocalNode], watcher: Watcher, args: argparse.Namespace) -> dict[str, Any]:
    n = len(nodes)
    nodes[0].start()
    traces = [watcher.add(nodes[0])]
    join = nodes[0].join_addrs(timeout=120)
    for node in nodes[1:]:
        time.sleep(args.start_every)
        node.start(join=join)
        traces.append(watcher.add(node))
    deadline = time.monotonic() + args.join_timeout
    while time.monotonic() < deadline and not all(t.first_round for t in traces):
        if any(not node.running for node in nodes):
            failed = next(node for node in nodes if not node.running)
            raise RuntimeError(f"{failed.name} exited while the swarm formed:\n{failed.log_tail()}")
        time.sleep(1.0)
    joins = [t.first_round - t.joined for t in traces if t.first_round and t.joined]
    watcher.poll()
    first = [t.last or StatusSnapshot() for t in traces]
    rounds_before = [len(t.rounds) for t in traces]
    dht = nodes[0].workdir.parent / "dht"
    ops0 = read_counts(dht)
    trees0, window_began = [sample_tree(node.process.pid) for node in nodes if node.process], time.monotonic()
    time.sleep(args.seconds)
    watcher.poll()
    window = time.monotonic() - window_began
    ops1 = read_counts(dht)
    trees1 = [sample_tree(node.process.pid, memory=True) for node in nodes if node.process]
    last = [t.last or StatusSnapshot() for t in traces]
    result = {"nodes": n, "averaged": len(joins), "join_to_round_p50": percentile(joins, 0.5),
              "join_to_round_p95": percentile(joins, 0.95), "window_seconds": window,
              **_rounds(first, last, [t.rounds[k:] for t, k in zip(traces, rounds_before, strict=True)]),
              **_busy(trees0, trees1, first, last, window), **_memory(trees1)}
    result.update(_idle(nodes, watcher, args.idle_seconds, dht) if args.idle_seconds > 0 else _NOT_IDLE)
    result["dht_ops_busy"] = _rates(ops0, ops1, window * n)
    losses = [s.val_loss for s in last if s.val_loss is not None]
    result["val_loss_spread"] = max(losses) - min(losses) if len(losses) > 1 else None
    result["val_loss_median"] = statistics.median(losses) if losses else None
    LocalNode.stop_all(nodes, timeout=60)
    spread = parameter_spread(nodes)
    result["param_spread_max"] = max(spread) if spread else None
    result["param_spread_median"] = statistics.median(spread) if spread else None
    return result


def _rounds(first: list[StatusSnapshot], last: list[StatusSnapshot],
            seen: list[list[tuple[int, float | None]]]) -> dict[str, Any]:
    per_node = []
    for a, b in zip(first, last, strict=True):
        counts = [_diff(b, a, f"averaging_rounds_{kind}_total") for kind in ("ok", "partial", "failed")]
        per_node.append(counts)
    shares = [counts[0] / sum(counts) for counts in per_node if sum(counts)]
    groups = [size for rounds in seen for size, _ in rounds if size]
    totals = [sum(c[k] for c in per_node) for k in range(3)]
    samples = sum(_diff(b, a, "samples_processed_total") for a, b in zip(first, last, strict=True))
    sent = sum(_diff(b, a, "bytes_sent_total") for a, b in zip(first, last, strict=True))
    return {"rounds_full": totals[0], "rounds_partial": totals[1], "rounds_failed": totals[2],
            "rounds_per_node": statistics.median(sum(c) for c in per_node) if per_node else 0,
            "full_share_worst": min(shares) if shares else None,
            "full_share_median": statistics.median(shares) if shares else None,
            "group_min": min(groups) if groups else None, "group_median": statistics.median(groups) if groups else None,
            "group_max": max(groups) if groups else None, "samples": samples,
            "bytes_per_sequence": sent / samples if samples else None}


def _busy(trees0: list[TreeSample], trees1: list[TreeSample], first: list[StatusSnapshot],
          last: list[StatusSnapshot], window: float) -> dict[str, Any]:
    per_round = []
    for t0, t1, a, b in zip(trees0, trees1, first, last, strict=True):
        rounds = sum(_diff(b, a, f"averaging_rounds_{kind}_total") for kind in ("ok", "partial", "failed"))
        spent = sum(t1.cpu_seconds[r] - t0.cpu_seconds[r] for r in ROLES if r != "node")
        if rounds:
            per_round.append(spent / rounds)
    busy = [cpu_percent(t0, t1, window) for t0, t1 in zip(trees0, trees1, strict=True)]
    return {"helper_cpu_seconds_per_round": statistics.median(per_round) if per_round else None,
            **{f"busy_cpu_{role}": statistics.median(b[role] for b in busy) for role in ROLES}}


def _memory(trees: list[TreeSample]) -> dict[str, Any]:
    pss = [sum(t.pss_mib.values()) for t in trees]
    return {"pss_mib_median": statistics.median(pss), "pss_mib_max": max(pss),
            **{f"pss_mib_{role}": statistics.median(t.pss_mib[role] for t in trees) for role in ROLES},
            "processes_per_node": statistics.median(sum(t.processes.values()) for t in trees),
            "open_files_per_node": statistics.median(t.open_files for t in trees)}


def _rates(before: Counter[str], after: Counter[str], node_seconds: float) -> dict[str, float]:
    """Operations per node and second between two readings of the counters, most frequent first."""
    rates = {kind: (after[kind] - before[kind]) / node_seconds for kind in after}
    return dict(sorted(((k, v) for k, v in rates.items() if v > 0), key=lambda item: -item[1]))


#: The idle figures of a run told to skip the paused phase (``--idle-seconds 0``).
_NOT_IDLE: dict[str, Any] = {"paused": 0, "idle_cpu_median": None, "idle_cpu_max": None, "dht_ops_idle": {},
                             **{f"idle_cpu_{role}": None for role in ROLES}}


def _idle(nodes: list[LocalNode], watcher: Watcher, seconds: float, dht: Path) -> dict[str, Any]:
    """Pause every node, wait until the last round ended and the last training progress no longer
    counts (a pause of minutes, as users pause), then read each node's CPU over ``seconds``."""
    paused = sum(node.control("pause") for node in nodes)
    settle = time.monotonic() + 45
    while time.monotonic() < settle:
        watcher.poll()
        states = [trace.last.state if trace.last else "" for _, trace in watcher.nodes]
        if all(state == NodeState.PAUSED.value for state in states):
            break
        time.sleep(1.0)
    time.sleep(STALE_AFTER + 5.0)  # until the entries of the last training steps no longer count
    ops0 = read_counts(dht)
    before, began = [sample_tree(node.process.pid) for node in nodes if node.process], time.monotonic()
    time.sleep(seconds)
    after = [sample_tree(node.process.pid) for node in nodes if node.process]
    elapsed = time.monotonic() - began
    idle = [cpu_percent(a, b, elapsed) for a, b in zip(before, after, strict=True)]
    totals = [sum(i.values()) for i in idle]
    return {"paused": paused, "idle_cpu_median": statistics.median(totals), "idle_cpu_max": max(totals),
            "dht_ops_idle": _rates(ops0, read_counts(dht), elapsed * len(nodes)),
            **{f"idle_cpu_{role}": statistics.median(i[role] for i in idle) for role in ROLES}}


def fits_in_memory(n: int, measured: list[dict[str, Any]]) -> str | None:
    """None when ``n`` nodes fit in the memory available now, else the reason they do not."""
    per_node = max((r["pss_mib_max"] for r in measured if r.get("pss_mib_max")), default=FIRST_GUESS_MIB)
    need, have = n * per_node * 1.1 + HEADROOM_MIB, available_mib()
    if need > have:
        return (f"memory: {n} nodes x {per_node:.0f} MiB PSS (+10%, + {HEADROOM_MIB:.0f} MiB for the rest) = "
                f"{need:.0f} MiB, {have:.0f} MiB available")
    return None


def _fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"Scale benchmark: tiny model, shipped round settings, training capped at {args.train_percent:g}% of a "
             f"core per node, {args.seconds:.0f} s window, idle read over {args.idle_seconds:.0f} s paused, link "
             f"{args.link or 'loopback'}; {os.cpu_count()} cores",
             "",
             "| code | N | averaged | join->round p50/p95 (s) | rounds full/partial/failed | full share worst/median "
             "| group min/med/max | bytes/seq | helper CPU s/round "
             "| idle CPU % of a core (median/max; node+helpers+p2pd) | PSS MiB/node (node+helpers+p2pd) "
             "| processes/node | param spread max | val loss spread |",
             "|---|---:|---:|---|---|---|---|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        if "stopped_by" in r:
            lines.append(f"| {r['code']} | {r['nodes']} | not started: {r['stopped_by']} |" + " |" * 11)
            continue
        lines.append(
            f"| {r['code']} | {r['nodes']} | {r['averaged']} | {_fmt(r['join_to_round_p50'])} / "
            f"{_fmt(r['join_to_round_p95'])} | {r['rounds_full']}/{r['rounds_partial']}/{r['rounds_failed']} | "
            f"{_fmt(r['full_share_worst'], '.0%')} / {_fmt(r['full_share_median'], '.0%')} | "
            f"{_fmt(r['group_min'], 'd')}/{_fmt(r['group_median'], '.0f')}/{_fmt(r['group_max'], 'd')} | "
            f"{_fmt(r['bytes_per_sequence'], '.0f')} | {_fmt(r['helper_cpu_seconds_per_round'], '.2f')} | "
            f"{_fmt(r['idle_cpu_median'])} / {_fmt(r['idle_cpu_max'])} ({_fmt(r['idle_cpu_node'])}+"
            f"{_fmt(r['idle_cpu_helpers'])}+{_fmt(r['idle_cpu_p2pd'])}) | {_fmt(r['pss_mib_median'], '.0f')} "
            f"({_fmt(r['pss_mib_node'], '.0f')}+{_fmt(r['pss_mib_helpers'], '.0f')}+"
            f"{_fmt(r['pss_mib_p2pd'], '.0f')}) | "
            f"{_fmt(r['processes_per_node'], '.0f')} | {_fmt(r['param_spread_max'], '.4f')} | "
            f"{_fmt(r['val_loss_spread'], '.3f')} |")
    for r in rows:
        for phase in ("busy", "idle"):
            ops = r.get(f"dht_ops_{phase}")
            if ops:
                top = ", ".join(f"{kind} {rate:.2f}" for kind, rate in list(ops.items())[:10])
                lines.append(f"\nDHT operations per node and second, {r['code']}, N={r['nodes']}, {phase}: {top}")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32], help="swarm sizes (default 4 8 16 32)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window once all averaged (default 60)")
    parser.add_argument("--idle-seconds", type=float, default=30.0,
                        help="idle CPU window, all paused (default 30; 0 skips the paused phase and its 35 s wait)")
    parser.add_argument("--train-percent", type=float, default=4.0,
                        help="each node's training cap in percent of one core (default 4)")
    parser.add_argument("--start-every", type=float, default=1.0, help="seconds between node starts (default 1)")
    parser.add_argument("--join-timeout", type=float, default=300.0,
                        help="how long the swarm may take until every node averaged (default 300)")
    parser.add_argument("--link", default=None, help="tbf rate of each node's link, e.g. 50mbit (namespaces; root)")
    parser.add_argument("--count-dht", action="store_true",
                        help="count each node's DHT operations by key (over the window and while paused)")
    parser.add_argument("--against", type=Path, default=None, help="another checkout's root, run side by side")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="where scale.json and scale.md go")
    args = parser.parse_args(argv)
    if min(args.nodes) < 2 or args.seconds <= 0 or args.idle_seconds < 0 or not 0 < args.train_percent <= 100:
        parser.error("--nodes must be at least 2, --seconds positive, --idle-seconds not negative, "
                     "--train-percent in (0, 100]")
    if args.link is not None and not re.fullmatch(r"[0-9]+(\.[0-9]+)?[kmg]?bit", args.link):
        parser.error(f"--link {args.link}: a tbf rate such as 50mbit (tbf shapes the rate; a delay would need netem)")
    if args.against is not None and not (args.against / "p2ptrain" / "__init__.py").is_file():
        parser.error(f"--against {args.against}: not a checkout of this project (no p2ptrain/__init__.py)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.link is not None and (reason := netns_unavailable()) is not None:
        print(f"benchmarks.scale: cannot shape links here: {reason}", file=sys.stderr)
        return 69
    checkouts: list[tuple[str, Path | None]] = [("this", None)]
    if args.against is not None:
        checkouts.append((f"{args.against.name}", args.against.resolve()))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="p2ptrain-scale-") as tmp:
        for index, n in enumerate(args.nodes):
            order = checkouts if index % 2 == 0 else checkouts[::-1]
            for code, checkout in order:
                print(f"[N={n}] {code} ...", flush=True)
                reason = fits_in_memory(n, rows)
                if reason is not None:
                    rows.append({"code": code, "nodes": n, "stopped_by": reason})
                else:
                    try:
                        rows.append({"code": code, **run_swarm(n, args, Path(tmp) / f"{n}-{code}", checkout)})
                    except (RuntimeError, TimeoutError, subprocess.SubprocessError) as exc:
                        rows.append({"code": code, "nodes": n, "stopped_by": f"failed: {str(exc)[:300]}"})
                print(f"    {json.dumps(rows[-1])}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    table = markdown(rows, args)
    (args.out / "scale.md").write_text(table, encoding="utf-8")
    print(table)
    return 0 if all("stopped_by" not in r or r["stopped_by"].startswith("memory") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
