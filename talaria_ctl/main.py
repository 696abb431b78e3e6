"""`talaria-ctl`: administer a running talariad over its gRPC admin socket.

Exit codes: 0 ok, 1 daemon unreachable, 2 usage error.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from talaria_ctl.client import DEFAULT_SOCKET, AdminClient, Unreachable, status_dict

app = typer.Typer(no_args_is_help=True, add_completion=True, help="Administer a running talariad.")


@app.callback()
def _global(ctx: typer.Context,
            socket: Annotated[str, typer.Option(envvar="TALARIA_SOCKET", help="Admin socket path")] = DEFAULT_SOCKET,
            timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the daemon")] = 3.0) -> None:
    ctx.obj = AdminClient(socket, timeout)


def _instances_table(data: dict) -> Table:
    t = Table(title=f"talariad {data['version']} at {data['http_endpoint']} (up {data['uptime_s']:.0f}s)",
              box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("instance", "pool", "executor", "models", "active", "state", "healthy", "run/queue", "restarts"):
        t.add_column(col, no_wrap=True)
    for i in data["instances"]:
        t.add_row(i["name"], i["pool"], f"{i['executor']}@{i['devices']}", ", ".join(i["models"]),
                  i["active_model"] or "-", i["state"], "yes" if i["healthy"] else "no",
                  f"{i['running']}/{i['queued']}", str(i["restarts"]))
    return t


@app.command()
def status(ctx: typer.Context,
           as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document")] = False) -> None:
    """Instances, their pool, models and health."""
    try:
        data = status_dict(ctx.obj.status())
    except Unreachable as e:
        print(f"talaria-ctl: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        # A pipe gets the full table rather than Rich's 80-column default.
        Console(width=None if sys.stdout.isatty() else 200).print(_instances_table(data))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
