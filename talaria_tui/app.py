"""`talaria-tui`: a live dashboard over the admin API.

Views: Rounds (active vs switch time per round, slot phases, SP admitted/parked), Switches (path,
the five named phases, staged/dirty MiB), Memory (HBM layout as a proportional bar, host KV per
model), Leases (TTL counting down), Sessions, Instances, Decisions (Eq. (1) per candidate on
select) and Planner (the planner's proposal, its reasons and recent moves). Status, rounds and
the router's state (leases, sessions, decisions) arrive on gRPC streams; memory layouts and the
planner's proposal are read every `interval_s`. Keys: d drain, u undrain, c cordon (Instances),
x revoke (Leases), each after a confirmation.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Footer, Static, TabbedContent, TabPane

from talaria_tui.render import (
    DECISION_COLUMNS,
    INSTANCE_COLUMNS,
    KEEP_ROUNDS,
    LEASE_COLUMNS,
    PLAN_COLUMNS,
    ROUND_COLUMNS,
    SESSION_COLUMNS,
    SWITCH_COLUMNS,
    candidate_row,
    decision_row,
    instance_row,
    memory_text,
    mib,
    phase_legend,
    plan_row,
    plan_text,
    round_bar,
    slots_cell,
    switch_bar,
)
from talariad.admin.client import (
    CANDIDATE_COLUMNS,
    AdminClient,
    Refused,
    Unreachable,
    as_dict,
    default_socket,
)


class Confirm(ModalScreen[bool]):
    """Yes/no before an action that changes the daemon."""

    BINDINGS = [
        ("y", "answer(True)", "Yes"),
        ("n", "answer(False)", "No"),
        ("escape", "answer(False)", "No"),
    ]
    CSS = "Confirm { align: center middle; } #box { width: 60; height: auto; border: thick $warning; padding: 1 2; }"

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Static(Text(self.question))
            with Horizontal():
                yield Button("Yes (y)", id="yes", variant="warning")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Dashboard(App):
    TITLE = "Talaria"
    BINDINGS = [
        ("q", "quit", "Quit"),
        ("r", "refresh", "Refresh"),
        Binding("d", "instance('Drain')", "Drain"),
        Binding("u", "instance('Undrain')", "Undrain"),
        Binding("c", "instance('Cordon')", "Cordon"),
        Binding("x", "revoke", "Revoke lease"),
    ]
    CSS = """
    #banner { height: 1; padding: 0 1; background: $boost; }
    TabbedContent { height: 1fr; }
    TabPane { height: 1fr; padding: 0; }
    DataTable { height: 1fr; }
    #candidates { height: 8; }
    #legend { height: 1; }
    """

    def __init__(
        self,
        client: AdminClient,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = datetime.datetime.now,
    ):
        super().__init__()
        self.client, self.interval_s, self.clock, self.wall = client, interval_s, clock, wall
        self._fetching = False
        self._stop = threading.Event()
        self.status: dict | None = None
        self.unreachable_since: datetime.datetime | None = None
        self.error = ""
        self.rounds: dict[tuple[str, int], dict] = {}
        self.switches: deque[dict] = deque(maxlen=KEEP_ROUNDS)
        self.leases: list[dict] = []
        self._leases_at = 0.0
        self.decisions: list[dict] = []

    def compose(self) -> ComposeResult:
        yield Static("connecting…", id="banner")
        with TabbedContent(id="tabs"):
            with TabPane("Rounds", id="tab-rounds"):
                yield DataTable(id="rounds", zebra_stripes=True)
            with TabPane("Switches", id="tab-switches"):
                yield DataTable(id="switches", zebra_stripes=True)
                yield Static(phase_legend(), id="legend")
            with TabPane("Memory", id="tab-memory"):
                with VerticalScroll():
                    yield Static("", id="memory")
            with TabPane("Leases", id="tab-leases"):
                yield DataTable(id="leases", zebra_stripes=True, cursor_type="row")
            with TabPane("Sessions", id="tab-sessions"):
                yield DataTable(id="sessions", zebra_stripes=True)
            with TabPane("Instances", id="tab-instances"):
                yield DataTable(id="instances", zebra_stripes=True, cursor_type="row")
            with TabPane("Decisions", id="tab-decisions"):
                yield DataTable(id="decisions", zebra_stripes=True, cursor_type="row")
                yield DataTable(id="candidates")
            with TabPane("Planner", id="tab-planner"):
                yield Static("", id="plan")
                yield DataTable(id="plan-moves", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        # kept by reference: while a confirmation is on top, queries see that screen, not these
        self.tables = {t.id: t for t in self.query(DataTable)}
        self.banner = self.query_one("#banner", Static)
        self.memory_view = self.query_one("#memory", Static)
        self.plan_view = self.query_one("#plan", Static)
        self.tabs = self.query_one("#tabs", TabbedContent)
        for table_id, columns in (
            ("instances", INSTANCE_COLUMNS),
            ("leases", LEASE_COLUMNS),
            ("sessions", SESSION_COLUMNS),
            ("decisions", DECISION_COLUMNS),
            ("rounds", ROUND_COLUMNS),
            ("switches", SWITCH_COLUMNS),
            ("candidates", CANDIDATE_COLUMNS),
            ("plan-moves", PLAN_COLUMNS),
        ):
            table = self.tables[table_id]
            for col in columns:
                table.add_column(col, key=col)
        self._watch_status()
        self._watch_rounds()
        self._watch_router()
        self.action_refresh()
        self.set_interval(self.interval_s, self.action_refresh)
        self.set_interval(0.1, self._tick_leases)

    def on_unmount(self) -> None:
        self._stop.set()
        self.client.cancel_streams()

    # ---- streams -----------------------------------------------------------------------------

    def _stream(self, open_stream: Callable, on_reply: Callable) -> None:
        """Follow a gRPC stream; when the daemon goes away, say since when and reconnect."""
        while not self._stop.is_set():
            try:
                for reply in open_stream():
                    self.call_from_thread(on_reply, as_dict(reply))
                    if self._stop.is_set():
                        return
            except Unreachable as e:
                if not self._stop.is_set():
                    self.call_from_thread(self._unreachable, str(e))
            self._stop.wait(self.interval_s)

    @work(thread=True, group="status")
    def _watch_status(self) -> None:
        self._stream(lambda: self.client.watch(self.interval_s), self._show_status)

    @work(thread=True, group="rounds")
    def _watch_rounds(self) -> None:
        self._stream(
            lambda: self.client.watch_rounds("", max(self.interval_s / 2, 0.05)), self._add_rounds
        )

    def action_refresh(self) -> None:
        # NOTE: a refresh still in flight is left to finish rather than replaced, so a slow daemon
        # still gets its answers shown instead of every fetch being cancelled by the next tick.
        if not self._fetching:
            self._fetching = True
            self._fetch()

    @work(thread=True, group="router")
    def _watch_router(self) -> None:
        self._stream(lambda: self.client.watch_router(self.interval_s), self._show_router)

    @work(thread=True, group="poll")
    def _fetch(self) -> None:
        """Memory layouts, one call per instance (they change only at switches and staging)."""
        try:
            memory = []
            for name in [i["name"] for i in (self.status or {}).get("instances", [])]:
                try:
                    memory.append(as_dict(self.client.memory(name)))
                except Refused:  # not ready right now
                    continue
            try:
                plan = as_dict(self.client.plan())
            except Refused:  # the planner is off
                plan = None
        except Unreachable as e:
            if not self._stop.is_set():
                self.call_from_thread(self._unreachable, str(e))
            return
        finally:
            self._fetching = False
        if not self._stop.is_set():
            self.call_from_thread(self._show_memory, memory)
            self.call_from_thread(self._show_plan, plan)

    # ---- rendering ---------------------------------------------------------------------------

    def _unreachable(self, message: str) -> None:
        if self._stop.is_set():  # a late answer after the screen went away
            return
        if self.unreachable_since is None:
            self.unreachable_since = self.wall()
        self.error = message
        self._banner()

    def _banner(self) -> None:
        banner = self.banner
        if self.unreachable_since is not None:
            banner.update(
                Text(
                    f"daemon unreachable since {self.unreachable_since:%H:%M:%S} · {self.error}",
                    style="bold red",
                )
            )
            return
        s = self.status
        if s is None:
            return
        banner.update(
            Text(
                f"talariad {s['version']} at {s['http_endpoint']} · up {s['uptime_s']:.0f}s · "
                f"{len(s['instances'])} instances · {len(self.leases)} live leases"
            )
        )

    def _show_status(self, status: dict) -> None:
        if self._stop.is_set():  # a late answer after the screen went away
            return
        first = self.status is None
        self.status, self.unreachable_since = status, None
        if (
            first
        ):  # the memory view needs the instance names: fetch now rather than at the next tick
            self.action_refresh()
        self._banner()
        self._upsert("instances", [(i["name"], instance_row(i)) for i in status["instances"]])

    def _add_rounds(self, reply: dict) -> None:
        if self._stop.is_set():  # a late answer after the screen went away
            return
        for r in reply.get("rounds", []):
            self.rounds[(r["instance"], r["index"])] = r
        for key in sorted(self.rounds, key=lambda k: (k[0], k[1]))[: -KEEP_ROUNDS * 4]:
            del self.rounds[key]
        self.switches.extend(reply.get("switches", []))
        rows = sorted(self.rounds.values(), key=lambda r: (r["instance"], r["index"]))
        longest = max((r["wall_s"] for r in rows if not r["open"]), default=0.0)
        # an open round's active time is booked when its slots close: its wall is not measured yet
        self._replace(
            "rounds",
            [
                (
                    r["instance"],
                    f"{r['index']}{' (open)' if r['open'] else ''}",
                    "-" if r["open"] else f"{r['wall_s']:.3f}",
                    Text("-") if r["open"] else round_bar(r, longest),
                    slots_cell(r),
                    f"{r['sp_admitted']}/{r['sp_parked']}",
                )
                for r in rows
            ],
        )
        self._replace(
            "switches",
            [
                (
                    w["instance"],
                    "-" if int(w["round_index"]) < 0 else str(w["round_index"]),
                    f"{w['from_model'] or '-'} → {w['to_model']}",
                    w["path"],
                    f"{w['total_ms']:.1f}",
                    switch_bar(w),
                    mib(w["staged_bytes"]),
                    mib(w["dirty_bytes"]),
                )
                for w in self.switches
            ],
        )

    def _show_router(self, state: dict) -> None:
        if self._stop.is_set():
            return
        self.leases, self._leases_at, self.decisions = (
            state["leases"],
            self.clock(),
            state["decisions"],
        )
        self._tick_leases()
        self._replace(
            "sessions",
            [
                (
                    s["session_id"],
                    s["instance"] or "-",
                    s["model"] or "-",
                    str(s["kv_len"]),
                    f"{s['idle_s']:.1f}",
                    "yes" if s["leased"] else "no",
                )
                for s in state["sessions"]
            ],
        )
        self._replace_keyed("decisions", [(d["call_id"], decision_row(d)) for d in self.decisions])
        self._banner()

    def _show_memory(self, memory: list[dict]) -> None:
        if self._stop.is_set():
            return
        text = Text()
        for m in memory:
            text.append_text(memory_text(m))
        self.memory_view.update(text or Text("no instance ready"))

    def _show_plan(self, plan: dict | None) -> None:
        self.plan_view.update(plan_text(plan))
        self._replace("plan-moves", [plan_row(e) for e in (plan or {}).get("history", [])])

    def _tick_leases(self) -> None:
        """Leases count down between fetches; one that ran out leaves the table."""
        if self._stop.is_set():  # a late answer after the screen went away
            return
        elapsed = self.clock() - self._leases_at
        live = [le for le in self.leases if le["expires_in_s"] - elapsed > 0]
        self._upsert(
            "leases",
            [
                (
                    f"{le['session_id']}\x00{le['model']}",
                    (
                        le["session_id"],
                        le["model"],
                        le["instance"],
                        str(le["kv_len"]),
                        f"{le['expires_in_s'] - elapsed:.1f}",
                    ),
                )
                for le in live
            ],
            prune=True,
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id != "decisions" or event.row_key is None:
            return
        found = next((d for d in self.decisions if d["call_id"] == event.row_key.value), None)
        if found is not None:
            self._replace("candidates", [candidate_row(c) for c in found["candidates"]])

    def _upsert(self, table_id: str, rows: list[tuple[str, tuple]], prune: bool = False) -> None:
        """Update rows in place by key, so the cursor and sort survive a refresh."""
        table = self.tables[table_id]
        columns = [c.key for c in table.ordered_columns]
        keys = set()
        for key, row in rows:
            keys.add(key)
            cells = [
                v if isinstance(v, Text) else Text(v) for v in row
            ]  # client data is never markup
            if key in table.rows:
                for col, value in zip(columns, cells, strict=False):
                    table.update_cell(key, col, value)
            else:
                table.add_row(*cells, key=key)
        if prune:
            for key in [k for k in table.rows if k.value not in keys]:
                table.remove_row(key)

    def _replace_keyed(self, table_id: str, rows: list[tuple[str, tuple]]) -> None:
        """Replace every row in the given order, keeping the cursor on the same key."""
        table = self.tables[table_id]
        selected = None
        if table.row_count:
            selected = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        table.clear()
        for key, row in rows:
            table.add_row(*(Text(v) for v in row), key=key)
        index = next((i for i, (key, _) in enumerate(rows) if key == selected), None)
        if index is not None:
            table.move_cursor(row=index, animate=False)

    def _replace(self, table_id: str, rows: list[tuple]) -> None:
        table = self.tables[table_id]
        table.clear()
        for row in rows:
            table.add_row(*(v if isinstance(v, Text) else Text(v) for v in row))

    # ---- actions -----------------------------------------------------------------------------

    def _selected(self, table_id: str) -> str | None:
        table = self.tables[table_id]
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def action_instance(self, verb: str) -> None:
        if self.tabs.active != "tab-instances":
            return
        name = self._selected("instances")
        if name is None:
            return
        self.push_screen(
            Confirm(f"{verb} instance {name}?"),
            lambda yes: self._act(lambda: self.client.instance_action(verb, name)) if yes else None,
        )

    def action_revoke(self) -> None:
        if self.tabs.active != "tab-leases":
            return
        key = self._selected("leases")
        if key is None:
            return
        session, model = key.split("\x00")
        self.push_screen(
            Confirm(f"Revoke the lease of session {session} on {model}?"),
            lambda yes: self._act(lambda: self.client.revoke(session, model)) if yes else None,
        )

    @work(thread=True, group="action")
    def _act(self, action: Callable) -> None:
        try:
            action()
        except (Unreachable, Refused) as e:
            self.call_from_thread(self.notify, str(e), severity="error")
            return
        self.call_from_thread(self.notify, "done")
        self.call_from_thread(self.action_refresh)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="talaria-tui", description="Live dashboard of a running talariad."
    )
    p.add_argument(
        "--socket",
        default=None,
        help="admin socket path (default: $TALARIA_SOCKET, /run/talaria/admin.sock when the service "
        "runs, else $XDG_RUNTIME_DIR/talaria/admin.sock)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="refresh interval in seconds")
    args = p.parse_args(argv)
    if not args.interval >= 0.1:  # also refuses nan
        print("talaria-tui: --interval must be at least 0.1", file=sys.stderr)
        sys.exit(2)
    Dashboard(AdminClient(args.socket or default_socket()), args.interval).run()
