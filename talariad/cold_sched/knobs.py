"""Policy knobs of the cold-pool scheduler (paper §3.4, App. E) and the named ablations of §5.1."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SchedKnobs:
    gamma: float = 0.8
    """Admission margin of Eq. (5): a predicted round is at most gamma * ttft_target_s."""

    ttft_target_s: float = 10.0
    """TTFT target T_TTFT in seconds; with gamma it bounds the round length (model revisit time)."""

    tpot_target_s: float = 0.2
    """Average time-per-output-token target T_TPOT of Eq. (4). 0.2 s rather than a chat-style 0.1 s:
    a cold instance time-shares ~3 models, and at 0.1 s the protected decode of three models with a
    30 ms step would take almost the whole round, leaving P and SP no budget."""

    sp: bool = True
    """Session-prefill: admit eligible returns mid-slot. Off: a return waits for the next slot."""

    host_kv: bool = True
    """Host-restorable KV (HKVR). Off: any prefix that is not device-resident is recomputed."""

    d2d: bool = True
    """D2D weight staging. Off: switches are predicted and requested as H2D reloads."""

    max_sp_batch: int = 8
    """Most continuations admitted at one SP opportunity (the bounded batch B_{m,k})."""

    max_batch: int = 64
    """Most sequences in the running decode batch of the active model."""

    kv_capacity_tokens: int = 1 << 20
    """Device KV capacity in tokens for the active model; admission reserves prompt + max_tokens."""

    max_prefill_tokens: int = 65536
    """Most prompt tokens in one prefill action (a single longer prompt still goes alone)."""

    sp_hold_s: float = 1.0
    """How long a slot whose batch ran empty stays open for the return of a session that completed
    in it (SP on only; 0 closes it at once). 1 s: the router's reservation timeout (App. E)."""

    max_switch_share: float = 0.5
    """Largest part of a round that predicted switches may take. When switches exceed this share of
    gamma*T_TTFT the round grows to switches/max_switch_share (counted as round_bound risk) instead
    of shrinking every slot to nothing."""

    def __post_init__(self) -> None:
        _check(0.0 < self.gamma < 1.0, "gamma", self.gamma, "must be in (0, 1)")
        _check(self.ttft_target_s > 0, "ttft_target_s", self.ttft_target_s, "must be > 0")
        _check(self.tpot_target_s > 0, "tpot_target_s", self.tpot_target_s, "must be > 0")
        _check(self.sp_hold_s >= 0, "sp_hold_s", self.sp_hold_s, "must be >= 0")
        share = self.max_switch_share
        _check(0.0 < share < 1.0, "max_switch_share", share, "must be in (0, 1)")
        for name in ("max_sp_batch", "max_batch", "kv_capacity_tokens", "max_prefill_tokens"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")

    @property
    def round_bound_s(self) -> float:
        """The Eq. (5) bound gamma * T_TTFT on a predicted round."""
        return self.gamma * self.ttft_target_s


def _check(ok: bool, field: str, value: object, why: str) -> None:
    if not ok:
        raise ValueError(f"SchedKnobs.{field}={value!r} {why}")


ABLATIONS: dict[str, dict[str, bool]] = {
    "talaria": {"sp": True, "host_kv": True, "d2d": True},
    "no-sp": {"sp": False, "host_kv": True, "d2d": True},
    "no-hkvr": {"sp": True, "host_kv": False, "d2d": True},
    "h2d-only": {"sp": True, "host_kv": True, "d2d": False},
    "round-only": {"sp": False, "host_kv": False, "d2d": False},
}


def ablation(name: str, base: SchedKnobs | None = None) -> SchedKnobs:
    """Knobs of a named configuration of §5.1: same scheduler, only the three switches differ."""
    if name not in ABLATIONS:
        raise ValueError(f"ablation {name!r} is not one of {sorted(ABLATIONS)}")
    return dataclasses.replace(base or SchedKnobs(), **ABLATIONS[name])
