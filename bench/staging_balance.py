"""What the published staging mechanism predicts for a round's switches, without a replay.

A cold slot gets (γ·T_TTFT minus the round's predicted switches) / n of the round (Eq. (3)-(5),
`cold_sched.budget.plan_slot`); while it runs, the next model's weights are staged over the H2D
link, less the link time HKVR restores take; the switch then gathers the staged bytes and copies
the rest (App. D, priced by `SimMemory.switch_phases` from the profile's Table 2 constants). Short
slots leave more to copy, dearer switches shorten the slots: this prints where that loop settles,
started from the cheapest and from the dearest switches, for a sweep of restore time per slot.

Then two checks against the paper's own figures (compared, never fitted):
- the same pricing at the paper's measured active time per slot (Fig. 13: 1,632 s of round wall,
  565 s of it switching, 600 switches): the path mix and mean switch the published mechanism gives
  for slots that short, beside Fig. 12's;
- the restore time per slot the loop would need for its mean switch to reach Fig. 12's 1,071 ms,
  beside the link time restores take per slot in the simulated replay (`--seeds`).

Run: .venv/bin/python bench/staging_balance.py [--profile paper-tp8] [--seeds 0-4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ablation_seeds import seeds  # noqa: E402

from talariad.cold_sched import SchedKnobs  # noqa: E402
from talariad.cold_sched.budget import plan_slot  # noqa: E402
from talariad.perfmodel.memory import SimMemory, memory_spec  # noqa: E402
from talariad.perfmodel.profiles import load_set  # noqa: E402
from talariad.replay.generate import PAPER_MODELS, fixed_replay  # noqa: E402
from talariad.sim.configs import ablation_configs  # noqa: E402
from talariad.sim.simulator import simulate  # noqa: E402
from talariad.types import SwitchPath  # noqa: E402

PAPER_ACTIVE_PER_SLOT_S = (1632 - 565) / 600  # Fig. 13 round wall less switching, per switch
PAPER_MEAN_SWITCH_S = 1.071  # Fig. 12, Talaria
PAPER_MIX = "27.7 / 36.3 / 36.0"  # Fig. 12: full D2D / partial / H2D fallback (%)
RESTORE_SWEEP_S = (0.0, 0.25, 0.5, 1.0, 1.5)


def switches_after(mem: SimMemory, models: list[str], active_s: float, restore_s: float):
    """Each model's switch (path, seconds) after a slot of `active_s` of the model before it in
    the rotation, through the simulator's own staging (`SimMemory`): staging began at the slot's
    start with no device KV (the most room it can have), and restores took `restore_s` of the
    link."""
    out = {}
    for i, target in enumerate(models):
        mem.switched(0.0, target)
        mem.note_restore(restore_s)
        plan = mem.plan_switch(models[i - 1], target, 0, active_s)
        out[target] = plan.path, sum(mem.switch_phases(target, plan))
    return out


def settle(mem, models, knobs: SchedKnobs, restore_s: float, start_s: float) -> dict:
    """Iterate slot -> switches -> slot from every switch costing `start_s`, to where it stops."""
    total = start_s * len(models)
    for _ in range(200):
        slot = plan_slot(
            knobs.round_bound_s,
            len(models),
            total,
            knobs.tpot_target_s,
            0.0,
            knobs.max_switch_share,
        )
        sw = switches_after(mem, models, slot.budget_s, restore_s)
        new = sum(s for _, s in sw.values())
        if abs(new - total) < 1e-6:
            break
        total = 0.5 * (total + new)  # damped: the scheduler's estimate is an EWMA of measurements
    round_s = max(knobs.round_bound_s, total / knobs.max_switch_share)
    return {
        "restore_s": restore_s,
        "start_switch_s": start_s,
        "active_per_slot_s": slot.budget_s,
        "switch_s": {m: s for m, (_, s) in sw.items()},
        "path": {m: p.value for m, (p, _) in sw.items()},
        "mean_switch_s": new / len(models),
        "switch_share": new / round_s,
    }


def needed_restore_s(mem, models, knobs, target_mean_s: float) -> float | None:
    """Restore time per slot at which the settled mean switch reaches `target_mean_s`."""
    lo, hi = 0.0, knobs.round_bound_s
    if settle(mem, models, knobs, hi, 0.0)["mean_switch_s"] < target_mean_s:
        return None
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if settle(mem, models, knobs, mid, 0.0)["mean_switch_s"] < target_mean_s:
            lo = mid
        else:
            hi = mid
    return hi


def replay_measures(pset, seeds: list[int]) -> dict[str, float]:
    """From the simulated Talaria replay: link seconds HKVR restores take per switch (mean over
    seeds) and the device KV per GPU when a switch is planned (p50 / p95 over every switch)."""
    taken: list[float] = []
    kv_at_switch: list[int] = []
    note_restore, plan_switch = SimMemory.note_restore, SimMemory.plan_switch

    def note(self, seconds: float) -> None:
        taken.append(seconds)
        note_restore(self, seconds)

    def plan(self, active, target, device_kv_bytes, now):
        kv_at_switch.append(device_kv_bytes)
        return plan_switch(self, active, target, device_kv_bytes, now)

    per = []
    cfg = next(c for c in ablation_configs(pset, PAPER_MODELS) if c.name == "Talaria")
    for seed in seeds:
        taken.clear()
        with (
            mock.patch.object(SimMemory, "note_restore", note),
            mock.patch.object(SimMemory, "plan_switch", plan),
        ):
            run = simulate(fixed_replay(seed), cfg, pset)
        per.append(sum(taken) / max(len(run.switches), 1))
    kv = statistics.quantiles(kv_at_switch, n=20)
    return {
        "restore_per_switch_s": statistics.mean(per),
        "kv_at_switch_p50_bytes": statistics.median(kv_at_switch),
        "kv_at_switch_p95_bytes": kv[18],
    }


def kv_limits(mem: SimMemory, models: list[str]) -> dict[str, tuple[float, float]]:
    """Per target: the device KV per GPU above which its staging cannot complete, and above which
    it cannot start (the room above the weights of the model before it in the rotation)."""
    out = {}
    for i, target in enumerate(models):
        room = mem.kv_budget_bytes(models[i - 1])
        out[target] = (room - mem.spec.weight_bytes[target], room)
    return out


def row(r: dict, models: list[str]) -> str:
    sw = " ".join(f"{1000 * r['switch_s'][m]:>6.0f} {r['path'][m]:<7}" for m in models)
    return (
        f"{r['restore_s']:>8.2f}{r['start_switch_s']:>7.2f}{r['active_per_slot_s']:>8.2f}  {sw}"
        f"{1000 * r['mean_switch_s']:>7.0f}{100 * r['switch_share']:>7.1f}%"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--profile", default="paper-tp8")
    p.add_argument("--seeds", default="0-4", help="replay seeds for the measured restore and KV")
    p.add_argument("--json")
    args = p.parse_args()
    pset = load_set(args.profile)
    mem, knobs = SimMemory(memory_spec(pset)), SchedKnobs()
    models = [m for m in PAPER_MODELS if m in pset.models]
    dearest = max(s for _, s in switches_after(mem, models, 0.0, 0.0).values())
    print(
        f"{args.profile}: round bound {knobs.round_bound_s:.1f} s, H2D "
        f"{mem.spec.h2d_bytes_per_s / 1e9:.2f} GB/s per GPU, weights per GPU "
        + ", ".join(f"{m} {mem.spec.weight_bytes[m] / 1e9:.1f} GB" for m in models)
    )
    head = "  ".join(f"{m[:14]:>14}" for m in models)
    print(f"{'restore':>8}{'start':>7}{'slot s':>8}  {head}  mean ms  share")
    settled = []
    for restore in RESTORE_SWEEP_S:
        for start in (0.0, dearest):
            r = settle(mem, models, knobs, restore, start)
            settled.append(r)
            print(row(r, models))
    at_paper = switches_after(mem, models, PAPER_ACTIVE_PER_SLOT_S, 0.0)
    mean = statistics.mean(s for _, s in at_paper.values())
    mix = [sum(p is k for p, _ in at_paper.values()) / len(models) for k in SwitchPath]
    print(
        f"at the paper's active time per slot ({PAPER_ACTIVE_PER_SLOT_S:.3f} s, no restores): "
        + ", ".join(f"{m} {1000 * s:.0f} ms {p.value}" for m, (p, s) in at_paper.items())
        + f"; mean {1000 * mean:.0f} ms (paper {1000 * PAPER_MEAN_SWITCH_S:.0f}); path mix "
        + " / ".join(f"{100 * x:.0f}" for x in mix)
        + f" % (paper {PAPER_MIX})"
    )
    need = needed_restore_s(mem, models, knobs, PAPER_MEAN_SWITCH_S)
    at_need = None if need is None else settle(mem, models, knobs, need, 0.0)
    measured = replay_measures(pset, seeds(args.seeds))
    print(
        f"restore time per slot for a settled mean switch of {1000 * PAPER_MEAN_SWITCH_S:.0f} ms: "
        + (
            "-"
            if at_need is None
            else f"{need:.2f} s (share {100 * at_need['switch_share']:.1f}%, "
            + ", ".join(f"{m} {p}" for m, p in at_need["path"].items())
            + ")"
        )
        + f"; the simulated replay's restores take {measured['restore_per_switch_s']:.2f} s per"
        f" switch (seeds {args.seeds})"
    )
    limits = kv_limits(mem, models)
    print(
        "device KV per GPU above which staging cannot complete / cannot start: "
        + ", ".join(f"{m} {a / 1e9:.0f} / {b / 1e9:.0f} GB" for m, (a, b) in limits.items())
        + f"; the simulated replay's device KV at its switches: p50 "
        f"{measured['kv_at_switch_p50_bytes'] / 1e9:.0f} GB, p95 "
        f"{measured['kv_at_switch_p95_bytes'] / 1e9:.0f} GB"
    )
    if args.json:
        out = {
            "settled": settled,
            "at_paper_slot": {
                m: {"path": p.value, "switch_s": s} for m, (p, s) in at_paper.items()
            },
            "at_paper_slot_mean_switch_s": mean,
            "needed_restore_s": need,
            "at_needed_restore": at_need,
            "replay": measured,
            "kv_limits_bytes": limits,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
