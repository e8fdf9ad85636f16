"""Side-by-side benchmark: compute-only, DDP, plain hivemind, p2ptrain gradient mode, p2ptrain DiLoCo.

``python -m benchmarks.swarm --peers 2`` runs every mode with the same model, data, micro-batch and
global batch, each peer a real subprocess on 127.0.0.1; then (when network namespaces can be made)
DDP and p2ptrain again on a tbf-shaped link between namespaces.  Writes ``results.json`` and
``results.md`` under ``--out`` and prints the table last.  Every run is time-bounded, and every
process it started is killed and reaped, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import overhead
from benchmarks.netns import ShapedNet, netns_unavailable, shaped_network
from benchmarks.peers import PeerProcess, add_fork_option, kill_group, start_peer, wait_for_peers
from benchmarks.report import add_ratios, markdown_table, summarize
from benchmarks.worker import add_outer_step_options
from p2ptrain.averaging.compression import wire_bytes
from p2ptrain.swarm.daemon_flags import free_loopback_port

ALL_MODES = ("compute", "ddp", "hivemind", "p2p_grad", "diloco", "diloco_int8", "diloco_topk", "diloco_topk_sync")
SHAPED_MODES = ("ddp", "diloco", "diloco_topk")  # add p2p_grad with --shaped-modes (about +150 s)
WORKER_OPTS = ("sequences", "eval_every", "max_train_seconds", "micro_batch", "global_batch", "lr", "d_model",
               "n_layers", "n_heads", "val_batches", "inner_steps", "inner_batch", "matchmaking_time",
               "averaging_timeout", "peer_checks", "outer_topk_density", "outer_value_bits", "outer_lr",
               "outer_momentum")


def run_mode(args: argparse.Namespace, mode: str, net: ShapedNet | None, *, world: int | None = None,
             rank_options: Callable[[int], list[str]] | None = None,
             rank_cores: Callable[[int], set[int]] | None = None) -> list[dict[str, Any]]:
    """Start the mode's peers, wait (bounded), return their results; every process reaped.

    ``world`` overrides the number of peers; ``rank_options(rank)`` adds worker options per peer;
    ``rank_cores(rank)`` pins a peer (and every process it starts: hivemind's helpers, its p2pd) to
    those CPU cores, as if it were a machine of its own.
    """
    world = world if world is not None else 1 if mode == "compute" else args.peers
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-", dir=args.out))
    master_port = 29512 if net else free_loopback_port()
    procs: list[PeerProcess] = []
    try:
        for rank in range(world):
            argv = ["--mode", mode, "--rank", str(rank),
                    "--world", str(world), "--run-dir", str(run_dir), "--out", str(run_dir / f"result.{rank}.json"),
                    "--host", net.addresses[rank] if net else "127.0.0.1",
                    "--master-addr", net.addresses[0] if net else "127.0.0.1", "--master-port", str(master_port),
                    "--compression", args.diloco_compression if mode.startswith("diloco") else args.grad_compression]
            for opt in WORKER_OPTS:
                argv += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
            if rank_options is not None:
                argv += rank_options(rank)
            env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=net.interfaces[rank] if net else "lo",
                       PYTHONPATH=str(Path(__file__).resolve().parent.parent))
            log = run_dir / f"worker.{rank}.log"
            cores = rank_cores(rank) if rank_cores is not None else None
            procs.append(start_peer("benchmarks.worker", argv, env, log, fork=args.fork_workers, cores=cores,
                                    prefix=net.exec_prefix(rank) if net else ()))
        wait_for_peers(procs, args.mode_timeout, mode, lambda rank: run_dir / f"worker.{rank}.log")
        return [json.loads((run_dir / f"result.{rank}.json").read_text()) for rank in range(world)]
    finally:
        for proc in procs:
            kill_group(proc)


def estimated_bytes(mode: str, results: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """All peers' sent bytes, from tensor sizes (butterfly all-reduce and gloo's ring both send
    2(n-1)/n of the payload per peer per round). Used on loopback, where nothing counts packets."""
    n = len(results)
    if n < 2:
        return 0
    params, share = results[0]["params"], 2 * (n - 1) / n
    if mode == "ddp":
        steps = results[0]["sequences"] * n // args.global_batch
        return int(n * steps * share * params * 4)
    if mode == "hivemind":  # defaults: fp32 gradients + fp32 parameter averaging every epoch
        return int(sum(r["epoch"] for r in results) * 2 * share * params * 4)
    counted = sum(r["swarm_bytes_sent"] for r in results)  # SwarmStats: the rounds that succeeded
    if mode == "p2p_grad":  # plus the drift-repair parameter rounds every 16 epochs
        counted += int(n * (results[0]["epoch"] // 16) * share * wire_bytes(params, "none"))
    return counted


def run_suite(args: argparse.Namespace, modes: tuple[str, ...], net: ShapedNet | None) -> list[dict[str, Any]]:
    rows = []
    for mode in modes:
        started = time.monotonic()
        print(f"[bench] {mode}{' (shaped ' + net.rate + ')' if net else ''} ...", flush=True)
        before = net.tx_bytes() if net else 0
        try:
            results = run_mode(args, mode, net)
        except (RuntimeError, OSError, ValueError) as exc:
            print(f"[bench] {mode} FAILED: {exc}", flush=True)
            continue
        sent = net.tx_bytes() - before if net else estimated_bytes(mode, results, args)
        rows.append(summarize(mode, results, sent))
        print(f"[bench] {mode}: {rows[-1]['seq_per_s']:.1f} seq/s, val {rows[-1]['final_val_loss']:.3f} "
              f"({time.monotonic() - started:.0f}s)", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.swarm", description=__doc__.splitlines()[0])
    p.add_argument("--peers", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("reports/benchmarks"))
    p.add_argument("--modes", default=",".join(ALL_MODES))
    p.add_argument("--shaped-modes", default=",".join(SHAPED_MODES), help="'' skips the shaped-link run")
    p.add_argument("--rate", default="20mbit", help="tbf rate of each peer's link in the shaped run")
    p.add_argument("--sequences", type=int, default=1600, help="sequences each peer trains on")
    p.add_argument("--eval-every", type=int, default=200, help="validation every this many sequences per peer")
    p.add_argument("--max-train-seconds", type=float, default=120.0,
                   help="a peer stops after this much training time even if --sequences is not reached")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--inner-steps", type=int, default=25, help="DiLoCo H: inner steps per round")
    p.add_argument("--inner-batch", type=int, default=32,
                   help="DiLoCo: sequences per inner step (micro-batches accumulated; 0: 4 micro-batches)")
    p.add_argument("--peer-checks", choices=("on", "off"), default="on",
                   help="p2ptrain's modes with the node's peer checks (its default) or plain hivemind")
    p.add_argument("--grad-compression", default="fp16", choices=("none", "fp16", "8bit"))
    p.add_argument("--diloco-compression", default="8bit", choices=("none", "fp16", "8bit"))
    add_outer_step_options(p)
    add_fork_option(p)
    p.add_argument("--matchmaking-time", type=float, default=0.5,
                   help="seconds; a round lasts about this long (0.5 suits loopback and the shaped LAN)")
    p.add_argument("--averaging-timeout", type=float, default=30.0)
    p.add_argument("--target-loss", type=float, default=None,
                   help="default: 1.05 x DDP's final validation loss on loopback")
    p.add_argument("--mode-timeout", type=float, default=420.0, help="seconds before a mode's peers are killed")
    p.add_argument("--overhead-repeats", type=int, default=2,
                   help="daemon-overhead runs of each variant (benchmarks.overhead); 0 skips that part")
    p.add_argument("--overhead-seconds", type=float, default=25.0, help="measurement window of each overhead run")
    p.add_argument("--overhead-warmup", type=float, default=5.0,
                   help="seconds each overhead run trains before its window opens")
    args = p.parse_args(argv)
    if args.peers < 1 or args.global_batch % (args.micro_batch * args.peers) or args.sequences % args.micro_batch:
        p.error("--global-batch must be a multiple of micro-batch x peers, --sequences of micro-batch")
    return args


def run_overhead(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any], argparse.Namespace]:
    """The daemon-overhead part (see :mod:`benchmarks.overhead`) with this run's model; ([], {}) if skipped."""
    if args.overhead_repeats < 1:
        return [], {}, args
    opts = overhead.parse_args([
        "--peers", str(args.peers), "--out", str(args.out), "--repeats", str(args.overhead_repeats),
        "--measure", str(args.overhead_seconds), "--warmup", str(args.overhead_warmup),
        "--micro-batch", str(args.micro_batch),
        "--global-batch", str(args.global_batch), "--d-model", str(args.d_model), "--n-layers", str(args.n_layers),
        "--n-heads", str(args.n_heads), *(["--fork-workers"] if args.fork_workers else [])])
    try:
        runs, summary = overhead.measure(opts)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"[bench] daemon overhead FAILED: {exc}", flush=True)
        return [], {}, opts
    return runs, summary, opts


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: peers killed, namespaces deleted


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    modes = tuple(m for m in args.modes.split(",") if m)
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        print(f"error: --modes: unknown mode(s) {bad}; choose from {','.join(ALL_MODES)}", file=sys.stderr)
        return 2
    rows = run_suite(args, modes, None)
    ddp = next((r for r in rows if r["mode"] == "ddp"), None)
    target = args.target_loss or (1.05 * ddp["final_val_loss"] if ddp else None)
    add_ratios(rows, args.peers, target)
    shaped_rows: list[dict[str, Any]] = []
    shaped_modes = tuple(m for m in args.shaped_modes.split(",") if m)
    skipped = None
    if shaped_modes and args.peers >= 2:
        skipped = netns_unavailable()
        if skipped is None:
            with shaped_network(args.peers, args.rate) as net:
                shaped_rows = run_suite(args, shaped_modes, net)
            # Ideal is the same compute on the same cores: take it from the loopback run.
            compute = [r for r in rows if r["mode"] == "compute"]
            add_ratios(compute + shaped_rows, args.peers, target)
        else:
            print(f"[bench] shaped-link run skipped: {skipped}", flush=True)
    overhead_runs, overhead_summary, overhead_args = run_overhead(args)
    report = {"command": " ".join(["python -m benchmarks.swarm", *(argv if argv is not None else sys.argv[1:])]),
              "args": {k: str(v) for k, v in vars(args).items()}, "target_val_loss": target,
              "loopback": rows, "shaped": shaped_rows, "shaped_skipped": skipped,
              "overhead": {"runs": overhead_runs, **overhead_summary},
              "seconds": time.monotonic() - began}
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    checks = f"p2ptrain's peer checks {args.peer_checks}"
    tables = [markdown_table(rows, f"{args.peers} peers on 127.0.0.1 ({checks})")]
    if shaped_rows:
        tables.append(markdown_table(shaped_rows,
                                     f"{args.peers} peers, each link shaped to {args.rate} (tbf; {checks})"))
    if overhead_runs:
        tables.append(overhead.markdown(overhead_runs, overhead_summary, overhead_args).rstrip())
    text = "\n\n".join(tables) + f"\n\nTarget validation loss: {target if target is None else round(target, 3)}; " \
        f"wall time {report['seconds']:.0f}s.\n"
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
