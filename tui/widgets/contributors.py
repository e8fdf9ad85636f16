"""The Contributors view: who put how many samples into the swarm's model, and how much of the data
the swarm has read this pass."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from p2ptrain.status import PeerRecord, StatusSnapshot, SwarmView
from p2ptrain.tui.widgets.format import DASH, duration, fraction, short_id

COLUMNS = ("peer", "samples contributed", "share", "uptime")
TOTAL_KEY = "__total__"


def coverage_line(view: SwarmView, status: StatusSnapshot | None) -> str:
    """``Data: pass 3 · 45% of 20 shards read (last pass 100%) · this node 2 in pass 3``."""
    if view.data_coverage is None or not view.shards_total:
        return "Data: not sharded (no coverage to show)"
    line = f"Data: pass {view.data_pass} · {fraction(view.data_coverage)} of {view.shards_total:,} shards read"
    if view.data_last_pass_coverage is not None:
        line += f" (last pass {fraction(view.data_last_pass_coverage)})"
    if status is not None and status.data_shards_total:
        line += f" · this node {status.data_shards_consumed:,} in pass {status.data_pass}"
    return line


def credit_line(view: SwarmView, status: StatusSnapshot | None) -> str:
    """``Contributed: this node 11,904 · swarm 1,234,567 by 5 peers · 256 not averaged``."""
    swarm = f"swarm {view.samples_contributed:,} by {contributors(view)} peers"
    if status is None:
        return f"Contributed: {swarm}"
    line = f"Contributed: this node {status.samples_contributed_total:,} · {swarm}"
    if status.samples_not_averaged_total:
        line += f" · this node's {status.samples_not_averaged_total:,} not averaged"
    return line


def part_share(part: int, total: int) -> str:
    """A peer's share of the total, rounded; a small contribution is never shown as 0%, nor a
    share short of all as 100%."""
    if total <= 0:
        return DASH
    value = round(100 * part / total)
    if 0 < part < total:
        value = min(max(value, 1), 99)
    return f"{value}%"


def contributors(view: SwarmView) -> int:
    return sum(1 for p in view.peers if p.samples_contributed > 0)


def ranked(view: SwarmView) -> list[PeerRecord]:
    """Peers by samples contributed, most first (ties by peer ID, so the order is stable)."""
    return sorted(view.peers, key=lambda p: (-p.samples_contributed, p.peer_id))


class ContributorsPanel(Vertical):
    """Shows what it is given; fetches nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._view = SwarmView()
        self._status: StatusSnapshot | None = None
        self._ready = False
        self.credit = Static("Credit: " + DASH, id="credit-line")
        self.coverage = Static("Data: " + DASH, id="coverage-line")
        self.table: DataTable[Any] = DataTable(id="contributors-table", cursor_type="row", zebra_stripes=True)

    def compose(self) -> ComposeResult:
        yield self.credit
        yield self.coverage
        yield self.table

    def on_mount(self) -> None:
        self._ready = True
        self._show_rows()

    def show(self, view: SwarmView, status: StatusSnapshot | None) -> None:
        self._view, self._status = view, status
        self._show_rows()

    def _show_rows(self) -> None:
        if not self._ready:
            return
        view, status = self._view, self._status
        self.credit.update(credit_line(view, status))
        self.coverage.update(coverage_line(view, status))
        table = self.table
        table.clear(columns=True)
        for title in COLUMNS:
            table.add_column(title, key=title)
        self_id = status.peer_id if status is not None else ""
        total = view.samples_contributed
        for p in ranked(view):
            mine = bool(p.peer_id) and p.peer_id == self_id
            cells = [
                Text(("▶ " if mine else "  ") + short_id(p.peer_id), style="bold" if mine else ""),
                Text(f"{p.samples_contributed:,}", justify="right"),
                Text(part_share(p.samples_contributed, total), justify="right"),
                Text(duration(p.uptime_seconds), justify="right"),
            ]
            if mine:
                for cell in cells:
                    cell.stylize("reverse")
            table.add_row(*cells, key=p.peer_id or None)
        totals = [f"Σ {contributors(view)} of {view.peers_online} peers", f"{total:,}", "100%" if total else DASH, ""]
        table.add_row(*(Text(c, style="bold", justify="left" if i == 0 else "right") for i, c in enumerate(totals)),
                      key=TOTAL_KEY)
