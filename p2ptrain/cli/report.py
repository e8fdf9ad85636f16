"""``p2ptrain report``: a running node's summary of the run, as text (a loss chart, the contributors,
the data coverage) or as the same in JSON (``--json FILE``).

It asks the local node's API (found like ``p2ptrain top`` finds it) for its status and swarm
view, once.  Standard library only, so it starts at once.  The loss curve is the node's own since it
started; contributions and coverage are what its peers' records say, each claim bounded by the
node (see :mod:`p2ptrain.trust.swarm_credit`).  Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2ptrain.atomicfile import write_atomic
from p2ptrain.client.discovery import DiscoveryError, TokenUnavailable, discover_node, read_token
from p2ptrain.client.http import NodeClient, NodeError, NodeUnreachable
from p2ptrain.errors import EX_FAILURE, EX_NOINPUT, EX_OK, EX_UNAVAILABLE
from p2ptrain.status import StatusSnapshot, SwarmView

CHART_WIDTH, CHART_HEIGHT = 56, 8
REPORT_FORMAT = "p2ptrain-report"


def _fail(message: str, code: int) -> int:
    print(f"p2ptrain report: {message}", file=sys.stderr)
    return code


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    for size, unit, small, small_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if s >= size:
            return f"{s // size}{unit} {(s % size) // small:02d}{small_unit}"
    return f"{s}s"


def _short(peer_id: str) -> str:
    return f"…{peer_id[-8:]}" if len(peer_id) > 9 else (peer_id or "—")


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _share(part: int, total: int) -> float | None:
    return part / total if total > 0 else None


def _percent(part: int, total: int) -> str:
    """Rounded; a small share is never 0%, a share short of all never 100%."""
    if total <= 0:
        return "—"
    value = round(100 * part / total)
    return f"{min(max(value, 1), 99) if 0 < part < total else value}%"


def build_report(status: StatusSnapshot, view: SwarmView, url: str) -> dict[str, Any]:
    """The report as plain data (what ``--json`` writes and the text is made from)."""
    total = view.samples_contributed
    contributors = [
        {"peer_id": p.peer_id, "samples_contributed": p.samples_contributed,
         "share": _share(p.samples_contributed, total), "uptime_seconds": p.uptime_seconds, "state": p.state,
         "epoch": p.epoch, "this_node": p.peer_id == status.peer_id}
        for p in sorted(view.peers, key=lambda p: (-p.samples_contributed, p.peer_id))]
    return {
        "format": REPORT_FORMAT,
        "node": {"url": url, "peer_id": status.peer_id, "state": status.state, "version": status.version,
                 "run_id": status.run_id, "run_ref": status.run_ref, "model_fingerprint": status.model_fingerprint,
                 "epoch": status.local_epoch, "swarm_epoch": status.global_epoch, "peers_online": view.peers_online,
                 "uptime_seconds": status.uptime_seconds, "taken_at": status.taken_at},
        "loss": {"epochs": list(status.loss_history_epochs), "training": list(status.loss_history),
                 "validation_epochs": list(status.val_loss_history_epochs),
                 "validation": list(status.val_loss_history), "latest": _finite(status.loss),
                 "latest_validation": _finite(status.val_loss)},
        "credit": {"samples_contributed": status.samples_contributed_total,
                   "samples_not_averaged": status.samples_not_averaged_total,
                   "samples_processed": status.samples_processed_total, "swarm_samples_contributed": total,
                   "contributors": sum(1 for p in view.peers if p.samples_contributed > 0)},
        "contributors": contributors,
        "coverage": {"swarm_pass": view.data_pass, "shards_total": view.shards_total,
                     "swarm_coverage": _finite(view.data_coverage),
                     "swarm_last_pass_coverage": _finite(view.data_last_pass_coverage),
                     "node_pass": status.data_pass, "node_shards_consumed": status.data_shards_consumed,
                     "node_past_pass_shards": list(status.data_past_pass_shards)},
    }


def loss_chart(epochs: Sequence[int], losses: Sequence[float], val_epochs: Sequence[int] = (),
               val_losses: Sequence[float] = (), width: int = CHART_WIDTH, height: int = CHART_HEIGHT) -> list[str]:
    """A small terminal chart: training loss as ``•``, validation loss as ``o``, epochs along the bottom."""
    points = [(e, v, "•") for e, v in zip(epochs, losses, strict=False) if math.isfinite(v)]
    points += [(e, v, "o") for e, v in zip(val_epochs, val_losses, strict=False) if math.isfinite(v)]
    if not points:
        return ["(no loss recorded yet)"]
    first, last = min(p[0] for p in points), max(p[0] for p in points)
    low, high = min(p[1] for p in points), max(p[1] for p in points)
    if high - low < 1e-9:
        low, high = low - 0.5, high + 0.5
    grid = [[" "] * width for _ in range(height)]
    for epoch, value, mark in sorted(points, key=lambda p: p[2] == "•"):  # training dots drawn last, on top
        col = 0 if last == first else round((epoch - first) / (last - first) * (width - 1))
        row = round((high - value) / (high - low) * (height - 1))
        grid[row][col] = mark
    label = max(len(f"{high:.3f}"), len(f"{low:.3f}"))
    lines = []
    for i, cells in enumerate(grid):
        tick = f"{high:.3f}" if i == 0 else f"{low:.3f}" if i == height - 1 else ""
        lines.append(f"{tick:>{label}} {'┤' if tick else '│'}{''.join(cells).rstrip()}")
    lines.append(" " * label + " └" + "─" * width)
    left, right = f"epoch {first}", str(last)
    lines.append(" " * (label + 2) + left + right.rjust(width - len(left)))
    return lines


def render_text(report: dict[str, Any]) -> str:
    node, loss, credit, cover = report["node"], report["loss"], report["credit"], report["coverage"]
    run = node["run_ref"] or node["run_id"] or "—"
    lines = [f"Run {run} · model {node['model_fingerprint'][:12] or '—'}",
             f"Node {_short(node['peer_id'])} ({node['state']}) at {node['url']} · epoch {node['epoch']} "
             f"(swarm {node['swarm_epoch']}) · {node['peers_online']} peers online · "
             f"up {_duration(node['uptime_seconds'])}",
             ""]
    latest = [f"training {loss['latest']:.4f}" if loss["latest"] is not None else "",
              f"validation {loss['latest_validation']:.4f}" if loss["latest_validation"] is not None else ""]
    lines.append("Loss (• training, o validation)" + (": " + ", ".join(x for x in latest if x) if any(latest) else ""))
    lines += ["  " + line for line in loss_chart(loss["epochs"], loss["training"], loss["validation_epochs"],
                                                 loss["validation"])]
    lines += ["", f"Contributors: {credit['contributors']} of {node['peers_online']} peers, "
                  f"{credit['swarm_samples_contributed']:,} samples contributed"]
    rows = [("peer", "samples contributed", "share", "uptime")]
    total = credit["swarm_samples_contributed"]
    for c in report["contributors"]:
        rows.append((("▶ " if c["this_node"] else "  ") + _short(c["peer_id"]), f"{c['samples_contributed']:,}",
                     _percent(c["samples_contributed"], total), _duration(c["uptime_seconds"])))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        lines.append("  " + row[0].ljust(widths[0]) + "  " + "  ".join(cell.rjust(w) for cell, w in
                                                                        zip(row[1:], widths[1:], strict=True)))
    mine = (f"This node: {credit['samples_contributed']:,} samples contributed of "
            f"{credit['samples_processed']:,} trained")
    if credit["samples_not_averaged"]:
        mine += f" ({credit['samples_not_averaged']:,} in rounds that failed)"
    lines += [mine, ""]
    if cover["swarm_coverage"] is None:
        lines.append("Data: not sharded (no coverage to report)")
    else:
        text = (f"Data: the swarm's pass {cover['swarm_pass']} has {cover['swarm_coverage']:.0%} of "
                f"{cover['shards_total']:,} shards read")
        if cover["swarm_last_pass_coverage"] is not None:
            text += f"; pass {cover['swarm_pass'] - 1}: {cover['swarm_last_pass_coverage']:.0%}"
        lines.append(text)
        past = cover["node_past_pass_shards"]
        lines.append(f"      this node is in its pass {cover['node_pass']}, {cover['node_shards_consumed']:,} shards "
                     f"read" + (f" (its last pass: {past[0]:,})" if past else ""))
    return "\n".join(lines) + "\n"


def write_json(report: dict[str, Any], path: Path) -> None:
    """``path`` holds the whole report or is left as it was (temp file, then rename)."""
    text = json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(path, text.encode("utf-8"))


def main(args: argparse.Namespace) -> int:
    try:
        url, token_path = discover_node(getattr(args, "url", None), getattr(args, "token_file", None),
                                        getattr(args, "config", None))
    except DiscoveryError as error:
        return _fail(f"cannot read config: {error}", EX_NOINPUT)
    try:
        token: str | None = read_token(token_path)
    except TokenUnavailable:
        token = None  # reads on loopback need no token
    client = NodeClient(url, token, timeout=5.0)
    try:
        status, view = client.status(), client.peers()
    except NodeUnreachable as error:
        reason = str(error).removeprefix(f"{url}: ")
        return _fail(f"no node answers at {url} ({reason}); is it running? (--url or -c name another node)",
                     EX_UNAVAILABLE)
    except NodeError as error:
        return _fail(f"{url}: {error}", EX_FAILURE)  # the node answered badly
    report = build_report(status, view, url)
    target: Path | None = getattr(args, "json", None)
    if target is not None and str(target) != "-":
        try:
            write_json(report, target)
        except OSError as error:
            return _fail(f"cannot write {target}: {error.strerror or error}", EX_FAILURE)
    if target is not None and str(target) == "-":
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n")
    else:
        sys.stdout.write(render_text(report))
        if target is not None:
            print(f"(written as JSON to {target})")
    return EX_OK

