"""`talaria-ctl`: administer a running talariad over its gRPC admin socket.

Exit codes: 0 ok, 1 daemon unreachable, 2 usage error, 3 refused (unknown id, bad argument).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from talariad.cliutil import run_app
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from talaria_ctl.client import DEFAULT_SOCKET, AdminClient, Refused, Unreachable, as_dict

app = typer.Typer(no_args_is_help=True, add_completion=True, help="Administer a running talariad.")
session_app = typer.Typer(no_args_is_help=True, help="The router's session table.")
lease_app = typer.Typer(no_args_is_help=True, help="Live soft reservations.")
call_app = typer.Typer(no_args_is_help=True, help="Routing decisions: where calls went and why.")
app.add_typer(session_app, name="session")
app.add_typer(lease_app, name="lease")
app.add_typer(call_app, name="call")
instance_app = typer.Typer(no_args_is_help=True, help="One instance: its managed device memory.")
app.add_typer(instance_app, name="instance")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document")]


@app.callback()
def _global(ctx: typer.Context,
            socket: Annotated[str, typer.Option(envvar="TALARIA_SOCKET", help="Admin socket path")] = DEFAULT_SOCKET,
            timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the daemon")] = 3.0) -> None:
    ctx.obj = AdminClient(socket, timeout)


def _fetch(fn: Callable):
    try:
        return as_dict(fn())
    except Unreachable as e:
        print(f"talaria-ctl: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    except Refused as e:
        print(f"talaria-ctl: {e}", file=sys.stderr)
        raise typer.Exit(3) from None


def _cell(v) -> Text:
    # Text, not str: session ids and reasons are client data, never Rich markup
    return Text(f"{v:.3f}" if isinstance(v, float) else str(v))


def _table(title: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    t = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left")
    for col in columns:
        t.add_column(col, no_wrap=True)
    for row in rows:
        t.add_row(*(_cell(v) for v in row))
    # A pipe gets the full table rather than Rich's 80-column default.
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def _json(data) -> None:
    print(json.dumps(data, indent=2))


@app.command()
def status(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Instances, their pool, models and health."""
    data = _fetch(ctx.obj.status)
    if as_json:
        return _json(data)
    _table(f"talariad {data['version']} at {data['http_endpoint']} (up {data['uptime_s']:.0f}s)",
           ("instance", "pool", "executor", "models", "active", "state", "healthy", "run/queue", "restarts"),
           [(i["name"], i["pool"], f"{i['executor']}@{i['devices']}", ", ".join(i["models"]),
             i["active_model"] or "-", i["state"], "yes" if i["healthy"] else "no",
             f"{i['running']}/{i['queued']}", i["restarts"]) for i in data["instances"]])


@session_app.command("list")
def session_list(ctx: typer.Context, as_json: JsonOpt = False,
                 limit: Annotated[int, typer.Option(min=0, help="Most recent N (0: all)")] = 50) -> None:
    """Sessions: last instance, model, KV length, idle time, lease."""
    rows = _fetch(lambda: ctx.obj.sessions(limit)).get("sessions", [])
    if as_json:
        return _json(rows)
    _table("sessions", ("session", "instance", "model", "kv_len", "idle_s", "leased"),
           [(r["session_id"], r["instance"], r["model"], r["kv_len"], r["idle_s"], r["leased"]) for r in rows])


@lease_app.command("list")
def lease_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Live soft reservations and when they expire."""
    rows = _fetch(ctx.obj.leases).get("leases", [])
    if as_json:
        return _json(rows)
    _table("leases", ("session", "model", "instance", "kv_len", "expires_in_s"),
           [(r["session_id"], r["model"], r["instance"], r["kv_len"], r["expires_in_s"]) for r in rows])


def _candidates(d: dict) -> None:
    _table(f"{d['call_id']}: {d['kind']} → {d['instance'] or '(not placed)'} [{d['policy']}] {d['reason']}",
           ("instance", "queue", "prefill", "decode", "kv", "activation", "total", "kv_state", "feasible"),
           [(c["instance"], c["queue_s"], c["prefill_s"], c["decode_s"], c["kv_recovery_s"], c["activation_s"],
             c["total_s"], c["kv_state"], "yes" if c["feasible"] else c["reason"]) for c in d.get("candidates", [])])


@call_app.command("explain")
def call_explain(ctx: typer.Context, call_id: Annotated[str, typer.Argument(help="Response id or call id")],
                 as_json: JsonOpt = False) -> None:
    """Why one call went where it did: decision kind and Eq. (1) per candidate."""
    data = _fetch(lambda: ctx.obj.explain(call_id))
    return _json(data) if as_json else _candidates(data)


@call_app.command("recent")
def call_recent(ctx: typer.Context, as_json: JsonOpt = False,
                limit: Annotated[int, typer.Option(min=1, max=4096, help="How many")] = 20) -> None:
    """The latest routing decisions, newest first."""
    rows = _fetch(lambda: ctx.obj.decisions(limit)).get("decisions", [])
    if as_json:
        return _json(rows)
    _table("recent decisions", ("call", "kind", "instance", "age_s", "reason"),
           [(r["call_id"], r["kind"], r["instance"] or "-", r["age_s"], r["reason"]) for r in rows])


def _mib(n) -> str:
    return f"{int(n) / 2**20:.1f}"


@instance_app.command("memory")
def instance_memory(ctx: typer.Context, name: Annotated[str, typer.Argument(help="Instance name")],
                    as_json: JsonOpt = False) -> None:
    """HBM layout (region, offset, size, owner) and the latest switch records with their phases."""
    data = _fetch(lambda: ctx.obj.memory(name))
    if as_json:
        return _json(data)
    if not data.get("managed"):
        print(f"{name}: this executor keeps no managed device memory")
        return
    _table(f"{name}: {_mib(data['capacity_bytes'])} MiB managed, active {data['active_model'] or '-'}, "
           f"free {_mib(data['hbm_free_bytes'])} MiB, staging slack {_mib(data['staging_slack_bytes'])} MiB",
           ("region", "offset MiB", "size MiB", "owner"),
           [(r["region"], _mib(r["offset"]), _mib(r["size"]), r["owner"]) for r in data.get("layout", [])])
    _table("switches (latest last)", ("from", "to", "path", "total ms", "phases ms", "staged MiB", "dirty MiB"),
           [(w["from_model"] or "-", w["to_model"], w["path"], w["total_ms"],
             " / ".join(f"{x:.1f}" for x in w["phase_ms"]), _mib(w["staged_bytes"]), _mib(w["dirty_bytes"]))
            for w in data.get("switches", [])])


def main() -> None:
    run_app(app, "talaria-ctl")


if __name__ == "__main__":
    main()
