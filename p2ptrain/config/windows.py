"""Time windows as users write them ("Mon-Fri 19:00-08:00"): parsed once, asked with a datetime.

They live with the config because the config validates them; the volunteer policy uses them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAY_INDEX = {name: i for names in (DAY_NAMES, _FULL_NAMES) for i, name in enumerate(names)}
_WINDOW = re.compile(r"^(?:(?P<days>[A-Za-z,\-]+)\s+)?(?P<start>\d\d:\d\d)-(?P<end>\d\d:\d\d)$")


@dataclass(frozen=True)
class Window:
    """Minutes since midnight, ``start`` inclusive, ``end`` exclusive; ``days`` are weekdays (Mon=0)
    on which the window starts, so "Fri 22:00-07:00" runs into Saturday morning."""

    days: frozenset[int]
    start: int
    end: int

    def contains(self, moment: datetime) -> bool:
        minute = moment.hour * 60 + moment.minute
        weekday = moment.weekday()
        if self.start < self.end:
            return weekday in self.days and self.start <= minute < self.end
        # Crosses midnight: the evening part belongs to today, the morning part to yesterday's window.
        return (weekday in self.days and minute >= self.start) or (
            (weekday - 1) % 7 in self.days and minute < self.end)


def _minutes(text: str, *, allow_24: bool) -> int:
    hours, minutes = int(text[:2]), int(text[3:])
    if minutes > 59 or hours > 24 or (hours == 24 and (minutes or not allow_24)):
        raise ValueError(f"{text!r} is not a time of day (00:00-23:59)")
    return hours * 60 + minutes


def _days(text: str | None) -> frozenset[int]:
    if text is None:
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.lower().split(","):
        first, _, last = part.partition("-")
        a, b = _DAY_INDEX.get(first, -1), _DAY_INDEX.get(last or first, -1)
        if a < 0 or b < 0:
            raise ValueError(f"unknown day {part!r} (use Mon, Tue, ..., Sun, ranges like Mon-Fri)")
        days.update((a + i) % 7 for i in range((b - a) % 7 + 1))  # Fri-Mon wraps over the weekend
    return frozenset(days)


def parse_window(text: str) -> Window:
    """Parse ``"22:00-07:00"`` or ``"Mon-Fri 19:00-08:00"`` or ``"Sat,Sun 00:00-24:00"``."""
    match = _WINDOW.match(text.strip())
    if not match:
        raise ValueError(f"time window {text!r} must look like 'HH:MM-HH:MM' or 'Mon-Fri HH:MM-HH:MM'")
    start = _minutes(match["start"], allow_24=False)
    end = _minutes(match["end"], allow_24=True)
    if start == end:
        raise ValueError(f"time window {text!r} is empty (for all day write 00:00-24:00)")
    return Window(_days(match["days"]), start, end)
