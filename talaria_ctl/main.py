"""`talaria-ctl`: administer a running talariad over its gRPC admin socket.

Exit codes: 0 ok, 1 daemon unreachable, 2 usage error, 3 refused (unknown name or id, bad
argument, or an action that cannot apply now).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
import yaml

from talaria_ctl import epp as epp_ctl
from talaria_ctl.instances import INSTANCE_COLUMNS, instance_app, instance_row
from talaria_ctl.output import (
    ForceOpt,
    InstanceArg,
    JsonOpt,
    ModelArg,
    OnOpt,
    fetch,
    print_json,
    table,
)
from talariad import __version__
from talariad.admin.client import (
    CANDIDATE_COLUMNS,
    AdminClient,
    default_socket,
)
from talariad.cliutil import run_app

EPILOG = "Exit codes: 0 ok, 1 daemon unreachable, 2 usage error, 3 refused."
app = typer.Typer(
    no_args_is_help=True, add_completion=True, help="Administer a running talariad.", epilog=EPILOG
)
session_app = typer.Typer(no_args_is_help=True, help="The router's session table.")
lease_app = typer.Typer(no_args_is_help=True, help="Live soft reservations.")
call_app = typer.Typer(no_args_is_help=True, help="Routing decisions: where calls went and why.")
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
    epp: Annotated[
        str | None,
        typer.Option(
            "--epp",
            show_default=False,
            help="A pool's endpoint picker: its metrics address HOST:PORT (status, call explain)",
        ),
    ] = None,
) -> None:
    if epp is not None:
        ctx.obj = epp_ctl.EPPClient(epp, timeout)
        if ctx.invoked_subcommand not in ("status", "call"):
            what = ctx.invoked_subcommand
            print(
                f"talaria-ctl: --epp takes status and call explain only, not {what}",
                file=sys.stderr,
            )
            raise typer.Exit(2)
        return
    ctx.obj = AdminClient(socket or default_socket(), timeout)


@app.command()
def status(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    gateway: Annotated[
        str | None,
        typer.Option(
            "--gateway",
            help="With --epp: the gateway's Envoy admin HOST:PORT, to show what it did without "
            "the picker (calls routed unpicked, overflows)",
        ),
    ] = None,
) -> None:
    """Instances, their pool, models and health (--epp: the pool's boxes)."""
    if isinstance(ctx.obj, epp_ctl.EPPClient):
        return epp_ctl.show_status(ctx.obj, as_json, gateway)
    if gateway is not None:
        print("talaria-ctl: --gateway goes with --epp", file=sys.stderr)
        raise typer.Exit(2)
    data = fetch(ctx.obj.status)
    if as_json:
        return print_json(data)
    table(
        f"talariad {data['version']} at {data['http_endpoint']} (up {data['uptime_s']:.0f}s)",
        INSTANCE_COLUMNS,
        [instance_row(i) for i in data["instances"]],
    )


@session_app.command("list")
def session_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(min=0, help="Most recent N (0: all)")] = 50,
) -> None:
    """Sessions: last instance, model, KV length, idle time, lease."""
    rows = fetch(lambda: ctx.obj.sessions(limit)).get("sessions", [])
    if as_json:
        return print_json(rows)
    table(
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
    rows = fetch(ctx.obj.leases).get("leases", [])
    if as_json:
        return print_json(rows)
    table(
        "leases",
        ("session", "model", "instance", "kv_len", "expires_in_s"),
        [
            (r["session_id"], r["model"], r["instance"], r["kv_len"], r["expires_in_s"])
            for r in rows
        ],
    )


def _candidates(d: dict) -> None:
    table(
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
    """Why one call went where it did: decision kind and Eq. (1) per candidate (box)."""
    if isinstance(ctx.obj, epp_ctl.EPPClient):
        data = epp_ctl.explain(ctx.obj, call_id)
        return print_json(data) if as_json else _candidates(data)
    data = fetch(lambda: ctx.obj.explain(call_id))
    return print_json(data) if as_json else _candidates(data)


@call_app.command("recent")
def call_recent(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(min=1, max=4096, help="How many")] = 20,
) -> None:
    """The latest routing decisions, newest first."""
    rows = fetch(lambda: ctx.obj.decisions(limit)).get("decisions", [])
    if as_json:
        return print_json(rows)
    table(
        "recent decisions",
        ("call", "kind", "instance", "age_s", "reason"),
        [(r["call_id"], r["kind"], r["instance"] or "-", r["age_s"], r["reason"]) for r in rows],
    )


@pool_app.command("list")
def pool_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Both pools: their instances, models and load."""
    rows = fetch(ctx.obj.pools).get("pools", [])
    if as_json:
        return print_json(rows)
    table(
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
    data = fetch(ctx.obj.status)
    rows = [i for i in data["instances"] if i["pool"] == pool]
    if as_json:
        return print_json(rows)
    table(f"{pool} pool", INSTANCE_COLUMNS, [instance_row(i) for i in rows])


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
    data = fetch(lambda: ctx.obj.move(name, to, model, force))
    if as_json:
        return print_json(data)
    table(f"moved {name}", INSTANCE_COLUMNS, [instance_row(data)])


@pool_app.command("plan")
def pool_plan(
    ctx: typer.Context,
    apply: Annotated[
        bool, typer.Option("--apply", help="Carry the proposed move out once (as pool move does)")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The planner's current proposal: which instance it would move where, why in numbers, and
    its recent moves."""
    data = fetch(lambda: ctx.obj.plan(apply))
    if as_json:
        return print_json(data)
    print_plan(data)


def print_plan(d: dict) -> None:
    print(f"planner: {d['mode']}; " + " ".join(d["assignment"]))
    if d["has_move"]:
        m = d["move"]
        verb = "applied" if d["applied"] else "proposed"
        print(
            f"{verb}: {m['instance']} {m['before']} -> {m['after']}: expected delay "
            f"{d['delay_now_s']:.3f} -> {d['delay_after_s']:.3f} s per s, gain {d['gain_s']:.1f} s, "
            f"cost {m['cost_s']:.1f} s (drain {m['drain_s']:.1f} s, load {m['load_s']:.1f} s, "
            f"KV {m['kv_s']:.1f} s, others wait {m['during_s']:.1f} s)"
        )
    else:
        print("no move proposed")
    if d["moving"]:
        print(f"moving: {d['moving']}")
    for r in d["reasons"]:
        print(f"  {r}")
    for e in d["history"][:1]:
        m = e["move"]
        print(
            f"last move: {m['instance']} {m['before']} -> {m['after']} by {e['by']}, "
            f"{e['outcome']} in {e['took_s']:.1f} s, {e['age_s']:.0f} s ago"
        )
        for r in e["why"]:
            print(f"  {r}")
    if d["history"]:
        table(
            "recent moves",
            ("age_s", "instance", "from", "to", "by", "outcome", "took_s"),
            [
                (
                    f"{e['age_s']:.0f}",
                    e["move"]["instance"],
                    e["move"]["before"],
                    e["move"]["after"],
                    e["by"],
                    e["outcome"],
                    f"{e['took_s']:.1f}",
                )
                for e in d["history"]
            ],
        )


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
    rows = fetch(ctx.obj.models).get("models", [])
    if as_json:
        return print_json(rows)
    table("models", MODEL_COLUMNS, [_model_row(m) for m in rows])


@model_app.command("show")
def model_show(ctx: typer.Context, model: ModelArg, as_json: JsonOpt = False) -> None:
    """One model."""
    rows = [m for m in fetch(ctx.obj.models).get("models", []) if m["name"] == model]
    if not rows:
        print(f"talaria-ctl: no model named {model!r}", file=sys.stderr)
        raise typer.Exit(3)
    if as_json:
        return print_json(rows[0])
    table(model, MODEL_COLUMNS, [_model_row(rows[0])])


def _model_action(
    ctx: typer.Context, verb: str, model: str, on: str, as_json: bool, force: bool = False
) -> None:
    data = fetch(lambda: ctx.obj.model_action(verb, model, on, force))
    if as_json:
        return print_json(data)
    table(f"{verb.lower()} {model} on {on}", MODEL_COLUMNS, [_model_row(data)])


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
    rows = fetch(lambda: ctx.obj.revoke(session_id, model)).get("leases", [])
    if as_json:
        return print_json(rows)
    table(
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
        for r in fetch(lambda: ctx.obj.sessions(0)).get("sessions", [])
        if r["session_id"] == session_id
    ]
    if not rows:
        print(f"talaria-ctl: no session {session_id!r} in the router's table", file=sys.stderr)
        raise typer.Exit(3)
    if as_json:
        return print_json(rows[0])
    r = rows[0]
    table(
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
    data = fetch(lambda: ctx.obj.forget(session_id))
    if as_json:
        return print_json(data)
    print(
        f"{session_id}: {'forgotten' if data['known'] else 'was not known'}; {data['leases_dropped']} leases "
        f"dropped; KV freed on {', '.join(data['instances_freed']) or 'no instance'}"
    )


@config_app.command("show")
def config_show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The config in effect (with run-time pool moves and pins) as YAML (--json: as JSON)."""
    data = fetch(ctx.obj.config)
    if as_json:
        return print_json(yaml.safe_load(data["yaml"]))
    print(f"# {data['path']}\n{data['yaml']}", end="")


@config_app.command("reload")
def config_reload(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Re-read the config file; apply what can change live, list what needs a restart."""
    data = fetch(ctx.obj.reload)
    if as_json:
        return print_json(data)
    print("applied: " + (", ".join(data["applied"]) or "nothing changed"))
    if data["needs_restart"]:
        print("needs a restart: " + ", ".join(data["needs_restart"]))


def main() -> None:
    run_app(app, "talaria-ctl")


if __name__ == "__main__":
    main()
