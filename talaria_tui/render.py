"""How the dashboard draws its rows and bars: columns, proportional bars of round and switch
phases, the HBM layout, and the legend."""

from __future__ import annotations

from rich.text import Text

from talariad.types import SWITCH_PHASES

INSTANCE_COLUMNS = (
    "instance",
    "pool",
    "executor",
    "serving",
    "active",
    "state",
    "admission",
    "healthy",
    "running",
    "queued",
    "restarts",
)
LEASE_COLUMNS = ("session", "model", "instance", "kv_len", "ttl_s")
SESSION_COLUMNS = ("session", "instance", "model", "kv_len", "idle_s", "leased")
DECISION_COLUMNS = ("call", "kind", "instance", "age_s", "reason")
ROUND_COLUMNS = ("instance", "round", "wall s", "active | switch", "slots", "SP adm/park")
SWITCH_COLUMNS = (
    "instance",
    "round",
    "from → to",
    "path",
    "total ms",
    "phases",
    "staged MiB",
    "dirty MiB",
)

BAR = 30
PHASE_STYLES = ("magenta", "blue", "cyan", "yellow", "green")
REGION_STYLES = {
    "weights": "blue",
    "kv_pool": "green",
    "clean": "yellow",
    "dirty": "dark_orange",
    "graph_pool": "magenta",
    "runtime": "red",
}
KEEP_ROUNDS = 40


def mib(n) -> str:
    return "-" if n is None or int(n) < 0 else f"{int(n) / 2**20:.1f}"


def instance_row(i: dict) -> tuple:
    return (
        i["name"],
        i["pool"],
        i["executor"],
        ",".join(i["rotation"]) or "-",
        i["active_model"] or "-",
        i["state"],
        i["admission"],
        "yes" if i["healthy"] else "no",
        str(i["running"]),
        str(i["queued"]),
        str(i["restarts"]),
    )


def decision_row(d: dict) -> tuple:
    return (d["call_id"], d["kind"], d["instance"] or "-", f"{d['age_s']:.1f}", d["reason"])


def candidate_row(c: dict) -> tuple:
    return (
        c["instance"],
        *(
            f"{c[k]:.3f}"
            for k in (
                "queue_s",
                "prefill_s",
                "decode_s",
                "kv_recovery_s",
                "activation_s",
                "total_s",
                "replica_s",
                "contention_s",
            )
        ),
        c["kv_state"],
        "yes" if c["feasible"] else c["reason"],
    )


def stacked_bar(parts: list[tuple[float, str]], scale: float, width: int = BAR) -> Text:
    """One bar of `width` cells for `scale` seconds (or bytes), one colour per part."""
    out = Text()
    if scale <= 0:
        return out
    done = 0.0
    for value, style in parts:  # cumulative rounding: the cells add up to the whole, never past it
        start, done = done, done + max(value, 0.0)
        out.append("█" * (round(width * done / scale) - round(width * start / scale)), style=style)
    return out


def round_bar(r: dict, longest: float) -> Text:
    return stacked_bar([(r["active_s"], "green"), (r["switch_s"], "red")], longest)


def slots_cell(r: dict) -> str:
    return (
        "; ".join(
            f"{s['model']}: " + " ".join(f"{p['phase']} {p['seconds']:.2f}" for p in s["phases"])
            for s in r["slots"]
        )
        or "-"
    )


def switch_bar(w: dict) -> Text:
    if not w["phases"]:
        return Text("-")
    total = sum(p["ms"] for p in w["phases"])
    return stacked_bar([(p["ms"], PHASE_STYLES[i % 5]) for i, p in enumerate(w["phases"])], total)


def memory_text(m: dict) -> Text:
    """An instance's HBM layout as a proportional bar of regions, plus host KV per model."""
    name = m["instance"]
    if not m["managed"]:
        return Text(f"{name}: this executor keeps no managed device memory (sim)\n")
    cap = int(m["capacity_bytes"]) or 1
    regions: dict[str, int] = {}
    for row in m["layout"]:
        kind, size = row["region"].split("[")[0], int(row["size"])
        if (
            kind == "staged"
        ):  # staged chunks sit inside the KV pool's free tail: carve them out of it
            model, _, state = row["owner"].partition(":")
            regions["kv_pool"] = regions.get("kv_pool", 0) - size
            label = f"staged {model} {state or 'clean'}"
        else:
            label = f"weights {row['owner']}" if kind == "weights" and row["owner"] else kind
        regions[label] = regions.get(label, 0) + size
    out = Text(
        f"{name}: {mib(cap)} MiB managed · active {m['active_model'] or '-'} · free "
        f"{mib(m['hbm_free_bytes'])} MiB\n"
    )
    out.append_text(stacked_bar([(v, region_style(k)) for k, v in regions.items()], cap, 2 * BAR))
    out.append("\n")
    for k, v in regions.items():
        out.append("■ ", style=region_style(k))
        out.append(f"{k} {mib(v)} MiB  ")
    host = m.get("host_kv_by_model") or {}
    out.append(
        f"\nhost KV {mib(m['host_kv_bytes'])} / {mib(m['host_kv_capacity_bytes'])} MiB"
        + ("".join(f" · {k} {mib(v)} MiB" for k, v in sorted(host.items())) if host else "")
        + "\n\n"
    )
    return out


def region_style(label: str) -> str:
    words = label.split()
    return REGION_STYLES.get(words[-1] if words[0] == "staged" else words[0], "white")


def phase_legend() -> Text:
    out = Text("phases: ")
    for i, name in enumerate(SWITCH_PHASES):
        out.append("■ ", style=PHASE_STYLES[i])
        out.append(f"{name}  ")
    return out


PLAN_COLUMNS = ("age_s", "instance", "from", "to", "by", "outcome", "took_s")


def plan_text(plan: dict | None) -> Text:
    """The planner's proposal and its reasons, or why there is none."""
    if plan is None:
        return Text("planner off (planner.mode: off) or not answering")
    t = Text(f"planner: {plan['mode']} · " + " ".join(plan["assignment"]) + "\n", style="bold")
    if plan["moving"]:
        t.append(f"moving: {plan['moving']}\n", style="yellow")
    if plan["has_move"]:
        m = plan["move"]
        t.append(
            f"proposed: {m['instance']} {m['before']} -> {m['after']} · gain {plan['gain_s']:.1f} s "
            f"· cost {m['cost_s']:.1f} s\n",
            style="green",
        )
    for r in plan["reasons"]:
        t.append(f"  {r}\n")
    return t


def plan_row(e: dict) -> tuple:
    m = e["move"]
    return (
        f"{e['age_s']:.0f}",
        m["instance"],
        m["before"],
        m["after"],
        e["by"],
        e["outcome"],
        f"{e['took_s']:.1f}",
    )
