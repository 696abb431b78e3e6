"""Router state as admin API messages (the ctl and the dashboard read these)."""

from __future__ import annotations

from talariad.admin import admin_pb2
from talariad.router import Decision, Lease, Router, SessionEntry
from talariad.wire.decision import decision_fields


def session(e: SessionEntry, now: float) -> admin_pb2.Session:
    return admin_pb2.Session(
        session_id=e.session_id,
        instance=e.instance or "",
        model=e.model or "",
        kv_len=e.kv_len,
        idle_s=max(0.0, now - e.last_used),
        leased=e.lease is not None and e.lease.live(now),
    )


def lease(le: Lease, now: float) -> admin_pb2.Lease:
    return admin_pb2.Lease(
        session_id=le.session_id,
        model=le.model,
        instance=le.instance,
        kv_len=le.kv_len,
        expires_in_s=max(0.0, le.t_exp - now),
    )


def decision(d: Decision, now: float) -> admin_pb2.Decision:
    fields = decision_fields(d, now)
    candidates = [admin_pb2.Candidate(**c) for c in fields.pop("candidates")]
    return admin_pb2.Decision(**fields, candidates=candidates)


def sessions(router: Router, now: float, limit: int) -> admin_pb2.SessionsReply:
    rows = sorted(router.sessions(), key=lambda e: e.last_used, reverse=True)
    rows = rows[:limit] if limit > 0 else rows
    return admin_pb2.SessionsReply(sessions=[session(e, now) for e in rows])


def leases(router: Router, now: float) -> admin_pb2.LeasesReply:
    return admin_pb2.LeasesReply(leases=[lease(le, now) for le in router.leases() if le.live(now)])


def memory(instance: str, report: dict) -> admin_pb2.MemoryReply:
    """An instance's `/internal/memory` report as the admin message (empty when unmanaged)."""
    process = admin_pb2.ProcessStats(**report.get("process", {}))
    if not report.get("layout"):
        return admin_pb2.MemoryReply(instance=instance, managed=False, process=process)
    return admin_pb2.MemoryReply(
        instance=instance,
        managed=True,
        process=process,
        active_model=report.get("active_model") or "",
        capacity_bytes=report.get("capacity_bytes", 0),
        hbm_free_bytes=report.get("hbm_free_bytes", 0),
        staging_slack_bytes=report.get("staging_slack_bytes", 0),
        host_kv_bytes=report.get("host_kv_bytes", 0),
        host_kv_capacity_bytes=report.get("host_kv_capacity_bytes", 0),
        host_kv_by_model=report.get("host_kv_by_model", {}),
        layout=[admin_pb2.Region(**row) for row in report["layout"]],
        switches=[_switch(r) for r in report.get("switches", [])],
    )


def _switch(r: dict) -> admin_pb2.SwitchTiming:
    return admin_pb2.SwitchTiming(
        from_model=r.get("from_model") or "",
        to_model=r["to_model"],
        path=r["path"],
        phase_ms=[1e3 * x for x in r["phase_s"]],
        total_ms=1e3 * r["total_s"],
        staged_bytes=r["staged_bytes"],
        dirty_bytes=r["dirty_bytes"],
        h2d_bytes=r["h2d_bytes"],
        d2d_gather_ms=1e3 * r["d2d_gather_s"],
        h2d_gather_ms=1e3 * r["h2d_gather_s"],
    )
