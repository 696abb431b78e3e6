"""What a torch instance reports about its memory: HBM layout rows, switch records, free bytes."""

from __future__ import annotations

import dataclasses

from talariad.memory import Substrate, SwitchTiming


def memory_stats(sub: Substrate) -> dict[str, int]:
    pages, geo = sub.pages, sub.geometry
    free = pages.num_free * geo.layout.row_bytes if pages is not None and geo is not None else 0
    slabs = sub.registry.pool
    return {
        "hbm_free_bytes": free,
        "staging_slack_bytes": sub.staging_slack(),
        "host_kv_bytes": (slabs.num_slabs - slabs.num_free) * slabs.slab_bytes,
        "host_kv_capacity_bytes": slabs.num_slabs * slabs.slab_bytes,
    }


def host_kv_by_model(sub: Substrate) -> dict[str, int]:
    """Host KV bytes each model's saved blocks hold."""
    out: dict[str, int] = {}
    size = sub.registry.pool.slab_bytes
    for (model, _), block in sub.registry.blocks.items():
        out[model] = out.get(model, 0) + len(block.slabs) * size
    return out


def memory_report(sub: Substrate, last: int = 50) -> dict:
    """Layout rows (low address first) and the `last` switch records, as JSON-ready dicts."""
    rows = [{"region": n, "offset": o, "size": s, "owner": w} for n, o, s, w in sub.layout_report()]
    return {
        "active_model": sub.active,
        "capacity_bytes": sub.config.capacity_bytes,
        "device": str(getattr(sub.device, "name", "")),
        "layout": rows,
        "switches": [record_dict(r) for r in list(sub.records)[-last:]],
        "host_kv_by_model": host_kv_by_model(sub),
        **memory_stats(sub),
    }


def record_dict(record: SwitchTiming) -> dict:
    out = dataclasses.asdict(record)
    out["path"] = record.path.value
    out["total_s"] = record.total_s
    return out
