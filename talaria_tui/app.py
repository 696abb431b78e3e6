"""`talaria-tui`: a live dashboard over the admin API (instances for now; rounds, switches and
leases join as their telemetry lands)."""

from __future__ import annotations

import argparse
import sys

from textual import work
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Footer, Header, Static

from talaria_ctl.client import DEFAULT_SOCKET, AdminClient, Unreachable, as_dict

COLUMNS = ("instance", "pool", "executor", "models", "active", "state", "healthy", "running", "queued", "restarts")


class Dashboard(App):
    TITLE = "Talaria"
    BINDINGS = [("q", "quit", "Quit"), ("r", "refresh", "Refresh now")]
    CSS = "#banner { height: 1; padding: 0 1; } DataTable { height: 1fr; }"

    def __init__(self, client: AdminClient, interval_s: float = 1.0):
        super().__init__()
        self.client, self.interval_s = client, interval_s

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("connecting…", id="banner")
        yield DataTable(id="instances", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#instances", DataTable)
        for col in COLUMNS:
            table.add_column(col, key=col)
        self.action_refresh()
        self.set_interval(self.interval_s, self.action_refresh)

    def action_refresh(self) -> None:
        self._fetch()

    @work(thread=True, exclusive=True)
    def _fetch(self) -> None:
        try:
            data = as_dict(self.client.status())
        except Unreachable as e:
            self.call_from_thread(self._show_error, str(e))
            return
        self.call_from_thread(self._show, data)

    def _show_error(self, message: str) -> None:
        self.query_one("#banner", Static).update(f"[red]{message}[/]")

    def _show(self, data: dict) -> None:
        self.query_one("#banner", Static).update(
            f"{data['http_endpoint']}  ·  up {data['uptime_s']:.0f}s  ·  talariad {data['version']}")
        table = self.query_one("#instances", DataTable)
        for i in data["instances"]:
            row = (i["name"], i["pool"], i["executor"], ",".join(i["models"]), i["active_model"] or "-", i["state"],
                   "yes" if i["healthy"] else "no", str(i["running"]), str(i["queued"]), str(i["restarts"]))
            if i["name"] in table.rows:
                for col, value in zip(COLUMNS, row):
                    table.update_cell(i["name"], col, value)
            else:
                table.add_row(*row, key=i["name"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="talaria-tui", description="Live dashboard of a running talariad.")
    p.add_argument("--socket", default=DEFAULT_SOCKET, help="admin socket path (default: %(default)s)")
    p.add_argument("--interval", type=float, default=1.0, help="refresh interval in seconds")
    args = p.parse_args(argv)
    if args.interval < 0.1:
        print("talaria-tui: --interval must be at least 0.1", file=sys.stderr)
        sys.exit(2)
    Dashboard(AdminClient(args.socket), args.interval).run()
