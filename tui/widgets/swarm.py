"""The Swarm view: a sortable, filterable table of every peer's record, with a totals row.

Peers this node caught misbehaving are marked ``✗`` (state ``excluded`` while they are kept out of
its groups and donor lists); offenders without a record of their own (plain hivemind peers) get a
row too, after the peers, and a line above the table says what each did."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from p2ptrain.status import OffenderEntry, PeerRecord, SwarmView
from p2ptrain.tui.widgets.format import (
    DASH,
    REACHABILITY_STYLES,
    STATE_STYLES,
    duration,
    number,
    peer_device,
    short_id,
)


def _loss_key(p: PeerRecord) -> float:
    return p.loss if p.loss is not None and not math.isnan(p.loss) else math.inf


#: (title, sort key); "seen" (last seen) sorts newest first.  Cells stay narrow so 80 columns hold them all.
COLUMNS: tuple[tuple[str, Callable[[PeerRecord], Any]], ...] = (
    ("peer", lambda p: p.peer_id),
    ("state", lambda p: p.state),
    ("epoch", lambda p: p.epoch),
    ("samp/s", lambda p: p.samples_per_second),
    ("loss", _loss_key),
    ("reach", lambda p: p.reachability),
    ("device", peer_device),
    ("seen", lambda p: -p.published_at),
    ("version", lambda p: p.version),
)
TOTAL_KEY = "__total__"
OFFENDER_MARK = "✗ "
#: Offenders named in the line above the table (the API lists them all).
NAMED_OFFENDERS = 3


class SwarmPanel(Vertical):
    """Keeps the last view and re-renders on sort/filter changes; fetches nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_column = 0
        self.sort_reverse = False
        self.filter_text = ""
        self._view = SwarmView()
        self._self_id = ""
        self._now = 0.0
        self._ready = False  # data can arrive before the table exists
        self.filter_box = Input(placeholder="filter peers (any column); Enter keeps, Esc clears", id="filter")
        self.table: DataTable[Any] = DataTable(id="peers", cursor_type="row", zebra_stripes=True)
        self.offender_line = Static("", id="offenders")

    def compose(self) -> ComposeResult:
        yield self.filter_box
        yield self.offender_line
        yield self.table

    def on_mount(self) -> None:
        self._ready = True
        self._render_table()

    def show(self, view: SwarmView, self_id: str, now: float) -> None:
        self._view, self._self_id, self._now = view, self_id, now
        self._render_table()

    def cycle_sort(self) -> str:
        self.sort_by(self.sort_column + 1 if self.sort_column + 1 < len(COLUMNS) else 0)
        return COLUMNS[self.sort_column][0]

    def sort_by(self, index: int) -> None:
        """A second click on the same column reverses it, as in most table UIs."""
        if index == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = index, False
        self._render_table()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip().lower()
        self._render_table()

    def _cells(self, p: PeerRecord) -> list[Text]:
        mine = p.peer_id == self._self_id and bool(p.peer_id)
        offender = self._view.offender(p.peer_id)
        if offender is not None:
            mark, mark_style = OFFENDER_MARK, "bold red"
        else:
            mark, mark_style = ("▶ " if mine else "  "), ("bold" if mine else "")
        state, state_style = p.state, STATE_STYLES.get(p.state, "")
        if offender is not None and offender.excluded:
            state, state_style = "excluded", "bold red"
        return [
            Text(mark + short_id(p.peer_id), style=mark_style),
            Text(state, style=state_style),
            Text(str(p.epoch), justify="right"),
            Text(number(p.samples_per_second), justify="right"),
            Text(number(p.loss, 3), justify="right"),
            Text(p.reachability, style=REACHABILITY_STYLES.get(p.reachability, "")),
            Text(peer_device(p)),
            Text(duration(self._now - p.published_at) if p.published_at else DASH),
            Text(p.version or DASH),
        ]

    def visible_peers(self) -> list[PeerRecord]:
        peers = list(self._view.peers)
        if self.filter_text:
            peers = [p for p in peers if any(self.filter_text in cell.plain.lower() or
                                             self.filter_text in p.peer_id.lower()
                                             for cell in self._cells(p))]
        key = COLUMNS[self.sort_column][1]
        return sorted(peers, key=lambda p: (key(p), p.peer_id), reverse=self.sort_reverse)

    def _render_table(self) -> None:
        if not self._ready:
            return
        table = self.table
        cursor = table.cursor_row
        table.clear(columns=True)
        for i, (title, _) in enumerate(COLUMNS):
            arrow = (" ▼" if self.sort_reverse else " ▲") if i == self.sort_column else ""
            table.add_column(title + arrow, key=title)
        peers = self.visible_peers()
        for p in peers:
            cells = self._cells(p)
            if p.peer_id == self._self_id and p.peer_id:
                for cell in cells:
                    cell.stylize("reverse")  # this node stands out in any theme
            table.add_row(*cells, key=p.peer_id or None)
        recorded = {p.peer_id for p in self._view.peers}
        unrecorded = [o for o in self._view.offenders if o.peer_id not in recorded]
        if self.filter_text:
            unrecorded = [o for o in unrecorded if self.filter_text in o.peer_id.lower()
                          or self.filter_text in o.kind.lower()]
        for offender in unrecorded:
            table.add_row(*self._offender_cells(offender), key=f"offender:{offender.peer_id}")
        table.add_row(*self._totals(peers), key=TOTAL_KEY)
        if peers:
            table.move_cursor(row=min(cursor, len(peers) - 1), animate=False)
        self._render_offenders()

    def _offender_cells(self, o: OffenderEntry) -> list[Text]:
        """A row for an offender that publishes no record: what it did, and when last."""
        return [
            Text(OFFENDER_MARK + short_id(o.peer_id), style="bold red"),
            Text("excluded" if o.excluded else "offender", style="bold red" if o.excluded else "red"),
            Text(DASH, justify="right"), Text(DASH, justify="right"), Text(DASH, justify="right"),
            Text(DASH), Text(DASH),
            Text(duration(self._now - o.last_at) if o.last_at else DASH),
            Text(o.kind, style="red"),
        ]

    def _render_offenders(self) -> None:
        """``✗ 2 offenders: …Mm5Kk nonfinite_part ×3 (excluded 9m 12s more) · …`` above the table."""
        offenders = self._view.offenders
        self.offender_line.set_class(bool(offenders), "shown")
        if not offenders:
            self.offender_line.update("")
            return
        parts = []
        for o in offenders[:NAMED_OFFENDERS]:
            if not o.excluded:
                left = "no longer excluded"
            elif o.banned_until is None:
                left = "excluded for the run"
            else:
                left = f"excluded {duration(o.banned_until - self._now)} more"
            count = f" ×{o.offences}" if o.offences > 1 else ""
            parts.append(f"{short_id(o.peer_id)} {o.kind}{count} ({left})")
        more = f" · +{len(offenders) - NAMED_OFFENDERS} more" if len(offenders) > NAMED_OFFENDERS else ""
        noun = "offender" if len(offenders) == 1 else "offenders"
        self.offender_line.update(Text(f"{OFFENDER_MARK}{len(offenders)} {noun}: " + " · ".join(parts) + more,
                                       style="red"))

    def _totals(self, peers: list[PeerRecord]) -> list[Text]:
        losses = [p.loss for p in peers if p.loss is not None and not math.isnan(p.loss)]
        states = Counter(p.state for p in peers)
        reach = Counter(p.reachability for p in peers)
        shown = f"{len(peers)}/{self._view.peers_online}" if self.filter_text else str(len(peers))
        cells = [
            f"Σ {shown} peers",
            f"{states.get('training', 0)} train",
            str(max((p.epoch for p in peers), default=0)),
            number(sum(p.samples_per_second for p in peers)),
            f"μ {number(sum(losses) / len(losses), 3)}" if losses else DASH,
            f"{reach.get('public', 0) + reach.get('direct', 0)} public",  # "direct": older nodes' word
            f"{sum(p.device.startswith('cuda') for p in peers)} gpu",
            "",
            "mixed" if len({p.version for p in peers}) > 1 else "",
        ]
        justify = {2, 3, 4}
        return [Text(c, style="bold", justify="right" if i in justify else "left")
                for i, c in enumerate(cells)]
