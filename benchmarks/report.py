"""Turns the workers' JSON results into the benchmark's per-mode numbers and its markdown table."""

from __future__ import annotations

import math
from typing import Any

LABELS = {
    "compute": "compute only (ideal = x peers)",
    "ddp": "torch DDP, gloo",
    "hivemind": "plain hivemind.Optimizer (defaults)",
    "p2p_grad": "p2ptrain gradient mode",
    "diloco": "p2ptrain DiLoCo",
    "diloco_int8": "p2ptrain DiLoCo, int8 pseudo-gradients + error feedback",
    "diloco_topk": "p2ptrain DiLoCo, top-k pseudo-gradients + error feedback",
    "diloco_topk_sync": "p2ptrain DiLoCo, top-k, outer step waiting for its round (overlap off)",
}


def seqs_at(timeline: list[list[float]], t: float) -> float:
    """Sequences a peer had finished at train time ``t`` (linear between recorded points)."""
    prev_t, prev_s = 0.0, 0.0
    for when, seqs in timeline:
        if when >= t:
            span = when - prev_t
            return prev_s + (seqs - prev_s) * ((t - prev_t) / span if span > 0 else 1.0)
        prev_t, prev_s = when, seqs
    return prev_s


def time_to_loss(curve: list[list[float]], target: float) -> float | None:
    """First train time at which the validation loss is <= ``target`` (interpolated), None if never."""
    prev: list[float] | None = None
    for point in curve:
        when, _, loss = point
        if loss <= target:
            if prev is None or prev[2] == loss:
                return when
            frac = (prev[2] - target) / (prev[2] - loss)
            return prev[0] + frac * (when - prev[0])
        prev = point
    return None


def summarize(mode: str, results: list[dict[str, Any]], bytes_sent: int) -> dict[str, Any]:
    """Throughput while every peer trains (until the first one finishes), loss, bytes per sequence."""
    first_done = min(r["train_seconds"] for r in results)
    total = sum(seqs_at(r["timeline"], first_done) for r in results)
    sequences = sum(r["sequences"] for r in results)
    rank0 = min(results, key=lambda r: r["rank"])
    return {
        "mode": mode, "peers": len(results), "sequences": sequences,
        "seq_per_s": total / first_done if first_done > 0 else math.nan,
        "final_val_loss": sum(r["final_val_loss"] for r in results) / len(results),
        "bytes_sent": bytes_sent, "bytes_per_seq": bytes_sent / sequences if sequences else math.nan,
        "curve": rank0["curve"], "epochs": rank0["epoch"],
        # Seconds a peer spent blocked (not computing) per optimizer epoch / outer round.
        "stall_per_epoch_s": (sum(r.get("stall_seconds", 0.0) for r in results) / len(results)
                              / rank0["epoch"] if rank0["epoch"] else math.nan),
        "rounds_ok": sum(r["rounds_ok"] for r in results), "rounds_failed": sum(r["rounds_failed"] for r in results),
        "rounds_partial": sum(r.get("rounds_partial", 0) for r in results),
        "short": any(r["sequences"] < r.get("target_sequences", r["sequences"]) for r in results),
    }


def add_ratios(rows: list[dict[str, Any]], peers: int, target: float | None) -> None:
    by_mode = {row["mode"]: row for row in rows}
    ideal = by_mode["compute"]["seq_per_s"] * peers if "compute" in by_mode else math.nan
    ddp = by_mode["ddp"]["seq_per_s"] if "ddp" in by_mode else math.nan
    for row in rows:
        row["vs_ideal"] = row["seq_per_s"] / ideal if ideal == ideal else math.nan
        row["vs_ddp"] = row["seq_per_s"] / ddp if ddp == ddp else math.nan
        row["time_to_target_s"] = time_to_loss(row["curve"], target) if target is not None else None


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def markdown_table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [f"### {title}", "",
             "| mode | seq/s | vs DDP | vs ideal | bytes/seq | val loss | time to target (s) "
             "| rounds full/partial/failed | stall/epoch (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        label = LABELS.get(row["mode"], row["mode"])
        if row["mode"] == "compute":
            label += f" [{row['sequences']} seqs, 1 process]"
        elif row.get("short"):
            label += f" [stopped at {row['sequences']} seqs: time cap]"
        lines.append(
            f"| {label} | {_fmt(row['seq_per_s'], '.1f')} | {_fmt(row['vs_ddp'], '.2f')} | "
            f"{_fmt(row['vs_ideal'], '.2f')} | {_fmt(row['bytes_per_seq'], ',.0f')} | "
            f"{_fmt(row['final_val_loss'], '.3f')} | {_fmt(row['time_to_target_s'], '.1f')} | "
            f"{row['rounds_ok']}/{row.get('rounds_partial', 0)}/{row['rounds_failed']} | "
            f"{_fmt(row.get('stall_per_epoch_s'), '.2f')} |")
    return "\n".join(lines)
