"""Pilot tests: the app against the fake node over real HTTP, driven by keys like a user."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from fakenode import SCRIPT_LENGTH, SELF_ID, TOKEN, FakeNode, status_script
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, ProgressBar, Sparkline, Static

from p2ptrain.tui.app import TopApp
from p2ptrain.tui.widgets.dialogs import ConfirmScreen, HelpScreen
from p2ptrain.tui.widgets.logs import LogPane
from p2ptrain.tui.widgets.node import run_line
from p2ptrain.tui.widgets.swarm import TOTAL_KEY
from p2ptrain.waiting import wait_until_async

MakeApp = Callable[..., TopApp]


def drive(app: TopApp, scenario: Callable[[Pilot[Any]], Awaitable[None]], size: tuple[int, int] = (120, 40)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(pilot)

    asyncio.run(main())


async def until(pilot: Pilot[Any], condition: Callable[[], object], timeout: float = 20.0) -> None:
    """The shared wait, pausing through the Pilot so the app handles its messages meanwhile."""
    await wait_until_async(condition, timeout, "screen in the expected state", 0.05, pause=pilot.pause)


def text(app: TopApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).content)


def table_rows(app: TopApp) -> list[list[str]]:
    table = app.screen.query_one("#peers", DataTable)
    return [[str(getattr(c, "plain", c)) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_node_view_shows_the_snapshot(make_app: MakeApp) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: len(app.history.loss) == SCRIPT_LENGTH)
        assert text(app, "#state-value") == "TRAINING"
        assert app.screen.query_one("#state-value").has_class("state-training")
        assert text(app, "#peer-value") == SELF_ID
        assert text(app, "#run-value") == ("bytelm-demo@mfvu2prtod62tp5pp2vgyrz7ty · manifest v3 · invite  "
                                           "model 9f2c4e1ab37d")
        assert text(app, "#addrs-value").startswith("public · /ip4/203.0.113.7/tcp/31337")
        assert text(app, "#epoch-value") == "42 (swarm 42) · 5 peers · 1 excluded"
        bar = app.screen.query_one("#progress-bar", ProgressBar)
        assert bar.total == 4096 and bar.progress == (29 * 137) % 4096
        assert text(app, "#avg-value") == "42 rounds · 88% full · median 100% received · group 4/5"
        assert text(app, "#rounds-value") == "37 full, 3 partial, 2 failed"
        assert len(app.screen.query_one("#rounds-spark", Sparkline).data or []) == 24
        assert text(app, "#round-value") == "1.25s · 67% received"
        assert text(app, "#cpu-value") == "24.6% of the machine (limit 25%) · idled 32m 12s"
        assert text(app, "#traffic-value") == "↑ 734.0 MB  ↓ 1.3 GB"
        assert text(app, "#ckpt-value") == "3m 12s ago (7 ok, 0 failed)"
        assert text(app, "#uptime-value") == "2h 03m"
        loss = app.screen.query_one("#loss-spark", Sparkline).data
        assert loss is not None and len(loss) == SCRIPT_LENGTH and loss[0] > loss[-1]
        assert len(app.screen.query_one("#val-spark", Sparkline).data or []) == 10  # every third has one
        assert "connected to" in text(app, "#banner")

    drive(app, scenario)


def test_swarm_view_sort_and_filter(make_app: MakeApp) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.status is not None)
        await pilot.press("2")
        await until(pilot, lambda: len(table_rows(app)) == 7)  # 5 peers, 1 offender without a record, totals
        rows = table_rows(app)
        assert rows[-1][0] == "Σ 5 peers" and rows[-1][3] == "459.9" and rows[-1][4] == "μ 2.346"
        assert [r[0] for r in rows if r[0].startswith("▶")] == ["▶ …mVvZ1xAa"]  # this node
        assert [r[7] for r in rows if r[0].startswith("▶")] == ["3s"]
        # Offenders are marked; the one excluded now says so, and the one without a record gets a row.
        assert [(r[0], r[1]) for r in rows if r[0].startswith("✗")] == [("✗ …Nn6Mm5Kk", "syncing"),
                                                                         ("✗ …3Zz4Aa5B", "excluded")]
        assert rows[-2][8] == "nonfinite_part"
        assert text(app, "#offenders").startswith("✗ 2 offenders: …3Zz4Aa5B nonfinite_part ×3 (excluded 9m 12s more)")
        await pilot.press("s")  # peer -> state
        assert [r[1] for r in table_rows(app)[:-2]] == ["paused", "syncing", "training", "training", "training"]
        await pilot.press("s", "s")  # -> epoch -> samples/s
        assert [r[3] for r in table_rows(app)[:-2]] == ["0.0", "12.5", "97.1", "118.4", "231.9"]
        table = app.screen.query_one("#peers", DataTable)
        table.post_message(DataTable.HeaderSelected(table, table.ordered_columns[3].key, 3,
                                                     table.ordered_columns[3].label))
        await pilot.pause(0.1)  # a second click on the same header reverses
        assert [r[3] for r in table_rows(app)[:-2]] == ["231.9", "118.4", "97.1", "12.5", "0.0"]
        await pilot.press("slash")
        assert app.focused is app.screen.query_one("#filter", Input)
        await pilot.press(*"relayed")
        assert [r[5] for r in table_rows(app)] == ["relayed", "relayed", "0 public"]
        assert table_rows(app)[-1][0] == "Σ 2/5 peers"
        assert not isinstance(app.screen, ConfirmScreen)  # the "l" went to the filter, not to leave
        await pilot.press("enter")
        assert app.focused is table and len(table_rows(app)) == 3
        await pilot.press("slash", "escape")
        assert len(table_rows(app)) == 7

    drive(app, scenario)


def test_logs_view_follows_new_lines(make_app: MakeApp, fake_node: FakeNode) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await pilot.press("3")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: len(pane.lines) == 6)
        assert "WARNING  p2ptrain.node: averaging round timed out" in pane.lines[2].text
        fake_node.add_log("ERROR", "disk full while writing a checkpoint")
        await until(pilot, lambda: len(pane.lines) == 7)
        assert pane.lines[6].text.endswith("ERROR    p2ptrain.node: disk full while writing a checkpoint")

    drive(app, scenario)


def test_control_keys_send_authenticated_requests(make_app: MakeApp, fake_node: FakeNode) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.status is not None)
        await pilot.press("p")
        await until(pilot, lambda: app.status is not None and app.status.state == "paused")
        await pilot.press("p")  # paused -> the same key resumes
        await until(pilot, lambda: len(fake_node.controls) == 2)
        await pilot.press("c")
        await until(pilot, lambda: len(fake_node.controls) == 3)
        auth = f"Bearer {TOKEN}"
        assert fake_node.controls == [("pause", auth, {}), ("resume", auth, {}), ("checkpoint", auth, {})]

    drive(app, scenario)


def test_leave_needs_confirmation(make_app: MakeApp, fake_node: FakeNode) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.status is not None)
        await pilot.press("l")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("c", "p")  # other keys are inert under the dialog
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("l", "enter")  # the focused default button is "No"
        await pilot.pause(0.3)
        assert fake_node.controls == []
        await pilot.press("l", "y")
        await until(pilot, lambda: fake_node.controls)
        assert fake_node.controls == [("leave", f"Bearer {TOKEN}", {})]

    drive(app, scenario)


def test_unreadable_token_is_reported(make_app: MakeApp, fake_node: FakeNode, tmp_path: Path) -> None:
    app = make_app(token_file=tmp_path / "missing.token")

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.status is not None and app.token_problem)
        assert "missing.token does not exist" in text(app, "#banner")
        await pilot.press("c")
        await until(pilot, lambda: any("checkpoint failed" in n.message for n in app._notifications))
        assert fake_node.controls == []  # nothing was sent without a token

    drive(app, scenario)


def test_wrong_token_is_reported(make_app: MakeApp, fake_node: FakeNode, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token")
    app = make_app(token_file=wrong)

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.status is not None)
        await pilot.press("c")
        await until(pilot, lambda: any("refused the token" in n.message for n in app._notifications))

    drive(app, scenario)


def test_disconnect_greys_out_and_reconnects(make_app: MakeApp, fake_node: FakeNode) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.connected)
        fake_node.stop()
        await until(pilot, lambda: app.connected is False)
        views = app.screen.query_one("#views")
        assert views.has_class("stale") and app.screen.query_one("#banner").has_class("down")
        assert f"node unreachable: {fake_node.url}" in text(app, "#banner")
        assert text(app, "#state-value") == "TRAINING"  # last data kept
        fake_node.start()
        await until(pilot, lambda: app.connected)
        assert not views.has_class("stale") and "connected to" in text(app, "#banner")

    drive(app, scenario)


@pytest.mark.parametrize("mode, shown", [("garbage", "not JSON"), ("old", "schema 0")])
def test_garbage_or_old_schema_never_crashes(make_app: MakeApp, fake_node: FakeNode, mode: str,
                                             shown: str) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.connected)
        fake_node.mode = mode
        await until(pilot, lambda: shown in text(app, "#banner"))
        assert f"bad answer from {fake_node.url}" in text(app, "#banner")
        assert app.screen.query_one("#views").has_class("stale")
        await pilot.press("2", "s", "1")  # the app still reacts
        fake_node.mode = "ok"
        await until(pilot, lambda: app.connected)

    drive(app, scenario)


def test_help_screen(make_app: MakeApp) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    drive(app, scenario)


def test_small_terminal(make_app: MakeApp) -> None:
    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.connected)
        for key in "123":
            await pilot.press(key)
        assert app.screen.query_one("#peers", DataTable).get_row(TOTAL_KEY)

    drive(app, scenario, size=(80, 24))


def test_rediscovers_a_node_that_moved(fake_node: FakeNode, token_file: Path) -> None:
    """A node restarted with ``api.port = 0`` listens elsewhere; api.url is re-read while down."""
    from p2ptrain.client.http import NodeClient

    asked: list[int] = []

    def rediscover() -> str:
        asked.append(1)
        return fake_node.url

    app = TopApp(NodeClient("http://127.0.0.1:9", None, timeout=0.5), token_file, poll_interval=0.05,
                 rediscover=rediscover)

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.connected)
        assert asked and app.client.url == fake_node.url

    drive(app, scenario)


def test_reads_carry_no_token_and_a_restart_resets_the_logs(make_app: MakeApp, fake_node: FakeNode) -> None:
    app = make_app()  # with a readable token file: the control keys work

    async def scenario(pilot: Pilot[Any]) -> None:
        await pilot.press("3")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: app.connected and len(pane.lines) == 6)
        # The node restarts: a new run, a new log ring that already holds as many lines as before.
        fake_node.script = [dataclasses.replace(s, started_at=s.started_at + 60) for s in fake_node.script]
        fake_node.lines = [dict(line, message=f"after restart {line['seq']}") for line in fake_node.lines]
        await until(pilot, lambda: len(pane.lines) == 13)
        assert "node restarted" in pane.lines[6].text and "after restart 1" in pane.lines[7].text
        assert fake_node.read_authorizations and set(fake_node.read_authorizations) == {None}
        assert app.token_problem is None

    drive(app, scenario)


def test_a_plain_run_shows_its_run_id() -> None:
    plain = dataclasses.replace(status_script()[0], run_ref="", manifest_version=0, admission_policy="",
                                run_id="bytelm-demo")
    assert run_line(plain) == "bytelm-demo  model 9f2c4e1ab37d"
    assert run_line(dataclasses.replace(plain, model_fingerprint="", run_id="")) == "—"


def test_contributors_view_ranks_peers_by_samples_contributed(make_app: MakeApp) -> None:
    from p2ptrain.tui.widgets.contributors import TOTAL_KEY as CONTRIBUTORS_TOTAL

    app = make_app()

    async def scenario(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.swarm.peers)
        await pilot.press("4")
        table = app.screen.query_one("#contributors-table", DataTable)
        await until(pilot, lambda: table.row_count == 6)
        rows = [[str(getattr(c, "plain", c)) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert [r[1] for r in rows[:5]] == ["2,073,600", "1,046,400", "880,128", "402,304", "0"]
        assert rows[1][0] == "▶ " + "…" + SELF_ID[-8:]  # this node, marked
        # Shares of the credited total (4,402,432), rounded.
        assert [r[2] for r in rows[:5]] == ["47%", "24%", "20%", "9%", "0%"]
        assert rows[0][3] == "1h 10m" and rows[1][3] == "1h 00m"
        assert rows[5] == ["Σ 4 of 5 peers", "4,402,432", "100%", ""]
        assert table.get_row_index(CONTRIBUTORS_TOTAL) == 5
        assert text(app, "#credit-line") == ("Contributed: this node 1,046,400 · swarm 4,402,432 by 4 peers · "
                                             "this node's 2,304 not averaged")
        assert text(app, "#coverage-line") == ("Data: pass 3 · 45% of 20 shards read (last pass 100%) · "
                                               "this node 2 in pass 3")

    drive(app, scenario)
