"""`talaria-tui`: a live dashboard over the admin API: instances, leases and routing decisions."""

from __future__ import annotations

import argparse
import sys

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Footer, Header, Static, TabbedContent, TabPane

from talaria_ctl.client import DEFAULT_SOCKET, AdminClient, Refused, Unreachable, as_dict

INSTANCE_COLUMNS = ("instance", "pool", "executor", "models", "active", "state", "healthy", "running", "queued",
                    "restarts")
LEASE_COLUMNS = ("session", "model", "instance", "kv_len", "expires_in_s")
DECISION_COLUMNS = ("call", "kind", "instance", "age_s", "reason")


def _instance_row(i: dict) -> tuple:
    return (i["name"], i["pool"], i["executor"], ",".join(i["models"]), i["active_model"] or "-", i["state"],
            "yes" if i["healthy"] else "no", str(i["running"]), str(i["queued"]), str(i["restarts"]))


def _lease_row(le: dict) -> tuple:
    return (le["session_id"], le["model"], le["instance"], str(le["kv_len"]), f"{le['expires_in_s']:.2f}")


def _decision_row(d: dict) -> tuple:
    return (d["call_id"], d["kind"], d["instance"] or "-", f"{d['age_s']:.1f}", d["reason"])


class Dashboard(App):
    TITLE = "Talaria"
    BINDINGS = [("q", "quit", "Quit"), ("r", "refresh", "Refresh now")]
    CSS = "#banner { height: 1; padding: 0 1; } DataTable { height: 1fr; }"

    def __init__(self, client: AdminClient, interval_s: float = 1.0):
        super().__init__()
        self.client, self.interval_s = client, interval_s
        self._fetching = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("connecting…", id="banner")
        with TabbedContent():
            with TabPane("Instances", id="tab-instances"):
                yield DataTable(id="instances", zebra_stripes=True)
            with TabPane("Leases", id="tab-leases"):
                yield DataTable(id="leases", zebra_stripes=True)
            with TabPane("Decisions", id="tab-decisions"):
                yield DataTable(id="decisions", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        for table_id, columns in (("instances", INSTANCE_COLUMNS), ("leases", LEASE_COLUMNS),
                                  ("decisions", DECISION_COLUMNS)):
            table = self.query_one(f"#{table_id}", DataTable)
            for col in columns:
                table.add_column(col, key=col)
        self.action_refresh()
        self.set_interval(self.interval_s, self.action_refresh)

    def action_refresh(self) -> None:
        # NOTE: a refresh still in flight is left to finish rather than replaced, so a slow daemon
        # still gets its answers shown instead of every fetch being cancelled by the next tick.
        if not self._fetching:
            self._fetching = True
            self._fetch()

    @work(thread=True)
    def _fetch(self) -> None:
        try:
            status = as_dict(self.client.status())
            leases = as_dict(self.client.leases()).get("leases", [])
            decisions = as_dict(self.client.decisions(50)).get("decisions", [])
        except (Unreachable, Refused) as e:
            self.call_from_thread(self._show_error, str(e))
            return
        finally:
            self._fetching = False
        self.call_from_thread(self._show, status, leases, decisions)

    def _show_error(self, message: str) -> None:
        self.query_one("#banner", Static).update(Text(message, style="red"))

    def _show(self, status: dict, leases: list[dict], decisions: list[dict]) -> None:
        self.query_one("#banner", Static).update(Text(
            f"{status['http_endpoint']}  ·  up {status['uptime_s']:.0f}s  ·  talariad {status['version']}"
            f"  ·  {len(leases)} live leases"))
        self._upsert("instances", [(i["name"], _instance_row(i)) for i in status["instances"]])
        self._replace("leases", [_lease_row(le) for le in leases])
        self._replace("decisions", [_decision_row(d) for d in decisions])

    def _upsert(self, table_id: str, rows: list[tuple[str, tuple]]) -> None:
        """Update rows in place by key, so the cursor and sort survive a refresh."""
        table = self.query_one(f"#{table_id}", DataTable)
        columns = [c.key for c in table.ordered_columns]
        for key, row in rows:
            cells = [Text(v) for v in row]  # client data (session ids, reasons) is never markup
            if key in table.rows:
                for col, value in zip(columns, cells):
                    table.update_cell(key, col, value)
            else:
                table.add_row(*cells, key=key)

    def _replace(self, table_id: str, rows: list[tuple]) -> None:
        table = self.query_one(f"#{table_id}", DataTable)
        table.clear()
        for row in rows:
            table.add_row(*(Text(v) for v in row))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="talaria-tui", description="Live dashboard of a running talariad.")
    p.add_argument("--socket", default=DEFAULT_SOCKET, help="admin socket path (default: %(default)s)")
    p.add_argument("--interval", type=float, default=1.0, help="refresh interval in seconds")
    args = p.parse_args(argv)
    if not args.interval >= 0.1:  # also refuses nan
        print("talaria-tui: --interval must be at least 0.1", file=sys.stderr)
        sys.exit(2)
    Dashboard(AdminClient(args.socket), args.interval).run()
