"""``p2ptrain top``: the Textual app that polls one node in a worker and routes what it gets to the views.

One thread worker talks to the node (through :class:`NodeClient`), posts messages, and the
widgets react; widgets never do I/O.  Control keys run in their own short worker with the
token read at the moment of use, so a restarted node's new token is picked up.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Input, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from p2ptrain.client.discovery import DiscoveryError, TokenUnavailable, discover_node, read_token
from p2ptrain.client.http import NodeClient, NodeError, NodeUnreachable
from p2ptrain.errors import EX_CONFIG, EX_OK  # stdlib only: no pydantic at start-up
from p2ptrain.status import SCHEMA_VERSION, StatusSnapshot, SwarmView
from p2ptrain.tui.widgets.contributors import ContributorsPanel
from p2ptrain.tui.widgets.dialogs import ConfirmScreen, HelpScreen
from p2ptrain.tui.widgets.format import age
from p2ptrain.tui.widgets.logs import LocalTime, LogPane
from p2ptrain.tui.widgets.node import History, NodePanel
from p2ptrain.tui.widgets.swarm import SwarmPanel

HISTORY_POINTS = 60
MAX_BACKOFF = 5.0


class StatusArrived(Message):
    def __init__(self, status: StatusSnapshot, swarm: SwarmView) -> None:
        super().__init__()
        self.status, self.swarm = status, swarm


class LogsArrived(Message):
    def __init__(self, lines: list[dict[str, Any]], restarted: bool) -> None:
        super().__init__()
        self.lines, self.restarted = lines, restarted


class NodeDown(Message):
    def __init__(self, reason: str, url: str, unreachable: bool) -> None:
        super().__init__()
        self.reason, self.url, self.unreachable = reason, url, unreachable


class TokenChecked(Message):
    def __init__(self, problem: str | None) -> None:
        super().__init__()
        self.problem = problem


class ControlDone(Message):
    def __init__(self, command: str, error: str | None) -> None:
        super().__init__()
        self.command, self.error = command, error


class TopApp(App[int]):
    CSS_PATH = "p2ptrain.tcss"
    TITLE = "p2ptrain top"
    ENABLE_COMMAND_PALETTE = False  # every action has a key; the palette would only add noise
    BINDINGS = [
        Binding("p", "pause_resume", "Pause/Resume"),
        Binding("c", "checkpoint", "Checkpoint"),
        Binding("l", "leave", "Leave"),
        Binding("s", "sort", "Sort"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("1", "view('node')", "Node", show=False),
        Binding("2", "view('swarm')", "Swarm", show=False),
        Binding("3", "view('logs')", "Logs", show=False),
        Binding("4", "view('contributors')", "Contributors", show=False),
    ]

    def __init__(self, client: NodeClient, token_file: Path | None, *, poll_interval: float = 1.0,
                 clock: Callable[[], float] = time.time, local_time: LocalTime = time.localtime,
                 rediscover: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.client = client
        self.token_file = token_file
        self.poll_interval = poll_interval
        self.clock = clock
        self.local_time = local_time
        self.rediscover = rediscover
        self.status: StatusSnapshot | None = None
        self.swarm = SwarmView()
        self.history = History()
        self.connected: bool | None = None  # None until the first answer or failure
        self.last_update = 0.0
        self.token_problem: str | None = None
        self.polls = 0
        self._last_taken_at: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Kept as references, not queried: queries go to the active screen, which may be a dialog.
        self._banner = Static(f"connecting to {client.url} …", id="banner", classes="connecting")
        self._views = TabbedContent(initial="node", id="views")
        self._node = NodePanel(id="node-panel")
        self._swarm_panel = SwarmPanel(id="swarm-panel")
        self._logs = LogPane(local_time=local_time, id="log-pane")
        self._contributors = ContributorsPanel(id="contributors-panel")

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield self._banner
        with self._views:
            with TabPane("Node", id="node"):
                yield self._node
            with TabPane("Swarm", id="swarm"):
                yield self._swarm_panel
            with TabPane("Logs", id="logs"):
                yield self._logs
            with TabPane("Contributors", id="contributors"):
                yield self._contributors
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.client.url
        self._poll()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- the poller: the only place that talks to the node ------------------------------------
    @work(thread=True, exclusive=True, group="poll", name="poll")
    def _poll(self) -> None:
        worker = get_current_worker()
        client = self._reading_client(self.client.url, check=True)
        since, failures, started_at = 0, 0, None
        while not worker.is_cancelled and not self._stop.is_set():
            try:
                status, swarm = client.status(), client.peers()
                self.post_message(StatusArrived(status, swarm))
                failures = 0
                # A restarted node begins a new log ring; seq alone cannot always tell.
                new_run = started_at is not None and status.started_at != started_at
                started_at = status.started_at
                try:
                    since = 0 if new_run else since
                    lines, last_seq = client.logs(since)
                    restarted = new_run
                    if last_seq < since:  # the ring is behind what we saw: it began anew
                        restarted = True
                        lines, last_seq = client.logs(0)
                    if lines or restarted:
                        self.post_message(LogsArrived(lines, restarted))
                    since = last_seq
                except NodeUnreachable:
                    raise
                except NodeError:
                    pass  # logs are optional; status is what matters
            except NodeError as error:
                failures += 1
                self.post_message(NodeDown(str(error), client.url, isinstance(error, NodeUnreachable)))
                # A restarted node may listen on a new port and hold a new token.
                url = self.rediscover() if self.rediscover is not None else client.url
                if url != client.url:
                    since = 0
                client = self.client = self._reading_client(url, check=False)
            delay = self.poll_interval if not failures else min(
                self.poll_interval * 2 ** (failures - 1), max(MAX_BACKOFF, self.poll_interval))
            self._wake.wait(delay)
            self._wake.clear()

    def _reading_client(self, url: str, check: bool) -> NodeClient:
        """A client holding the token when it is readable; it sends it with reads only to a node on
        another machine (:class:`NodeClient`), never to whatever answers on a local node's port."""
        try:
            token: str | None = read_token(self.token_file)
            problem = None
        except TokenUnavailable as error:
            token, problem = None, str(error)
        if check or problem != self.token_problem:
            self.post_message(TokenChecked(problem))
        return NodeClient(url, token, self.client.timeout)

    # -- reacting to what the poller found ----------------------------------------------------
    def _live(self) -> bool:
        return not self._stop.is_set() and self._node.is_attached

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # App bindings stay live under a dialog; only quit and the dialog's own keys should.
        return action == "quit" or not isinstance(self.screen, ModalScreen)

    def on_status_arrived(self, message: StatusArrived) -> None:
        if not self._live():  # the poller may still deliver while the app shuts down
            return
        status = message.status
        self.polls += 1
        if status.taken_at != self._last_taken_at or not status.taken_at:
            self._last_taken_at = status.taken_at
            for series, value in ((self.history.samples_per_second, status.local_samples_per_second),
                                  (self.history.loss, status.loss), (self.history.val_loss, status.val_loss)):
                if value is not None and math.isfinite(value):
                    series.append(value)
                    del series[:-HISTORY_POINTS]
        self.status, self.swarm, self.last_update = status, message.swarm, self.clock()
        was_down = self.connected is False
        self.connected = True
        self._views.remove_class("stale")
        banner = self._banner
        banner.set_classes("ok")
        note = ""
        if status.schema_version > SCHEMA_VERSION:
            note = f" · node schema v{status.schema_version} is newer than this TUI's v{SCHEMA_VERSION}"
        control = f" · control keys off: {self.token_problem}" if self.token_problem else ""
        self.sub_title = self.client.url
        banner.update(f"● connected to {self.client.url} · p2ptrain {status.version or '?'}{note}{control}")
        now = self.clock()
        self._node.show(status, self.history, now)
        self._swarm_panel.show(message.swarm, status.peer_id, now)
        self._contributors.show(message.swarm, status)
        if was_down:
            self.notify("reconnected to the node", title="p2ptrain")

    def on_logs_arrived(self, message: LogsArrived) -> None:
        if not self._live():
            return
        pane = self._logs
        if message.restarted:
            pane.add_note("node restarted")
        pane.add_lines(message.lines)

    def on_node_down(self, message: NodeDown) -> None:
        if not self._live():
            return
        self.connected = False
        self._views.add_class("stale")
        shown = f"; showing data from {age(self.last_update, self.clock())}" if self.status else ""
        banner = self._banner
        banner.set_classes("down")
        # Unreachable errors already name the URL; other errors come from a node that did answer.
        what = "node unreachable" if message.unreachable else f"bad answer from {message.url}"
        banner.update(f"✖ {what}: {message.reason} — retrying{shown}")

    def on_token_checked(self, message: TokenChecked) -> None:
        if message.problem == self.token_problem and self.polls:
            return
        self.token_problem = message.problem
        if message.problem:
            self.notify(f"control keys disabled: {message.problem}", severity="warning", timeout=8)

    def on_control_done(self, message: ControlDone) -> None:
        if message.error:
            self.notify(f"{message.command} failed: {message.error}", severity="error", timeout=8)
        else:
            self.notify(f"{message.command}: accepted by the node")
            self._wake.set()  # show the effect now, not at the next poll

    # -- keys ---------------------------------------------------------------------------------
    @work(thread=True, group="control")
    def _send(self, command: str) -> None:
        try:
            token = read_token(self.token_file)
            NodeClient(self.client.url, token, self.client.timeout).control(command)
        except (TokenUnavailable, NodeError) as error:
            self.post_message(ControlDone(command, str(error)))
        else:
            self.post_message(ControlDone(command, None))

    def action_pause_resume(self) -> None:
        if self.status is None:
            self.notify("no status from the node yet", severity="warning")
            return
        self._send("resume" if self.status.state == "paused" else "pause")

    def action_checkpoint(self) -> None:
        self._send("checkpoint")

    def action_leave(self) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._send("leave")

        self.push_screen(ConfirmScreen("Leave the swarm? The node saves a checkpoint and stops."), answered)

    def action_sort(self) -> None:
        self._views.active = "swarm"
        column = self._swarm_panel.cycle_sort()
        self.notify(f"sorted by {column}", timeout=2)

    def action_filter(self) -> None:
        self._views.active = "swarm"
        box = self._swarm_panel.filter_box
        box.add_class("shown")
        box.focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_view(self, name: str) -> None:
        self._views.active = name

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self._swarm_panel.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            self._swarm_panel.table.focus()

    def on_key(self, event: Any) -> None:
        box = self._swarm_panel.filter_box
        if event.key == "escape" and box.has_focus:
            box.value = ""
            box.remove_class("shown")
            self._swarm_panel.table.focus()
            event.stop()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self._swarm_panel.sort_by(event.column_index)


def main(args: argparse.Namespace) -> int:
    """``p2ptrain top``: find the node, run the app until ``q``."""
    url_flag: str | None = getattr(args, "url", None)
    token_flag: Path | None = getattr(args, "token_file", None)
    config: Path | None = getattr(args, "config", None)
    try:
        url, token_file = discover_node(url_flag, token_flag, config)
    except DiscoveryError as error:
        print(f"p2ptrain top: config error: {error}", file=sys.stderr)
        return EX_CONFIG

    def rediscover() -> str:
        try:
            return discover_node(None, token_flag, config)[0]
        except DiscoveryError:
            return url

    app = TopApp(NodeClient(url, None), token_file, rediscover=None if url_flag else rediscover)
    app.run()
    return EX_OK
