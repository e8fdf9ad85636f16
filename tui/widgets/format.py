"""Pure text formatting for the TUI's widgets: numbers, durations, byte counts, ids, state styles."""

from __future__ import annotations

import math

#: Rich styles for node states inside table cells (whole widgets are coloured from the .tcss).
STATE_STYLES = {
    "training": "bold green",
    "paused": "bold yellow",
    "syncing": "cyan",
    "joining": "cyan",
    "starting": "cyan",
    "stopping": "magenta",
    "stopped": "dim",
    "failed": "bold red",
}
LEVEL_STYLES = {
    "DEBUG": "dim",
    "INFO": "green",
    "WARNING": "yellow",
    "ERROR": "bold red",
    "CRITICAL": "bold white on red",
}
REACHABILITY_STYLES = {"direct": "green", "relayed": "yellow", "client": "cyan", "unknown": "dim"}

DASH = "—"


def short_id(peer_id: str, keep: int = 8) -> str:
    """libp2p ids all start with ``12D3KooW``; only the tail tells peers apart."""
    if len(peer_id) <= keep + 1:
        return peer_id or DASH
    return f"…{peer_id[-keep:]}"


def number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return DASH
    if math.isnan(value):
        return "nan"
    return f"{value:,.{digits}f}"


def duration(seconds: float | None) -> str:
    """Two most significant units: ``45s``, ``3m 12s``, ``2h 03m``, ``4d 07h``."""
    if seconds is None or math.isnan(seconds):
        return DASH
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    minutes, s = divmod(s, 60)
    if minutes < 60:
        return f"{minutes}m {s:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def age(then: float | None, now: float) -> str:
    """``3m 12s ago`` from two unix times; a missing or zero time is ``never``."""
    if not then:
        return "never"
    return f"{duration(now - then)} ago"


def byte_count(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover - loop always returns


def percent(ok: int, failed: int) -> str:
    total = ok + failed
    return f"{100 * ok / total:.1f}% ok ({ok}/{total})" if total else "no rounds yet"
