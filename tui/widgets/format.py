"""Pure text formatting for the TUI's widgets: numbers, durations, byte counts, ids, state styles."""

from __future__ import annotations

import math

from p2ptrain.status import PeerRecord, StatusSnapshot

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
REACHABILITY_STYLES = {"public": "green", "direct": "green", "relayed": "yellow", "client": "cyan", "unknown": "dim"}

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


def share(part: int, total: int) -> str:
    """``92%`` of a count; never rounds a shortfall up to 100% or a few down to 0%."""
    value = 100 * part / total
    if part < total:
        value = min(math.floor(value), 99)
    if part > 0:
        value = max(value, 1)
    return f"{value:.0f}%"


def fraction(value: float | None) -> str:
    return DASH if value is None or math.isnan(value) else f"{value:.0%}"


def group(status: StatusSnapshot) -> str:
    """``group 3/4``: the last round's group against the peers online when it formed."""
    size, online = status.last_round_group_size, status.last_round_peers_online
    if size <= 0:
        return ""
    return f"group {size}/{max(online, size)}" if online > 0 else f"group of {size}"


def averaging_line(status: StatusSnapshot) -> str:
    """``40 rounds · 92% full · median 100% received · group 3/3`` (schema 1 nodes: completed rounds)."""
    ok, partial, failed = (status.averaging_rounds_ok_total, status.averaging_rounds_partial_total,
                           status.averaging_rounds_failed_total)
    total = ok + partial + failed
    if not total:
        return "no rounds yet"
    parts = [f"{total:,} round{'s' if total != 1 else ''}"]
    if status.schema_version < 2:  # "ok" meant "completed" then; nothing was said about coverage
        parts.append(f"{share(ok, total)} completed")
    else:
        parts.append(f"{share(ok, total)} full")
        if status.median_received_fraction is not None:
            parts.append(f"median {fraction(status.median_received_fraction)} received")
    if group(status):
        parts.append(group(status))
    return " · ".join(parts)


def rounds_line(status: StatusSnapshot) -> str:
    ok, partial, failed = (status.averaging_rounds_ok_total, status.averaging_rounds_partial_total,
                           status.averaging_rounds_failed_total)
    if status.schema_version < 2:
        return f"{ok:,} completed, {failed:,} failed"
    return f"{ok:,} full, {partial:,} partial, {failed:,} failed"


def last_round_line(status: StatusSnapshot) -> str:
    last = status.last_round_duration_seconds
    if last is None:
        return "none yet"
    received = status.last_round_received_fraction
    return f"{number(last, 2)}s" + (f" · {fraction(received)} received" if received is not None else "")


def cpu_line(status: StatusSnapshot) -> str:
    """``24.5% of the machine (limit 25%) · idled 3m 12s``, or ``... · no limit``."""
    used = status.cpu_used_percent
    text = f"{number(used)}% of the machine" if used is not None else "use not measured"
    limit = status.cpu_limit_percent
    if not 0 < limit < 100:
        return f"{text} · no limit"
    return f"{text} (limit {limit:g}%) · idled {duration(status.cpu_idle_seconds_total)}"


def traffic_line(status: StatusSnapshot) -> str:
    """``↑ 1.2 MB  ↓ 3.4 MB``, then what the node relays for peers behind NAT once it relays anything:
    ``· relayed 5.6 MB, 2 slots held``."""
    text = f"↑ {byte_count(status.bytes_sent_total)}  ↓ {byte_count(status.bytes_received_total)}"
    if status.relay_bytes_total or status.relay_reservations:
        slots = status.relay_reservations
        text += (f" · relayed {byte_count(status.relay_bytes_total)}, {slots} slot{'s' if slots != 1 else ''} "
                 "held")
    return text


def device_line(status: StatusSnapshot) -> str:
    """``cuda:0 · bf16 · 3.2 GiB in use``, ``cpu · fp32``, or a dash before the model is built."""
    if not status.device:
        return DASH
    text = f"{status.device} · {status.precision or '?'}"
    if status.device_memory_bytes is not None:
        text += f" · {byte_count(status.device_memory_bytes)} in use"
    return text


def peer_device(record: PeerRecord) -> str:
    """A peer's device and precision in one narrow cell: ``gpu0/bf16``, ``cpu/fp32``, or a dash."""
    if not record.device:
        return DASH
    device = record.device.replace("cuda:", "gpu")
    return f"{device}/{record.precision}" if record.precision else device
