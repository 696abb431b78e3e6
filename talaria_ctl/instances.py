"""`talaria-ctl instance …`: state, rounds and memory of instances; drain, cordon, restart."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from talaria_ctl.output import (
    ForceOpt,
    InstanceArg,
    JsonOpt,
    fetch,
    mib,
    print_json,
    table,
)
from talariad.types import SWITCH_PHASES

instance_app = typer.Typer(
    no_args_is_help=True, help="Instances: state, memory, rounds; drain, cordon, restart."
)


def _rotation(i: dict) -> str:
    """The models it serves, and those the router retired from its rotation (resident, idle)."""
    text = ", ".join(i["rotation"]) or "-"
    retired = i.get("retired") or []
    return f"{text} (retired: {', '.join(retired)})" if retired else text


def instance_row(i: dict) -> tuple:
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
    rows = fetch(ctx.obj.status).get("instances", [])
    if as_json:
        return print_json(rows)
    table("instances", INSTANCE_COLUMNS, [instance_row(i) for i in rows])


@instance_app.command("show")
def instance_show(ctx: typer.Context, name: InstanceArg, as_json: JsonOpt = False) -> None:
    """One instance's state."""
    rows = [i for i in fetch(ctx.obj.status).get("instances", []) if i["name"] == name]
    if not rows:
        print(f"talaria-ctl: no instance named {name!r}", file=sys.stderr)
        raise typer.Exit(3)
    if as_json:
        return print_json(rows[0])
    table(name, INSTANCE_COLUMNS, [instance_row(rows[0])])


def _instance_action(
    ctx: typer.Context, verb: str, name: str, as_json: bool, force: bool = False
) -> None:
    data = fetch(lambda: ctx.obj.instance_action(verb, name, force))
    if as_json:
        return print_json(data)
    table(f"{verb.lower()} {name}", INSTANCE_COLUMNS, [instance_row(data)])


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
    data = fetch(lambda: ctx.obj.rounds(name, limit))
    if as_json:
        return print_json(data)
    table(
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
    table(
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
    return "-" if n is None or int(n) < 0 else mib(n)


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
    data = fetch(lambda: ctx.obj.memory(name))
    if as_json:
        return print_json(data)
    proc = data.get("process") or {}
    if proc.get("pid"):
        print(
            f"{name}: process {proc['pid']}, rss {mib(proc['rss_bytes'])} MiB, "
            f"{proc['open_files']} open files, {proc['asyncio_tasks']} asyncio tasks, "
            f"{proc['gc_objects']} tracked objects"
        )
    if not data.get("managed"):
        print(f"{name}: this executor keeps no managed device memory")
        return
    table(
        f"{name}: {mib(data['capacity_bytes'])} MiB managed, active {data['active_model'] or '-'}, "
        f"free {mib(data['hbm_free_bytes'])} MiB, staging slack {mib(data['staging_slack_bytes'])} MiB",
        ("region", "offset MiB", "size MiB", "owner"),
        [
            (r["region"], mib(r["offset"]), mib(r["size"]), r["owner"])
            for r in _disjoint(data.get("layout", []))
        ],
    )
    table(
        f"host KV: {mib(data['host_kv_bytes'])} of {mib(data['host_kv_capacity_bytes'])} MiB",
        ("model", "MiB"),
        [(m, mib(n)) for m, n in sorted(data.get("host_kv_by_model", {}).items())],
    )
    table(
        "switches (latest last; phases in ms)",
        ("from", "to", "path", "total ms", *SWITCH_PHASES, "staged MiB", "dirty MiB"),
        [
            (
                w["from_model"] or "-",
                w["to_model"],
                w["path"],
                f"{w['total_ms']:.1f}",
                *(f"{x:.1f}" for x in w["phase_ms"]),
                mib(w["staged_bytes"]),
                mib(w["dirty_bytes"]),
            )
            for w in data.get("switches", [])
        ],
    )


# ---- pools -----------------------------------------------------------------------------------
