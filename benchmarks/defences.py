"""What the peer checks cost: the same swarm of real node loops with ``swarm.peer_checks`` on and off.

``python -m benchmarks.defences --peers 2`` runs, in each mode (gradient, then DiLoCo), the same
small swarm of node loops on 127.0.0.1 (:mod:`benchmarks.node_peer`, with the service hooks that
``p2ptrain run`` uses) alternately with the peer checks on and off, ``--repeats`` times each (on,
off, on, off, ...), so slow drift of a shared machine hits both variants alike.  Checks on is the
shipped node: hardened averagers (per-sender screening, CenteredClip, result checks), validated
state downloads, identity-bound progress and the peer gate.  Checks off is plain hivemind, trusting
every peer.  Gradient mode is paced as in :mod:`benchmarks.swarm` (an epoch every
``--global-batch`` = 128 sequences); DiLoCo takes its 32-sequence inner steps but rounds of
``--inner-steps`` = 10 of them instead of 25, so that a round or two, and what the checks do in
it, land in every window.  Reports samples/s per run, the rounds that ended in its window, the
mean of each variant and the cost (1 - on / off) per mode; writes ``defences.json`` and
``defences.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.overhead import add_swarm_args, node_overrides, run_swarm

MODES = ("gradient", "diloco")
#: The node loops run as ``p2ptrain run`` does (API, signed peer records), in both variants.
HOOKS = "service"


def run_once(args: argparse.Namespace, mode: str, checks: bool, index: int) -> dict[str, Any]:
    """One swarm of ``--peers`` node loops in ``mode`` with the peer checks on or off."""
    variant = "on" if checks else "off"
    run_dir = Path(tempfile.mkdtemp(prefix=f"defences-{mode}-{index}-{variant}-", dir=args.out))
    opts = argparse.Namespace(**{**vars(args), "mode": mode})
    results = run_swarm(opts, HOOKS, run_dir, node_overrides(opts, peer_checks=checks))
    wrong = [r["rank"] for r in results if r.get("peer_checks") is not checks]
    if wrong:  # a figure of the wrong variant would be worse than none
        raise RuntimeError(f"{run_dir.name}: peers {wrong} ran with the peer checks {'off' if checks else 'on'}")
    durations = [r["round_seconds"] for r in results if r.get("round_seconds") is not None]
    return {"mode": mode, "checks": variant, "run": index, "seq_per_s": sum(r["seq_per_s"] for r in results),
            "per_peer": [round(r["seq_per_s"], 2) for r in results],
            # Every peer sees the same rounds; the first peer's count stands for the swarm's.
            "rounds": results[0]["rounds"], "round_seconds": mean(durations) if durations else None,
            "offences": sum(r["offences"] for r in results)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: mean samples/s with the checks on and off, on / off, the cost 1 - on / off, and each
    repeat's own on / off (how far single pairs spread)."""
    summary: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        on = [r for r in runs if r["mode"] == mode and r["checks"] == "on"]
        off = [r for r in runs if r["mode"] == mode and r["checks"] == "off"]
        if not on or not off:
            raise ValueError(f"{mode}: runs of both variants are needed, got {len(on)} on and {len(off)} off")
        on_rate, off_rate = mean(r["seq_per_s"] for r in on), mean(r["seq_per_s"] for r in off)
        if off_rate <= 0:
            raise RuntimeError(f"{mode}: the runs with the checks off trained nothing in their windows")
        pairs = [a["seq_per_s"] / b["seq_per_s"] for a, b in zip(on, off, strict=False) if b["seq_per_s"] > 0]
        summary[mode] = {"on_seq_per_s": on_rate, "off_seq_per_s": off_rate, "on_vs_off": on_rate / off_rate,
                         "cost": 1.0 - on_rate / off_rate, "pair_ratios": pairs}
    return summary


def markdown(runs: list[dict[str, Any]], summary: dict[str, dict[str, Any]], args: argparse.Namespace,
             seconds: float) -> str:
    lines = [f"### Peer checks on vs off: {args.peers} peers, {args.measure:g} s windows, "
             f"{HOOKS} hooks ({seconds:.0f} s in all)", "",
             "| mode | run | checks | seq/s (all peers) | per peer | rounds full/partial/failed | round (s) "
             "| offences |", "|---|---:|---|---:|---|---:|---:|---:|"]
    for r in runs:
        duration = "-" if r["round_seconds"] is None else f"{r['round_seconds']:.2f}"
        lines.append(f"| {r['mode']} | {r['run']} | {r['checks']} | {r['seq_per_s']:.1f} | {r['per_peer']} | "
                     f"{'/'.join(map(str, r['rounds']))} | {duration} | {r['offences']} |")
    lines += ["", "| mode | checks on (seq/s) | checks off (seq/s) | on / off | cost | single pairs on / off |",
              "|---|---:|---:|---:|---:|---|"]
    for mode, s in summary.items():
        pairs = ", ".join(f"{ratio:.3f}" for ratio in s["pair_ratios"])
        lines.append(f"| {mode} | {s['on_seq_per_s']:.1f} | {s['off_seq_per_s']:.1f} | {s['on_vs_off']:.3f} | "
                     f"{100 * s['cost']:+.1f}% | {pairs} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.defences", description=__doc__.splitlines()[0])
    # DiLoCo: inner steps of 32 sequences as in benchmarks.swarm, but rounds of 10 of them (not 25):
    # at about 20 sequences/s per peer a round then ends in every 25 s window, at 25 most hold none.
    add_swarm_args(p, inner_steps=10, inner_batch=32)
    p.set_defaults(warmup=5.0, measure=25.0)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ",".join(MODES))
    args = p.parse_args(argv)
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: choose from {','.join(MODES)}")
    if args.peers < 2 or args.repeats < 1 or args.measure <= 0 or args.warmup < 0:
        p.error("--peers must be >= 2 (the checks judge other peers), --repeats >= 1, --measure > 0, --warmup >= 0")
    return args


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run, mode after mode, alternating on and off; raises RuntimeError naming the run that failed."""
    runs = []
    for mode in args.modes:
        for index in range(args.repeats):
            for checks in (True, False):
                print(f"[defences] {mode} run {index}: checks {'on' if checks else 'off'} ...", flush=True)
                runs.append(run_once(args, mode, checks, index))
                print(f"[defences] {mode} run {index}: {runs[-1]['seq_per_s']:.1f} seq/s", flush=True)
    return runs


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: peers killed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        runs = measure(args)
        summary = summarize(runs)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"[defences] FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    seconds = time.monotonic() - began
    command = " ".join(["python -m benchmarks.defences", *(argv if argv is not None else sys.argv[1:])])
    (args.out / "defences.json").write_text(json.dumps(
        {"command": command, "seconds": round(seconds, 1), "runs": runs, "modes": summary}, indent=1))
    text = markdown(runs, summary, args, seconds)
    (args.out / "defences.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
