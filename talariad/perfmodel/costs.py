"""How long a scheduler action takes on a `sim` instance: the one pure cost function shared by the
virtual-time simulator and the real-time `sim` executor (which only sleeps what this returns).

Prefill: recompute + H2D restore; decode: one iteration at the batch size; switch: the profile's
table for the path, a partial D2D switch D2D + uncovered x (H2D - D2D) (App. D), an H2D fallback
`fallback_s` (§5.6), a first open `open_s`. Design: docs/internals.md.
"""

from __future__ import annotations

from talariad.cold_sched import Action, Decode, Prefill, Switch
from talariad.types import LatencyProfile, SwitchPath


def prefill_seconds(action: Prefill, prof: LatencyProfile) -> float:
    recompute = sum(i.recompute_tokens for i in action.calls)
    restore = sum(i.restore_tokens for i in action.calls)
    return prof.prefill_s(recompute) + prof.restore_s(restore)


def decode_seconds(action: Decode, prof: LatencyProfile) -> float:
    return prof.decode_s(len(action.call_ids))


def switch_seconds(
    prof: LatencyProfile,
    path: SwitchPath,
    uncovered: float | None = None,
    first_open: bool = False,
    fallback: bool = False,
) -> float:
    """`uncovered`: the share of target weights not staged (partial path only; None: table);
    `fallback`: an H2D open although D2D staging is on (nothing usable was staged)."""
    if first_open:
        return prof.open_s
    if fallback and path is SwitchPath.H2D and prof.fallback_s is not None:
        return prof.fallback_s
    if path is SwitchPath.PARTIAL and uncovered is not None:
        d2d, h2d = prof.switch_cost_s(SwitchPath.D2D), prof.switch_cost_s(SwitchPath.H2D)
        return d2d + min(max(uncovered, 0.0), 1.0) * max(h2d - d2d, 0.0)
    return prof.switch_cost_s(path)


def action_seconds(
    action: Action,
    profiles: dict[str, LatencyProfile],
    path: SwitchPath | None = None,
    uncovered: float | None = None,
    first_open: bool = False,
    fallback: bool = False,
) -> float:
    """Seconds `action` takes; for a switch, `path` is how the weights were actually opened."""
    if isinstance(action, Switch):
        return switch_seconds(
            profiles[action.to_model], path or action.path, uncovered, first_open, fallback
        )
    if isinstance(action, Prefill):
        return prefill_seconds(action, profiles[action.model])
    if isinstance(action, Decode):
        return decode_seconds(action, profiles[action.model])
    return 0.0
