"""Factories for router tests: snapshots, calls, routers (imported by the test modules)."""

from __future__ import annotations

from talariad.router import (
    CallRequest,
    InstanceSnapshot,
    KVLocation,
    ModelResidency,
    ModelState,
    Router,
    RouterKnobs,
)
from talariad.types import KVState, LatencyProfile, Pool, SwitchPath

MODEL = "m"
PROFILE = LatencyProfile(
    prefill_base_s=0.0,
    prefill_s_per_token=1e-4,
    decode_step_s=0.01,
    restore_s_per_token=1e-5,
    open_s=3.0,
    switch_s={SwitchPath.D2D: 0.1, SwitchPath.H2D: 2.0},
    weight_bytes=10 << 30,
    kv_bytes_per_token=1000,
)


class Snaps:
    """Builds versioned snapshots; each instance's version increases on every call."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    def __call__(
        self,
        name: str,
        now: float,
        *,
        state: ModelState = ModelState.ACTIVE,
        sessions: dict | None = None,
        healthy: bool = True,
        pool: Pool = Pool.COLD,
        models: dict | None = None,
        allowed: tuple[str, ...] = (MODEL,),
        **fields,
    ) -> InstanceSnapshot:
        self.versions[name] = self.versions.get(name, 0) + 1
        if models is None:
            models = {MODEL: ModelResidency(state)}
        kv = {
            (sid, MODEL): KVLocation(sid, MODEL, st, n) for sid, (st, n) in (sessions or {}).items()
        }
        fields.setdefault("hbm_free_bytes", 1 << 40)
        fields.setdefault("staging_slack_bytes", 1 << 40)
        return InstanceSnapshot(
            name, self.versions[name], now, pool, healthy, frozenset(allowed), models, kv, **fields
        )


def call(
    call_id: str,
    session: str | None = "s1",
    prompt: int = 1000,
    prefix: int = 0,
    max_tokens: int = 10,
    model: str = MODEL,
) -> CallRequest:
    return CallRequest(call_id, session, model, prompt, prefix, max_tokens)


def router(policy: str = "talaria", profiles: dict | None = None, **knobs) -> Router:
    return Router(RouterKnobs(**knobs), {MODEL: PROFILE} if profiles is None else profiles, policy)


def cluster(r: Router, snaps: Snaps, names: tuple[str, ...], now: float = 0.0, **fields) -> None:
    for name in names:
        r.observe(snaps(name, now, **fields), now)


def serve(
    r: Router,
    c: CallRequest,
    now: float,
    done: float,
    kv: KVState = KVState.DEVICE,
    kv_len: int | None = None,
):
    """Place `c` at `now` and complete it at `done`; returns (decision, lease)."""
    d = r.place(c, now)
    lease = r.completed(
        c.call_id,
        d.instance,
        kv,
        c.prompt_tokens + c.max_tokens if kv_len is None else kv_len,
        done,
    )
    return d, lease


def cand(decision, instance: str):
    return next(c for c in decision.candidates if c.instance == instance)
