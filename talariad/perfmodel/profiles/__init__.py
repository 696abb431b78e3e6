"""Latency profiles of `sim` executors, from the YAML files in this folder.

`load_profiles(name)` returns a `talariad.types.LatencyProfile` per model. Fields a YAML
`profile:` block gives are used as written; the rest are derived from the model's architecture
block and the box: weight and KV bytes per GPU, H2D restore cost per token, the per-sequence
decode term and the switch table (see paper-tp8.yaml for sources). Facts LatencyProfile has no
field for (box size, architecture numbers) are in `ProfileSet` / `ModelSpec`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from talariad.types import LatencyProfile, SwitchPath

HERE = Path(__file__).parent
GIB = 1 << 30
_PROFILE_FIELDS = {f.name for f in dataclasses.fields(LatencyProfile)}
_BOX_FIELDS = {
    "gpus",
    "tp",
    "hbm_per_gpu_gib",
    "host_memory_gib",
    "h2d_gb_per_s",
    "restore_efficiency",
    "hbm_gb_per_s",
    "decode_context_tokens",
    "switch_ms_pooled",
    "fallback_ms_pooled",
    "mem_fraction_bump",
    "kv_reserve_gib_per_gpu",
    "switch_phase_ms",
    "open_fixed_ms",
    "d2d_gb_per_s",
}
_ARCH_FIELDS = {
    "hf_id",
    "params_total_b",
    "params_active_b",
    "weight_bytes_per_param",
    "attention",
    "kv_layers",
    "kv_heads",
    "head_dim",
    "latent_dim",
    "kv_dtype_bytes",
    "profile",
}


@dataclass(frozen=True, slots=True)
class Box:
    gpus: int
    tp: int
    hbm_per_gpu_bytes: int
    host_memory_bytes: int
    h2d_bytes_per_s: float | None = None
    restore_efficiency: float = 1.0
    hbm_bytes_per_s: float | None = None
    decode_context_tokens: int = 0
    switch_s_pooled: dict[SwitchPath, float] | None = None
    fallback_s_pooled: float | None = None
    mem_fraction_bump: float = 0.8
    """Share of each GPU's HBM that the managed (bump) layout owns: weights, staged chunks, KV."""
    kv_reserve_bytes_per_gpu: int | None = None
    """Set: models' weights stay resident in the managed HBM minus this KV reserve, evicted least
    recently active first (`talariad.perfmodel.memory`); unset: one model's weights at a time."""
    switch_phases_s: dict[SwitchPath, tuple[float, float, float, float]] | None = None
    """Set: switches are priced from the mechanism (`talariad.perfmodel.memory.SwitchPrices`): per path,
    the seconds of phases 1, 3, 4 and 5 (App. D Table 2); phase 2 comes from bytes."""
    open_fixed_s: float = 0.0
    """Phase 2's part that moves no bytes (wait for staging, verify the bitmap, resolve the entry)."""
    d2d_bytes_per_s: float | None = None
    """The D2D gather rate of staged chunks into the weights region, per GPU."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model's profile plus the architecture facts it was derived from (bytes per GPU)."""

    name: str
    profile: LatencyProfile
    hf_id: str | None = None
    params_total: int | None = None
    params_active: int | None = None
    weight_bytes_per_gpu: int = 0
    kv_bytes_per_token_per_gpu: int = 0


@dataclass(frozen=True, slots=True)
class ProfileSet:
    name: str
    box: Box
    models: dict[str, ModelSpec]

    def profiles(self) -> dict[str, LatencyProfile]:
        return {m: spec.profile for m, spec in self.models.items()}


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def named_profile(model: str) -> LatencyProfile | None:
    """The profile of `model` in whichever bundled set defines it (a config's `profile:` name)."""
    found = find_model(model)
    return found[1].profile if found is not None else None


def find_model(model: str) -> tuple[ProfileSet, ModelSpec] | None:
    """The bundled set that defines `model` and its spec there (first set in name order)."""
    for name in available():
        pset = load_set(name)
        if model in pset.models:
            return pset, pset.models[model]
    return None


def load_profiles(name: str = "paper-tp8") -> dict[str, LatencyProfile]:
    """LatencyProfile per model of a bundled set (`available()`) or a YAML path."""
    return load_set(name).profiles()


def load_set(name: str = "paper-tp8") -> ProfileSet:
    path = Path(name) if name.endswith((".yaml", ".yml")) else HERE / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown profile set {name!r}; bundled: {available()}")
    stat = path.stat()
    return _read_set(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read_set(path: Path, mtime_ns: int, size: int) -> ProfileSet:
    """One parse per version of a file: every model lookup (`find_model`) reads the bundled sets,
    and YAML parsing dominated building a config's instances. Callers never change a set."""
    try:
        return _parse_set(path, yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as err:
        raise ValueError(
            f"profile set {path}: invalid YAML: {getattr(err, 'problem', None) or err}"
        ) from None
    except (TypeError, AttributeError, KeyError) as err:  # a field of the wrong shape deeper down
        raise ValueError(f"profile set {path}: malformed: {type(err).__name__}: {err}") from None


def _parse_set(path: Path, doc) -> ProfileSet:
    if not isinstance(doc, dict):
        raise ValueError(f"profile set {path}: expected a mapping with 'box' and 'models'")
    box = _box(_section(doc, "box", path.stem))
    models = _section(doc, "models", path.stem)
    weights = {m: _weight_bytes(spec, box) for m, spec in models.items()}
    mean_w = sum(weights.values()) / len(weights) if weights else 0
    return ProfileSet(
        path.stem, box, {m: _model(m, spec, box, weights[m], mean_w) for m, spec in models.items()}
    )


def _section(doc: dict, key: str, where: str) -> dict:
    value = doc.get(key)
    if not isinstance(value, dict) or not value:
        raise ValueError(f"profile set {where}: '{key}' must be a non-empty mapping")
    return value


def _unknown(given: dict, allowed: set, where: str) -> None:
    extra = sorted(set(given) - allowed)
    if extra:
        raise ValueError(f"{where}: unknown field(s) {extra}")


def _box(b: dict) -> Box:
    _unknown(b, _BOX_FIELDS, "box")
    missing = sorted({"gpus", "tp", "hbm_per_gpu_gib", "host_memory_gib"} - set(b))
    if missing:
        raise ValueError(f"box: missing field(s) {missing}")
    pooled = b.get("switch_ms_pooled")
    return Box(
        gpus=int(b["gpus"]),
        tp=int(b["tp"]),
        hbm_per_gpu_bytes=int(b["hbm_per_gpu_gib"] * GIB),
        host_memory_bytes=int(b["host_memory_gib"] * GIB),
        h2d_bytes_per_s=b["h2d_gb_per_s"] * 1e9 if "h2d_gb_per_s" in b else None,
        restore_efficiency=float(b.get("restore_efficiency", 1.0)),
        hbm_bytes_per_s=b["hbm_gb_per_s"] * 1e9 if "hbm_gb_per_s" in b else None,
        decode_context_tokens=int(b.get("decode_context_tokens", 0)),
        switch_s_pooled={SwitchPath(k): v / 1000 for k, v in pooled.items()} if pooled else None,
        fallback_s_pooled=b["fallback_ms_pooled"] / 1000 if "fallback_ms_pooled" in b else None,
        mem_fraction_bump=_fraction(b.get("mem_fraction_bump", 0.8)),
        kv_reserve_bytes_per_gpu=_reserve(b.get("kv_reserve_gib_per_gpu")),
        switch_phases_s=_phases(b.get("switch_phase_ms")),
        open_fixed_s=float(b.get("open_fixed_ms", 0.0)) / 1000,
        d2d_bytes_per_s=b["d2d_gb_per_s"] * 1e9 if "d2d_gb_per_s" in b else None,
    )


def _phases(value) -> dict[SwitchPath, tuple[float, float, float, float]] | None:
    """`{d2d: [p1, p3, p4, p5], partial: [...], h2d: [...]}` in ms -> seconds per path."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {p.value for p in SwitchPath}:
        raise ValueError("box: switch_phase_ms needs d2d, partial and h2d entries")
    out = {}
    for k, ms in value.items():
        if not isinstance(ms, list) or len(ms) != 4 or not all(float(x) >= 0 for x in ms):
            raise ValueError(f"box: switch_phase_ms.{k} must be 4 non-negative ms (P1, P3-P5)")
        out[SwitchPath(k)] = tuple(float(x) / 1000 for x in ms)
    return out


def _reserve(value) -> int | None:
    if value is None:
        return None
    if not float(value) >= 0:
        raise ValueError(f"box: kv_reserve_gib_per_gpu must be >= 0, got {value!r}")
    return int(float(value) * GIB)


def _fraction(value) -> float:
    if not 0 < float(value) <= 1:
        raise ValueError(f"box: mem_fraction_bump must be in (0, 1], got {value!r}")
    return float(value)


def _weight_bytes(spec: dict, box: Box) -> int:
    if "params_total_b" not in spec:
        return int(spec.get("profile", {}).get("weight_bytes", 0))
    return int(spec["params_total_b"] * 1e9 * spec["weight_bytes_per_param"] / box.tp)


def kv_bytes_per_token(spec: dict, tp: int) -> int:
    """Per-GPU KV bytes per token: GQA heads are sharded over TP (replicated when fewer than TP);
    an MLA latent is replicated on every rank."""
    if "attention" not in spec:
        return 0
    if spec["attention"] == "mla":
        return spec["kv_layers"] * spec["latent_dim"] * spec["kv_dtype_bytes"]
    if spec["attention"] == "gqa":
        heads = math.ceil(spec["kv_heads"] / tp)
        return 2 * spec["kv_layers"] * heads * spec["head_dim"] * spec["kv_dtype_bytes"]
    raise ValueError(f"attention must be 'gqa' or 'mla', got {spec['attention']!r}")


def _model(name: str, spec: dict, box: Box, weight: int, mean_weight: float) -> ModelSpec:
    _unknown(spec, _ARCH_FIELDS, f"models.{name}")
    given = dict(spec.get("profile") or {})
    _unknown(given, _PROFILE_FIELDS, f"models.{name}.profile")
    kv = kv_bytes_per_token(spec, box.tp)
    derived = _derived(box, weight, kv, weight / mean_weight if mean_weight else 1.0)
    if "switch_s" in given:
        given["switch_s"] = {SwitchPath(k): float(v) for k, v in given["switch_s"].items()}
    prof = LatencyProfile(**{**derived, **given})
    return ModelSpec(
        name,
        prof,
        spec.get("hf_id"),
        _params(spec, "params_total_b"),
        _params(spec, "params_active_b"),
        weight,
        kv,
    )


def _params(spec: dict, key: str) -> int | None:
    return int(spec[key] * 1e9) if key in spec else None


def _derived(box: Box, weight: int, kv: int, weight_scale: float) -> dict:
    out: dict = {"weight_bytes": weight, "kv_bytes_per_token": kv}
    if kv and box.h2d_bytes_per_s:
        out["restore_s_per_token"] = kv / (box.h2d_bytes_per_s * box.restore_efficiency)
    if kv and box.hbm_bytes_per_s and box.decode_context_tokens:
        out["decode_s_per_seq"] = kv * box.decode_context_tokens / box.hbm_bytes_per_s
    if box.switch_phases_s and weight and box.h2d_bytes_per_s and box.d2d_bytes_per_s:
        if box.switch_s_pooled or box.fallback_s_pooled is not None:
            raise ValueError("box: give switch_phase_ms or switch_ms_pooled, not both")

        # the scheduler's and router's estimates, from the same mechanism the simulator charges:
        # everything staged (d2d), half of it (partial), nothing (h2d; an open is one too); with
        # resident weights (`kv_reserve_gib_per_gpu`) the d2d path moves no bytes at all
        def priced(path: SwitchPath, d2d: float, h2d: float) -> float:
            copy = d2d / box.d2d_bytes_per_s + h2d / box.h2d_bytes_per_s
            return sum(box.switch_phases_s[path]) + box.open_fixed_s + copy

        resident = box.kv_reserve_bytes_per_gpu is not None
        table = {
            SwitchPath.D2D: priced(SwitchPath.D2D, 0.0 if resident else weight, 0.0),
            SwitchPath.PARTIAL: priced(SwitchPath.PARTIAL, weight / 2, weight / 2),
            SwitchPath.H2D: priced(SwitchPath.H2D, 0.0, weight),
        }
        out["switch_s"], out["open_s"] = table, table[SwitchPath.H2D]
    if box.switch_s_pooled:
        table = {
            p: s if p is SwitchPath.D2D else s * weight_scale
            for p, s in box.switch_s_pooled.items()
        }
        out["switch_s"] = table
        out["open_s"] = table.get(SwitchPath.H2D, LatencyProfile().open_s)
    if box.fallback_s_pooled is not None:
        out["fallback_s"] = box.fallback_s_pooled * weight_scale
    return out
