"""`talaria-ctl`: administer a running talariad over its gRPC admin socket.

Exit codes: 0 ok, 1 daemon unreachable, 2 usage error, 3 refused (unknown name or id, bad
argument, or an action that cannot apply now).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer
import yaml

from talariad.cliutil import run_app
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from talariad.admin.client import (
    CANDIDATE_COLUMNS,
    AdminClient,
    Refused,
    Unreachable,
    as_dict,
    default_socket,
)
from talariad import __version__
from talariad.types import SWITCH_PHASES

EPILOG = "Exit codes: 0 ok, 1 daemon unreachable, 2 usage error, 3 refused."
app = typer.Typer(
    no_args_is_help=True, add_completion=True, help="Administer a running talariad.", epilog=EPILOG
)
session_app = typer.Typer(no_args_is_help=True, help="The router's session table.")
lease_app = typer.Typer(no_args_is_help=True, help="Live soft reservations.")
call_app = typer.Typer(no_args_is_help=True, help="Routing decisions: where calls went and why.")
instance_app = typer.Typer(
    no_args_is_help=True, help="Instances: state, memory, rounds; drain, cordon, restart."
)
pool_app = typer.Typer(
    no_args_is_help=True, help="The hot and cold pools; move an instance between them."
)
model_app = typer.Typer(
    no_args_is_help=True, help="Models: where each is served; pin, load, unload."
)
config_app = typer.Typer(no_args_is_help=True, help="The daemon's config: show it, reload it.")
for sub, name in (
    (session_app, "session"),
    (lease_app, "lease"),
    (call_app, "call"),
    (instance_app, "instance"),
    (pool_app, "pool"),
    (model_app, "model"),
    (config_app, "config"),
):
    app.add_typer(sub, name=name)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document")]
InstanceArg = Annotated[str, typer.Argument(help="Instance name")]
ModelArg = Annotated[str, typer.Argument(help="Model name")]
OnOpt = Annotated[str, typer.Option("--on", help="Instance name")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Even when it leaves a model with no instance to take its calls (503)"
    ),
]


def _version(value: bool) -> None:
    if value:
        print(f"talaria-ctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global(
    ctx: typer.Context,
    socket: Annotated[
        str | None,
        typer.Option(
            envvar="TALARIA_SOCKET",
            show_default=False,
            help="Admin socket path [default: /run/talaria/admin.sock when the service runs, else "
            "$XDG_RUNTIME_DIR/talaria/admin.sock, else ~/.local/state/talaria/admin.sock]",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the daemon")] = 3.0,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    ctx.obj = AdminClient(socket or default_socket(), timeout)


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
    _table(
        f"talariad {data['version']} at {data['http_endpoint']} (up {data['uptime_s']:.0f}s)",
        INSTANCE_COLUMNS,
        [_instance_row(i) for i in data["instances"]],
    )


@session_app.command("list")
def session_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(min=0, help="Most recent N (0: all)")] = 50,
) -> None:
    """Sessions: last instance, model, KV length, idle time, lease."""
    rows = _fetch(lambda: ctx.obj.sessions(limit)).get("sessions", [])
    if as_json:
        return _json(rows)
    _table(
        "sessions",
        ("session", "instance", "model", "kv_len", "idle_s", "leased"),
        [
            (r["session_id"], r["instance"], r["model"], r["kv_len"], r["idle_s"], r["leased"])
            for r in rows
        ],
    )


@lease_app.command("list")
def lease_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Live soft reservations and when they expire."""
    rows = _fetch(ctx.obj.leases).get("leases", [])
    if as_json:
        return _json(rows)
    _table(
        "leases",
        ("session", "model", "instance", "kv_len", "expires_in_s"),
        [
            (r["session_id"], r["model"], r["instance"], r["kv_len"], r["expires_in_s"])
            for r in rows
        ],
    )


def _candidates(d: dict) -> None:
    _table(
        f"{d['call_id']}: {d['kind']} → {d['instance'] or '(not placed)'} [{d['policy']}] {d['reason']}",
        CANDIDATE_COLUMNS,
        [
            (
                c["instance"],
                c["queue_s"],
                c["prefill_s"],
                c["decode_s"],
                c["kv_recovery_s"],
                c["activation_s"],
                c["total_s"],
                c.get("replica_s", 0.0),
                c.get("contention_s", 0.0),
                c["kv_state"],
                "yes" if c["feasible"] else c["reason"],
            )
            for c in d.get("candidates", [])
        ],
    )


@call_app.command("explain")
def call_explain(
    ctx: typer.Context,
    call_id: Annotated[str, typer.Argument(help="Response id or call id")],
    as_json: JsonOpt = False,
) -> None:
    """Why one call went where it did: decision kind and Eq. (1) per candidate."""
    data = _fetch(lambda: ctx.obj.explain(call_id))
    return _json(data) if as_json else _candidates(data)


@call_app.command("recent")
def call_recent(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(min=1, max=4096, help="How many")] = 20,
) -> None:
    """The latest routing decisions, newest first."""
    rows = _fetch(lambda: ctx.obj.decisions(limit)).get("decisions", [])
    if as_json:
        return _json(rows)
    _table(
        "recent decisions",
        ("call", "kind", "instance", "age_s", "reason"),
        [(r["call_id"], r["kind"], r["instance"] or "-", r["age_s"], r["reason"]) for r in rows],
    )


def _mib(n) -> str:
    return f"{int(n) / 2**20:.1f}"


def _rotation(i: dict) -> str:
    """The models it serves, and those the router retired from its rotation (resident, idle)."""
    text = ", ".join(i["rotation"]) or "-"
    retired = i.get("retired") or []
    return f"{text} (retired: {', '.join(retired)})" if retired else text


def _instance_row(i: dict) -> tuple:
    return (
        i["name"],
        i["pool"],
        f"{i['executor']}@{i['devices']}",
        _rotation(i),
        i["active_model"] or "-",
        i["state"],
        i["admission"],
        "yes" if i["healthy"] else "no",
        f"{i['running']}/{i['queued']}",
        i["restarts"],
    )


INSTANCE_COLUMNS = (
    "instance",
    "pool",
    "executor",
    "serving",
    "active",
    "state",
    "admission",
    "healthy",
    "run/queue",
    "restarts",
)


@instance_app.command("list")
def instance_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every instance: pool, models served now, state, admission, load."""
    rows = _fetch(ctx.obj.status).get("instances", [])
    if as_json:
        return _json(rows)
    _table("instances", INSTANCE_COLUMNS, [_instance_row(i) for i in rows])


@instance_app.command("show")
def instance_show(ctx: typer.Context, name: InstanceArg, as_json: JsonOpt = False) -> None:
    """One instance's state."""
    rows = [i for i in _fetch(ctx.obj.status).get("instances", []) if i["name"] == name]
    if not rows:
        print(f"talaria-ctl: no instance named {name!r}", file=sys.stderr)
        raise typer.Exit(3)
    if as_json:
        return _json(rows[0])
    _table(name, INSTANCE_COLUMNS, [_instance_row(rows[0])])


def _instance_action(
    ctx: typer.Context, verb: str, name: str, as_json: bool, force: bool = False
) -> None:
    data = _fetch(lambda: ctx.obj.instance_action(verb, name, force))
    if as_json:
        return _json(data)
    _table(f"{verb.lower()} {name}", INSTANCE_COLUMNS, [_instance_row(data)])


@instance_app.command("drain")
def instance_drain(
    ctx: typer.Context, name: InstanceArg, as_json: JsonOpt = False, force: ForceOpt = False
) -> None:
    """Finish in-flight and queued calls, place nothing new; its leases lapse. The last instance
    taking a model's calls needs --force."""
    _instance_action(ctx, "Drain", name, as_json, force)


@instance_app.command("undrain")
def instance_undrain(ctx: typer.Context, name: InstanceArg, as_json: JsonOpt = False) -> None:
    """Place new calls on the instance again (ends drain and cordon)."""
    _instance_action(ctx, "Undrain", name, as_json)


@instance_app.command("cordon")
def instance_cordon(
    ctx: typer.Context, name: InstanceArg, as_json: JsonOpt = False, force: ForceOpt = False
) -> None:
    """Place nothing new on the instance, but keep serving its leases. The last instance taking
    a model's calls needs --force."""
    _instance_action(ctx, "Cordon", name, as_json, force)


@instance_app.command("restart")
def instance_restart(ctx: typer.Context, name: InstanceArg, as_json: JsonOpt = False) -> None:
    """Restart the instance process now (no backoff); answers once it is ready again."""
    _instance_action(ctx, "Restart", name, as_json)


def _dash(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None or (isinstance(v, (int, float)) and v < 0) else fmt.format(v)


def _phase_cell(phases: list[dict]) -> str:
    return "  ".join(f"{p['name']} {p['ms']:.1f}" for p in phases) if phases else "-"


@instance_app.command("rounds")
def instance_rounds(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Instance (default: all cold)")] = "",
    limit: Annotated[int, typer.Option(min=1, max=4096, help="Latest N rounds")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Per-round records: wall = active + switch, slots with their phases, SP admitted/parked.
    An open round's active time is booked when its slots close, so its wall prints `-`."""
    data = _fetch(lambda: ctx.obj.rounds(name, limit))
    if as_json:
        return _json(data)
    _table(
        "rounds (latest last)",
        ("instance", "round", "wall s", "active s", "switch s", "slots", "SP adm/park"),
        [
            (
                r["instance"],
                f"{r['index']}{' (open)' if r['open'] else ''}",
                *(("-", "-") if r["open"] else (r["wall_s"], r["active_s"])),
                r["switch_s"],
                "; ".join(
                    f"{s['model']}: "
                    + " ".join(f"{p['phase']} {p['seconds']:.3f}" for p in s["phases"])
                    for s in r["slots"]
                )
                or "-",
                f"{r['sp_admitted']}/{r['sp_parked']}",
            )
            for r in data.get("rounds", [])
        ],
    )
    _switch_table(data.get("switches", []))


def _switch_table(switches: list[dict]) -> None:
    _table(
        "switches (latest last; phases in ms)",
        (
            "instance",
            "round",
            "from",
            "to",
            "path",
            "total ms",
            "phases",
            "staged MiB",
            "dirty MiB",
        ),
        [
            (
                w["instance"],
                _dash(w["round_index"], "{}"),
                w["from_model"] or "-",
                w["to_model"],
                w["path"],
                f"{w['total_ms']:.1f}",
                _phase_cell(w["phases"]),
                _dash_mib(w["staged_bytes"]),
                _dash_mib(w["dirty_bytes"]),
            )
            for w in switches
        ],
    )


def _dash_mib(n) -> str:
    return "-" if n is None or int(n) < 0 else _mib(n)


def _disjoint(layout: list[dict]) -> list[dict]:
    """Layout rows with the KV pool cut around the staged chunks that lie inside it, so every
    byte is in one row (the API lists the pool whole and its staged chunks as sub-regions)."""
    inner = sorted(
        (r for r in layout if r["region"].startswith("staged[")), key=lambda r: int(r["offset"])
    )
    out = []
    for row in layout:
        if row["region"].startswith("staged["):
            continue
        if row["region"] != "kv_pool":
            out.append(row)
            continue
        at, end = int(row["offset"]), int(row["offset"]) + int(row["size"])
        for chunk in (c for c in inner if at <= int(c["offset"]) < end):
            if int(chunk["offset"]) > at:
                out.append({**row, "offset": at, "size": int(chunk["offset"]) - at})
            out.append(chunk)
            at = int(chunk["offset"]) + int(chunk["size"])
        if at < end:
            out.append({**row, "offset": at, "size": end - at})
    return out


@instance_app.command("memory")
def instance_memory(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Instance name")],
    as_json: JsonOpt = False,
) -> None:
    """HBM layout (region, offset, size, owner) and the latest switch records with their phases.
    A switch's total is the wall time its round paid for it (as `instance rounds` shows it); the
    five phases are the memory substrate's part of it."""
    data = _fetch(lambda: ctx.obj.memory(name))
    if as_json:
        return _json(data)
    proc = data.get("process") or {}
    if proc.get("pid"):
        print(
            f"{name}: process {proc['pid']}, rss {_mib(proc['rss_bytes'])} MiB, "
            f"{proc['open_files']} open files, {proc['asyncio_tasks']} asyncio tasks, "
            f"{proc['gc_objects']} tracked objects"
        )
    if not data.get("managed"):
        print(f"{name}: this executor keeps no managed device memory")
        return
    _table(
        f"{name}: {_mib(data['capacity_bytes'])} MiB managed, active {data['active_model'] or '-'}, "
        f"free {_mib(data['hbm_free_bytes'])} MiB, staging slack {_mib(data['staging_slack_bytes'])} MiB",
        ("region", "offset MiB", "size MiB", "owner"),
        [
            (r["region"], _mib(r["offset"]), _mib(r["size"]), r["owner"])
            for r in _disjoint(data.get("layout", []))
        ],
    )
    _table(
        f"host KV: {_mib(data['host_kv_bytes'])} of {_mib(data['host_kv_capacity_bytes'])} MiB",
        ("model", "MiB"),
        [(m, _mib(n)) for m, n in sorted(data.get("host_kv_by_model", {}).items())],
    )
    _table(
        "switches (latest last; phases in ms)",
        ("from", "to", "path", "total ms", *SWITCH_PHASES, "staged MiB", "dirty MiB"),
        [
            (
                w["from_model"] or "-",
                w["to_model"],
                w["path"],
                f"{w['total_ms']:.1f}",
                *(f"{x:.1f}" for x in w["phase_ms"]),
                _mib(w["staged_bytes"]),
                _mib(w["dirty_bytes"]),
            )
            for w in data.get("switches", [])
        ],
    )


# ---- pools -----------------------------------------------------------------------------------


@pool_app.command("list")
def pool_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Both pools: their instances, models and load."""
    rows = _fetch(ctx.obj.pools).get("pools", [])
    if as_json:
        return _json(rows)
    _table(
        "pools",
        ("pool", "instances", "models", "running", "queued"),
        [
            (
                p["name"],
                ", ".join(p["instances"]) or "-",
                ", ".join(p["models"]) or "-",
                p["running"],
                p["queued"],
            )
            for p in rows
        ],
    )


@pool_app.command("show")
def pool_show(
    ctx: typer.Context,
    pool: Annotated[str, typer.Argument(help="hot or cold")],
    as_json: JsonOpt = False,
) -> None:
    """One pool's instances."""
    if pool not in ("hot", "cold"):
        raise typer.BadParameter(f"pool must be hot or cold, not {pool!r}")
    data = _fetch(ctx.obj.status)
    rows = [i for i in data["instances"] if i["pool"] == pool]
    if as_json:
        return _json(rows)
    _table(f"{pool} pool", INSTANCE_COLUMNS, [_instance_row(i) for i in rows])


@pool_app.command("move")
def pool_move(
    ctx: typer.Context,
    name: InstanceArg,
    to: Annotated[str, typer.Option("--to", help="hot or cold")],
    model: Annotated[
        str, typer.Option(help="Moving to hot: the model to pin (default: the active one)")
    ] = "",
    as_json: JsonOpt = False,
    force: ForceOpt = False,
) -> None:
    """Drain the instance, restart it in the other pool, and place calls on it again. The last
    instance taking a model's calls needs --force."""
    if to not in ("hot", "cold"):
        raise typer.BadParameter(f"--to must be hot or cold, not {to!r}")
    data = _fetch(lambda: ctx.obj.move(name, to, model, force))
    if as_json:
        return _json(data)
    _table(f"moved {name}", INSTANCE_COLUMNS, [_instance_row(data)])


# ---- models ----------------------------------------------------------------------------------

MODEL_COLUMNS = ("model", "status", "served by", "pinned on", "max context", "profile")


def _model_row(m: dict) -> tuple:
    return (
        m["name"],
        m["status"],
        ", ".join(m["instances"]) or "-",
        ", ".join(m["pinned_on"]) or "-",
        m["max_context"],
        m["profile"] or "-",
    )


@model_app.command("list")
def model_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every model: where it is served now and its residency."""
    rows = _fetch(ctx.obj.models).get("models", [])
    if as_json:
        return _json(rows)
    _table("models", MODEL_COLUMNS, [_model_row(m) for m in rows])


@model_app.command("show")
def model_show(ctx: typer.Context, model: ModelArg, as_json: JsonOpt = False) -> None:
    """One model."""
    rows = [m for m in _fetch(ctx.obj.models).get("models", []) if m["name"] == model]
    if not rows:
        print(f"talaria-ctl: no model named {model!r}", file=sys.stderr)
        raise typer.Exit(3)
    if as_json:
        return _json(rows[0])
    _table(model, MODEL_COLUMNS, [_model_row(rows[0])])


def _model_action(
    ctx: typer.Context, verb: str, model: str, on: str, as_json: bool, force: bool = False
) -> None:
    data = _fetch(lambda: ctx.obj.model_action(verb, model, on, force))
    if as_json:
        return _json(data)
    _table(f"{verb.lower()} {model} on {on}", MODEL_COLUMNS, [_model_row(data)])


@model_app.command("pin")
def model_pin(
    ctx: typer.Context,
    model: ModelArg,
    on: OnOpt,
    as_json: JsonOpt = False,
    force: ForceOpt = False,
) -> None:
    """Make a hot instance serve MODEL (it drains and restarts when it pins another)."""
    _model_action(ctx, "Pin", model, on, as_json, force)


@model_app.command("unpin")
def model_unpin(
    ctx: typer.Context,
    model: ModelArg,
    on: OnOpt,
    as_json: JsonOpt = False,
    force: ForceOpt = False,
) -> None:
    """Return a hot instance to the model its config pins."""
    _model_action(ctx, "Unpin", model, on, as_json, force)


@model_app.command("load")
def model_load(ctx: typer.Context, model: ModelArg, on: OnOpt, as_json: JsonOpt = False) -> None:
    """Add MODEL back to a cold instance's rotation."""
    _model_action(ctx, "Load", model, on, as_json)


@model_app.command("unload")
def model_unload(
    ctx: typer.Context,
    model: ModelArg,
    on: OnOpt,
    as_json: JsonOpt = False,
    force: ForceOpt = False,
) -> None:
    """Remove MODEL from a cold instance's rotation and free its staged region. The last instance
    taking MODEL's calls needs --force."""
    _model_action(ctx, "Unload", model, on, as_json, force)


# ---- leases, sessions, config ------------------------------------------------------------------


@lease_app.command("revoke")
def lease_revoke(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id")],
    model: Annotated[str, typer.Option(help="Only the lease for this model")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Drop a session's live lease(s); prints the session's leases left. An unknown session is
    refused (exit 3)."""
    rows = _fetch(lambda: ctx.obj.revoke(session_id, model)).get("leases", [])
    if as_json:
        return _json(rows)
    _table(
        f"leases of {session_id} left",
        ("session", "model", "instance", "kv_len", "expires_in_s"),
        [
            (r["session_id"], r["model"], r["instance"], r["kv_len"], r["expires_in_s"])
            for r in rows
        ],
    )


@session_app.command("show")
def session_show(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id")],
    as_json: JsonOpt = False,
) -> None:
    """One session's row."""
    rows = [
        r
        for r in _fetch(lambda: ctx.obj.sessions(0)).get("sessions", [])
        if r["session_id"] == session_id
    ]
    if not rows:
        print(f"talaria-ctl: no session {session_id!r} in the router's table", file=sys.stderr)
        raise typer.Exit(3)
    if as_json:
        return _json(rows[0])
    r = rows[0]
    _table(
        session_id,
        ("instance", "model", "kv_len", "idle_s", "leased"),
        [(r["instance"], r["model"], r["kv_len"], r["idle_s"], r["leased"])],
    )


@session_app.command("forget")
def session_forget(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="Session id")],
    as_json: JsonOpt = False,
) -> None:
    """Forget a session: its row, leases, and its KV on every instance. An unknown session is
    refused (exit 3)."""
    data = _fetch(lambda: ctx.obj.forget(session_id))
    if as_json:
        return _json(data)
    print(
        f"{session_id}: {'forgotten' if data['known'] else 'was not known'}; {data['leases_dropped']} leases "
        f"dropped; KV freed on {', '.join(data['instances_freed']) or 'no instance'}"
    )


@config_app.command("show")
def config_show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The config in effect (with run-time pool moves and pins) as YAML (--json: as JSON)."""
    data = _fetch(ctx.obj.config)
    if as_json:
        return _json(yaml.safe_load(data["yaml"]))
    print(f"# {data['path']}\n{data['yaml']}", end="")


@config_app.command("reload")
def config_reload(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Re-read the config file; apply what can change live, list what needs a restart."""
    data = _fetch(ctx.obj.reload)
    if as_json:
        return _json(data)
    print("applied: " + (", ".join(data["applied"]) or "nothing changed"))
    if data["needs_restart"]:
        print("needs a restart: " + ", ".join(data["needs_restart"]))


def main() -> None:
    run_app(app, "talaria-ctl")


if __name__ == "__main__":
    main()
