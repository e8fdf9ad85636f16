"""Heterogeneous peers: a fast peer alone, next to an equal peer, and next to a peer held to a share of a core.

``python -m benchmarks.hetero`` runs, for each mode (DiLoCo and gradient averaging), ``--repeats``
pairs of swarms, the fast peer alone (A) and the fast peer with a slow one (M, mixed: the slow peer
held to ``--slow-percent`` of one core, enforced the way a volunteer's node enforces
``volunteer.max_cpu_percent``), in ABBA order (A M M A A M ...) so that a shared machine's drift hits
both alike, and the swarm of two equal peers once.  Never more than two trainers run at once; seeds
are fixed (the same initial model and the same data order for the fast peer in every swarm).  The
peers run what a node runs by default, the peer checks included (``--peer-checks off``: plain
hivemind).

Every peer validates the swarm's model each time it changes (each landed round; in gradient mode
each epoch, at most every ``--eval-min-gap`` s), off its training clock.  "The swarm learns at
least as fast per wall-clock second as the fast peer alone" is measured as time to the same loss:
L* is the median over the alone runs of the loss alone reaches at ``LOSS_POINT`` x the window;
each run's time to L* is interpolated (in log loss) between the validations around it (a mixed
swarm: the later of its two peers); r = t_mixed / t_alone per ABBA pair.  eps is the spread of the
alone runs' own times to L* (at least ``MIN_EPS``): a verdict is "pass" when the median r is at
most 1 and the worst at most 1 + eps, "FAIL" when the median is above 1 + eps, and "not shown
(within noise)" otherwise.  The loss ratio at ``LOSS_POINT`` x the window is reported beside it.
The other targets are figures per mixed run, judged the same way (pass when every run meets the
target, FAIL when the median misses it, else not shown).  Writes ``hetero.json`` and ``hetero.md``
under ``--out``, prints the table, and exits 1 when a target FAILs (``--report-only``: 0).

The peers share the machine's cores.  ``--pin-cores`` gives each peer, its helper processes with
it, a core of its own (the fast peer the same one, alone or not): a one-core machine per peer, so
the slow peer takes no CPU from the fast one, while the fast peer's own averaging work does.

With the defaults (40 s windows, 3 pairs, both modes: 14 swarms) it takes about 13 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers import add_fork_option
from benchmarks.swarm import run_mode
from benchmarks.worker import add_outer_step_options

#: Targets, each checked per mode: the fast peer keeps 90% of its rate next to an equal peer, the
#: slow peer's samples are in 90% of the rounds, the two models' validation losses stay within 2% of
#: each other, and the mixed swarm reaches alone's loss no later than the fast peer alone does.
TARGETS: dict[str, tuple[str, float]] = {"fast_vs_equal": (">=", 0.90), "slow_rounds_share": (">=", 0.90),
                                         "val_spread": ("<=", 0.02), "time_to_loss_vs_alone": ("<=", 1.0)}
#: Where on the window L* is read off the alone runs' curves (late enough to be past the first rounds,
#: early enough that a somewhat slower swarm still reaches it inside the window).
LOSS_POINT = 0.6
#: The least noise allowance of the loss-speed verdict, whatever the alone runs' spread.
MIN_EPS = 0.03
PASS, FAIL, NOT_SHOWN = "pass", "FAIL", "not shown (within noise)"

Curve = Sequence[Sequence[float]]  # (train seconds, sequences, validation loss) points, in time order


# ------------------------------------------------------------------ the arithmetic (pure)

def schedule(repeats: int) -> list[str]:
    """The order of the swarms: ABBA pairs of alone (A) and mixed (M) runs, then the equal swarm."""
    order: list[str] = []
    for pair in range(repeats):
        order += ["alone", "mixed"] if pair % 2 == 0 else ["mixed", "alone"]
    return [*order, "equal"]


def loss_at(curve: Curve, seconds: float) -> float:
    """The curve's loss at ``seconds`` of training, log-linear between its points (held after the last)."""
    points = [(float(p[0]), float(p[2])) for p in curve]
    if not points or not all(math.isfinite(loss) and loss > 0 for _, loss in points):
        return math.nan
    if seconds <= points[0][0]:
        return points[0][1]
    for (t0, l0), (t1, l1) in zip(points, points[1:], strict=False):
        if t0 <= seconds <= t1:
            share = (seconds - t0) / (t1 - t0) if t1 > t0 else 1.0
            return math.exp(math.log(l0) + share * (math.log(l1) - math.log(l0)))
    return points[-1][1]


def time_to(curve: Curve, target: float) -> float:
    """Training seconds until the curve first reaches ``target`` (log-linear between points); inf if never."""
    points = [(float(p[0]), float(p[2])) for p in curve]
    if not points or not math.isfinite(target) or target <= 0:
        return math.nan
    if points[0][1] <= target:
        return points[0][0]
    for (t0, l0), (t1, l1) in zip(points, points[1:], strict=False):
        if l1 <= target:
            if not l0 > l1 > 0:
                return t1
            share = (math.log(target) - math.log(l0)) / (math.log(l1) - math.log(l0))
            return t0 + share * (t1 - t0)
    return math.inf


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of ``values``; 0 for fewer than two."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return 0.0
    middle = statistics.median(finite)
    return (max(finite) - min(finite)) / middle if middle > 0 else math.inf


def loss_speed(alone: Sequence[Curve], mixed: Sequence[tuple[Curve, Curve]], seconds: float) -> dict[str, Any]:
    """Time to the same loss, per ABBA pair: ``alone[i]`` with ``mixed[i]`` (fast peer's curve, slow peer's).

    Returns L*, each alone run's time to it, the ratios r = t_mixed / t_alone, eps, and the loss
    ratios (the mixed swarm's worse model over alone's) at ``LOSS_POINT`` x ``seconds``.
    """
    point = LOSS_POINT * seconds
    target = statistics.median([loss_at(c, point) for c in alone]) if alone else math.nan
    t_alone = [time_to(c, target) for c in alone]
    t_mixed = [max(time_to(fast, target), time_to(slow, target)) for fast, slow in mixed]
    ratios = [m / a if a > 0 else math.nan for a, m in zip(t_alone, t_mixed, strict=False)]
    losses = [max(loss_at(fast, point), loss_at(slow, point)) / loss_at(a, point)
              for a, (fast, slow) in zip(alone, mixed, strict=False)]
    return {"target_loss": target, "at_seconds": point, "t_alone": t_alone, "t_mixed": t_mixed,
            "ratios": ratios, "eps": max(MIN_EPS, spread(t_alone)), "loss_ratios": losses}


def verdict(values: Sequence[float], relation: str, bound: float, eps: float = 0.0) -> str:
    """pass: the median and the worst value meet the bound (the worst within ``eps`` of it, relative);
    FAIL: the median misses it by more than eps (or nothing could be measured); else not shown."""
    if not values or any(math.isnan(v) for v in values):
        return FAIL
    middle = statistics.median(values)
    if relation == "<=":
        worst, slack, meets = max(values), bound * (1 + eps), lambda v: v <= bound
        if middle > slack:
            return FAIL
        return PASS if meets(middle) and worst <= slack else NOT_SHOWN
    worst, slack = min(values), bound * (1 - eps)
    if middle < slack:
        return FAIL
    return PASS if middle >= bound and worst >= slack else NOT_SHOWN


# ------------------------------------------------------------------ from the runs to the figures

def _rate(result: dict[str, Any]) -> float:
    return result["sequences"] / result["train_seconds"] if result["train_seconds"] > 0 else math.nan


def _rounds(result: dict[str, Any]) -> list[int]:
    return [result["rounds_ok"], result.get("rounds_partial", 0), result["rounds_failed"]]


def _helpers_share(result: dict[str, Any]) -> float:
    """The peer's helper processes' CPU seconds (DHT, averager, p2pd: the averaging work, from their
    start to the end of the window) per second of training: the share of a core they took."""
    return _ratio(result.get("helpers_cpu_seconds", math.nan), result["train_seconds"])


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom and math.isfinite(bottom) else math.nan


def summarize(mode: str, runs: dict[str, list[list[dict[str, Any]]]], seconds: float) -> dict[str, Any]:
    """Every figure of one mode, from its runs: ``runs["alone"]`` and ``runs["mixed"]`` in ABBA pair
    order (``alone[i]`` with ``mixed[i]``; a failed swarm is left out with its pair), ``runs["equal"]``."""
    pairs = [(a[0], m) for a, m in zip(runs["alone"], runs["mixed"], strict=False)]
    equal_rate = statistics.median([_rate(r[0]) for r in runs["equal"]]) if runs["equal"] else math.nan
    speed = loss_speed([a["curve"] for a, _ in pairs], [(m[0]["curve"], m[1]["curve"]) for _, m in pairs], seconds)
    per_mixed = []
    for _, (fast, slow) in pairs:
        rounds_fast = sum(_rounds(fast))
        losses = (fast["final_val_loss"], slow["final_val_loss"])
        per_mixed.append({
            "rounds": {"fast": _rounds(fast), "slow": _rounds(slow)},
            "slow_rounds_share": (slow["rounds_ok"] + slow.get("rounds_partial", 0)) / rounds_fast
            if rounds_fast else math.nan,
            "epochs": [fast["epoch"], slow["epoch"]],
            "val_spread": abs(losses[0] - losses[1]) / min(losses),
        })
    return {
        "mode": mode, "pairs": len(pairs),
        "alone_seq_per_s": [_rate(a) for a, _ in pairs],
        "equal_seq_per_s": [_rate(r) for r in runs["equal"][0]] if runs["equal"] else [],
        "fast_vs_alone": [_ratio(_rate(m[0]), _rate(a)) for a, m in pairs],
        "fast_vs_equal": [_ratio(_rate(m[0]), equal_rate) for _, m in pairs],
        "slow_vs_alone": [_ratio(_rate(m[1]), _rate(a)) for a, m in pairs],
        "helpers_alone": [_helpers_share(a) for a, _ in pairs],
        "helpers_mixed": [_helpers_share(m[0]) for _, m in pairs],
        "rounds": [r["rounds"] for r in per_mixed],
        "slow_rounds_share": [r["slow_rounds_share"] for r in per_mixed],
        "epochs": [r["epochs"] for r in per_mixed],
        "val_spread": [r["val_spread"] for r in per_mixed],
        "time_to_loss_vs_alone": speed["ratios"],
        "loss_vs_alone": speed["loss_ratios"],
        "loss_speed": speed,
        "eps": speed["eps"],
    }


def check_targets(row: dict[str, Any]) -> dict[str, str]:
    """Target name -> pass / FAIL / not shown; eps (the alone runs' noise) only for the loss speed."""
    return {name: verdict(row[name], relation, bound, row["eps"] if name == "time_to_loss_vs_alone" else 0.0)
            for name, (relation, bound) in TARGETS.items()}


def spread_text(values: Sequence[float], fmt: Callable[[float], str] = "{:.2f}".format) -> str:
    """``median [min-max]`` (just the value for one run; ``never`` for a loss not reached)."""
    if not values:
        return "-"

    def one(value: float) -> str:
        return "never" if value == math.inf else fmt(value)

    middle = one(statistics.median(values))
    return middle if len(values) == 1 else f"{middle} [{one(min(values))}-{one(max(values))}]"


def targets_line(row: dict[str, Any]) -> str:
    """``diloco: fast_vs_equal 0.93 [0.91-0.95] >= 0.9 pass, ...`` for one mode."""
    met = check_targets(row)
    return f"{row['mode']}: " + ", ".join(
        f"{name} {spread_text(row[name], '{:.3f}'.format)} {relation} {bound:g}"
        f"{' (eps ' + format(row['eps'], '.1%') + ')' if name == 'time_to_loss_vs_alone' else ''} {met[name]}"
        for name, (relation, bound) in TARGETS.items())


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    pct = "{:.1%}".format
    lines = [f"### Heterogeneous peers: one peer at {args.slow_percent:g}% of a core, {args.seconds:.0f} s windows, "
             f"{args.repeats} ABBA pair(s) per mode, peer checks {args.peer_checks}, "
             f"{'a core per peer' if args.pin_cores else 'peers sharing every core'}", "",
             "Figures: median [min-max] over the pairs (one value: one pair).", "",
             "| mode | fast vs alone | fast next to slow vs next to equal | slow vs alone | rounds fast "
             "(full/partial/failed) | rounds slow | slow's share of rounds | val loss spread | L* | time to L* "
             "mixed / alone | loss mixed / alone at L*'s time | eps | fast peer's helpers' CPU alone / mixed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        rounds = "; ".join("/".join(map(str, r["fast"])) for r in row["rounds"]) or "-"
        rounds_slow = "; ".join("/".join(map(str, r["slow"])) for r in row["rounds"]) or "-"
        lines.append(
            f"| {row['mode']} | {spread_text(row['fast_vs_alone'])} | {spread_text(row['fast_vs_equal'])} "
            f"| {spread_text(row['slow_vs_alone'])} | {rounds} | {rounds_slow} "
            f"| {spread_text(row['slow_rounds_share'])} | {spread_text(row['val_spread'], pct)} "
            f"| {row['loss_speed']['target_loss']:.3f} | {spread_text(row['time_to_loss_vs_alone'], '{:.3f}'.format)} "
            f"| {spread_text(row['loss_vs_alone'], '{:.3f}'.format)} | {row['eps']:.1%} "
            f"| {spread_text(row['helpers_alone'], pct)} / {spread_text(row['helpers_mixed'], pct)} |")
    lines += ["", "Targets (pass: median and worst meet it, the loss speed's worst within eps; FAIL: the median "
              "misses it; otherwise not shown):", ""] + [f"- {targets_line(row)}" for row in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ running it

def peer_cores(pin: bool, available: set[int]) -> Callable[[int], set[int]] | None:
    """With ``pin`` and two cores or more: peer ``rank`` runs on a core of its own (the fast peer on
    the same one whether it is alone or not), as on machines of their own.  Unpinned, the slow
    peer and both peers' helper processes take CPU from the fast peer's trainer too."""
    cores = sorted(available)
    if not pin or len(cores) < 2:
        return None
    return lambda rank: {cores[rank % len(cores)]}


def run_swarm(args: argparse.Namespace, mode: str, swarm: str) -> list[dict[str, Any]]:
    world = 1 if swarm == "alone" else 2

    def options(rank: int) -> list[str]:
        slow = swarm == "mixed" and rank == 1
        return ["--cpu-percent", str(args.slow_percent if slow else 0.0), "--eval-on-change",
                "--eval-min-gap", str(args.eval_min_gap)]

    return run_mode(args, mode, None, world=world, rank_options=options,
                    rank_cores=peer_cores(args.pin_cores, os.sched_getaffinity(0)))


def run_mode_swarms(args: argparse.Namespace, mode: str) -> dict[str, list[list[dict[str, Any]]]]:
    """Every swarm of one mode in :func:`schedule` order; a swarm that fails drops its ABBA pair."""
    runs: dict[str, list[list[dict[str, Any]] | None]] = {"alone": [], "mixed": [], "equal": []}
    for index, swarm in enumerate(schedule(args.repeats)):
        print(f"[hetero] {mode}: {swarm} ({index + 1} of {2 * args.repeats + 1}) ...", flush=True)
        try:
            runs[swarm].append(run_swarm(args, mode, swarm))
        except (RuntimeError, OSError, ValueError) as exc:
            print(f"[hetero] {mode}: {swarm} FAILED: {exc}", flush=True)
            runs[swarm].append(None)
    kept = [(a, m) for a, m in zip(runs["alone"], runs["mixed"], strict=True) if a is not None and m is not None]
    return {"alone": [a for a, _ in kept], "mixed": [m for _, m in kept],
            "equal": [r for r in runs["equal"] if r is not None]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hetero", description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="diloco,p2p_grad")
    p.add_argument("--out", type=Path, default=Path("reports/benchmarks"))
    p.add_argument("--seconds", type=float, default=40.0, help="wall-clock training time of every peer")
    p.add_argument("--repeats", type=int, default=3, help="ABBA pairs of alone and mixed swarms per mode")
    p.add_argument("--slow-percent", type=float, default=25.0, help="the slow peer's share of one core")
    p.add_argument("--peer-checks", choices=("on", "off"), default="on",
                   help="the node's peer checks (its default) or plain hivemind")
    p.add_argument("--report-only", action="store_true", help="exit 0 even when a target FAILs")
    p.add_argument("--pin-cores", action="store_true",
                   help="give each peer and its helper processes a core of its own, like a one-core machine "
                        "(default: the peers share every core)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=1024,
                   help="gradient mode: sequences per epoch (an epoch of at least 5x the all-reduce time, "
                        "as the tuning guidance in docs/benchmarks.md asks)")
    p.add_argument("--inner-steps", type=int, default=25, help="DiLoCo: inner steps per round of the fastest peer")
    p.add_argument("--inner-batch", type=int, default=32, help="DiLoCo: sequences per inner step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--eval-min-gap", type=float, default=2.0,
                   help="seconds of training between two validations of a peer (gradient mode's epochs are short)")
    p.add_argument("--matchmaking-time", type=float, default=0.5)
    p.add_argument("--averaging-timeout", type=float, default=15.0)
    p.add_argument("--mode-timeout", type=float, default=0.0, help="per swarm (default: --seconds + 90)")
    p.add_argument("--grad-compression", default="fp16")
    p.add_argument("--diloco-compression", default="fp16")
    add_outer_step_options(p)
    add_fork_option(p)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.seconds <= 0:
        p.error("--repeats must be at least 1 and --seconds positive")
    args.sequences, args.max_train_seconds = 10**9, args.seconds
    args.eval_every = 10**9  # the workers validate on each change of the swarm's model instead
    args.mode_timeout = args.mode_timeout or args.seconds + 90
    args.peers = 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows, raw = [], {}
    for mode in [m for m in args.modes.split(",") if m]:
        raw[mode] = run_mode_swarms(args, mode)
        rows.append(summarize(mode, raw[mode], args.seconds))
        rows[-1]["targets"] = check_targets(rows[-1])
    (args.out / "hetero.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                      "rows": rows, "runs": raw}, indent=1) + "\n")
    table = markdown(rows, args)
    (args.out / "hetero.md").write_text(table + "\n")
    print(table)
    failed = [f"{row['mode']}.{name}" for row in rows for name, said in row["targets"].items() if said == FAIL]
    unshown = [f"{row['mode']}.{name}" for row in rows for name, said in row["targets"].items() if said == NOT_SHOWN]
    print(f"\ntargets: {'FAILED ' + ', '.join(failed) if failed else 'none failed'}"
          f"{'; not shown (within noise): ' + ', '.join(unshown) if unshown else ''}; "
          f"wall time {time.monotonic() - started:.0f}s", flush=True)
    return 1 if failed and not args.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
