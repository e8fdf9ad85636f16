"""The Logs view: the node's log lines, oldest first, following new ones, coloured by level."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.text import Text
from textual.widgets import RichLog

from p2ptrain.tui.widgets.format import LEVEL_STYLES

LocalTime = Callable[[float], time.struct_time]


class LogPane(RichLog):
    """Writes what it is given; the app's poller fetches."""

    def __init__(self, local_time: LocalTime = time.localtime, **kwargs: Any) -> None:
        super().__init__(max_lines=2000, wrap=False, markup=False, highlight=False, auto_scroll=True,
                         **kwargs)
        self._local_time = local_time

    def add_lines(self, lines: Iterable[dict[str, Any]]) -> None:
        for line in lines:
            level = line["level"].upper()
            text = Text(time.strftime("%H:%M:%S", self._local_time(line["time"])) + " ", style="dim")
            text.append(f"{level:<8}", style=LEVEL_STYLES.get(level, ""))
            text.append(f" {line['logger']}: ", style="dim")
            text.append(line["message"])
            self.write(text)

    def add_note(self, note: str) -> None:
        self.write(Text(f"── {note} ──", style="dim italic"))
