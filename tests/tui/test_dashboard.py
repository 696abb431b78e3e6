"""The dashboard against a scripted admin server: each view with Pilot, the actions behind a
confirmation, the unreachable banner, and one snapshot per view."""

from __future__ import annotations

import datetime

import pytest
from textual.widgets import DataTable, Static, TabbedContent

from talaria_tui.app import Dashboard
from talariad.admin.client import AdminClient
from tests.tui.fake_admin import serve

VIEWS = ("rounds", "switches", "memory", "leases", "sessions", "instances", "decisions", "planner")
SIZE = (130, 30)


@pytest.fixture
def fake(tmp_path):
    server, admin = serve(str(tmp_path / "admin.sock"))
    admin.path = str(tmp_path / "admin.sock")
    yield admin
    admin.stop.set()
    server.stop(grace=None)


def dashboard(path: str) -> Dashboard:
    """Frozen clocks: TTLs and the unreachable time render the same on every run."""
    return Dashboard(
        AdminClient(path),
        interval_s=0.2,
        clock=lambda: 100.0,
        wall=lambda: datetime.datetime(2026, 1, 1, 12, 0, 0),
    )


async def loaded(pilot, memory: bool = True) -> None:
    app = pilot.app
    for _ in range(300):
        await pilot.pause(0.05)
        if (
            app.query_one("#instances", DataTable).row_count == 2
            and app.query_one("#rounds", DataTable).row_count
            and app.query_one("#leases", DataTable).row_count
            and app.query_one("#candidates", DataTable).row_count
            and (not memory or "cold0" in str(app.query_one("#memory", Static).render()))
        ):
            return
    raise AssertionError("the dashboard never showed the fake daemon's data")


async def confirming(pilot) -> None:
    from talaria_tui.app import Confirm

    for _ in range(100):
        await pilot.pause(0.02)
        if isinstance(pilot.app.screen, Confirm):
            return
    raise AssertionError("no confirmation was asked")


async def test_every_view_shows_live_data(fake):
    app = dashboard(fake.path)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert "talariad 0.1.0" in str(app.query_one("#banner", Static).render())
        assert (
            app.query_one("#banner", Static).region.y == 0
            and app.query_one("#banner", Static).region.height == 1
        )
        rounds = app.query_one("#rounds", DataTable)
        assert rounds.row_count == 3 and "(open)" in str(rounds.get_row_at(2)[1])
        assert str(rounds.get_row_at(2)[2]) == "-"  # an open round's wall is not measured yet
        bar = rounds.get_row_at(1)[
            3
        ]  # the longest closed round: the full bar, active green then switch red
        assert [s.style for s in bar.spans] == ["green", "red"] and len(bar.plain) == 30
        switch = app.query_one("#switches", DataTable).get_row_at(0)
        assert str(switch[3]) == "d2d" and str(switch[6]) == "3.0" and str(switch[7]) == "1.0"
        assert "save/teardown" in str(app.query_one("#legend", Static).render())
        mem = str(app.query_one("#memory", Static).render())
        assert (
            "weights tiny-code 50.0 MiB" in mem
            and "tiny-code 5.0 MiB" in mem
            and "no managed device memory" in mem
        )
        assert (
            "kv_pool 100.0 MiB" in mem and "staged tiny-chat dirty 20.0 MiB" in mem
        )  # chunks carved out of the pool
        bar = str(app.query_one("#memory", Static).render()).splitlines()[2]
        assert len(bar.strip()) <= 60  # the regions never add up past the capacity
        leases = app.query_one("#leases", DataTable)
        assert [str(leases.get_row_at(i)[4]) for i in range(2)] == ["0.9", "0.4"]
        assert app.query_one("#sessions", DataTable).row_count == 2
        app.query_one("#tabs", TabbedContent).active = "tab-decisions"
        cands = app.query_one("#candidates", DataTable)
        for _ in range(100):
            await pilot.pause(0.02)
            if cands.row_count:
                break
        assert cands.row_count == 2 and str(cands.get_row_at(1)[10]) == "eq2"


async def test_planner_view_shows_the_proposal_its_reasons_and_moves(fake):
    app = dashboard(fake.path)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.query_one("#tabs", TabbedContent).active = "tab-planner"
        moves = app.query_one("#plan-moves", DataTable)
        for _ in range(100):
            await pilot.pause(0.02)
            if moves.row_count:
                break
        text = str(app.query_one("#plan", Static).render())
        assert "planner: advise" in text and "hot0 hot:tiny-chat -> hot:tiny-code" in text
        assert "gain 420.0 s" in text and "move: gain 420.0 s > 2 x cost 2.0 s" in text
        assert [str(c) for c in moves.get_row_at(0)][4:6] == ["operator", "done"]


async def test_lease_ttl_counts_down(fake):
    now = [100.0]
    app = Dashboard(AdminClient(fake.path), interval_s=30, clock=lambda: now[0])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, memory=False)
        now[0] += 0.5  # sess-b (0.4 s) ran out; sess-a has 0.4 s left
        await pilot.pause(0.3)
        leases = app.query_one("#leases", DataTable)
        assert leases.row_count == 1 and str(leases.get_row_at(0)[4]) == "0.4"


async def test_drain_and_revoke_ask_first(fake):
    app = dashboard(fake.path)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.query_one("#tabs", TabbedContent).active = "tab-instances"
        await pilot.pause(0.1)
        app.query_one("#instances", DataTable).move_cursor(row=1)
        await pilot.press("d")
        await confirming(pilot)
        await pilot.press("n")  # declined: nothing happens
        await pilot.pause(0.2)
        assert fake.actions == []
        await pilot.press("d")
        await confirming(pilot)
        await pilot.press("y")
        for _ in range(200):
            await pilot.pause(0.05)
            if str(app.query_one("#instances", DataTable).get_row("cold0")[6]) == "drained":
                break
        assert fake.actions == [("drain", "cold0")]
        assert str(app.query_one("#instances", DataTable).get_row("cold0")[6]) == "drained"
        app.query_one("#tabs", TabbedContent).active = "tab-leases"
        await pilot.pause(0.1)
        await pilot.press("x")
        await confirming(pilot)
        await pilot.press("y")
        for _ in range(200):
            await pilot.pause(0.05)
            if fake.actions[-1][0] == "revoke":
                break
        assert fake.actions[-1] == ("revoke", "sess-a", "tiny-code")


async def test_header_says_since_when_the_daemon_is_unreachable(fake, tmp_path):
    app = dashboard(str(tmp_path / "gone.sock"))
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            await pilot.pause(0.05)
            if "unreachable" in str(app.query_one("#banner", Static).render()):
                break
        banner = app.query_one("#banner", Static)
        assert str(banner.render()).startswith("daemon unreachable since 12:00:00")
        assert banner.region.y == 0 and banner.region.height == 1  # on screen, not pushed off


@pytest.mark.parametrize("view", VIEWS)
def test_snapshot(view, fake, snap_compare):
    async def show(pilot):
        await loaded(pilot)
        tabs = pilot.app.query_one("#tabs", TabbedContent)
        tabs.active = f"tab-{view}"
        pane = pilot.app.query_one(f"#tab-{view}")
        for _ in range(300):  # until the pane is laid out on screen (a loaded machine is slow)
            await pilot.pause(0.02)
            if tabs.active == f"tab-{view}" and pane.region.width and pane.region.height:
                break
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    assert snap_compare(dashboard(fake.path), terminal_size=SIZE, run_before=show)
