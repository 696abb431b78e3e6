"""A scripted admin server on a unix socket: fixed replies, and a record of the actions asked."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc

from talariad.admin import admin_pb2 as pb
from talariad.admin import admin_pb2_grpc

MIB = 2**20


def _instance(
    name: str, pool: str, models: list[str], active: str, admission: str = "open"
) -> pb.InstanceStatus:
    return pb.InstanceStatus(
        name=name,
        pool=pool,
        configured_pool=pool,
        executor="torch",
        devices="cpu",
        models=models,
        rotation=models,
        active_model=active,
        state="ready",
        healthy=True,
        pid=100 + len(name),
        restarts=0,
        running=1,
        queued=2,
        switches=3,
        telemetry_age_s=0.1,
        admission=admission,
    )


def status(admission: str = "open") -> pb.StatusReply:
    return pb.StatusReply(
        version="0.1.0",
        uptime_s=42.0,
        http_endpoint="http://127.0.0.1:8000",
        instances=[
            _instance("hot0", "hot", ["tiny-chat"], "tiny-chat"),
            _instance("cold0", "cold", ["tiny-chat", "tiny-code"], "tiny-code", admission),
        ],
    )


def rounds() -> pb.RoundsReply:
    slot = lambda m, *ph: pb.Slot(  # noqa: E731
        model=m,
        phases=[pb.SlotPhase(phase=p, seconds=s) for p, s in ph],  # noqa: E731
        sp_admitted=1,
        sp_parked=0,
    )
    names = ("save/teardown", "open weights", "KV shell", "runtime and graphs", "publish")
    return pb.RoundsReply(
        rounds=[
            pb.RoundRecord(
                instance="cold0",
                index=i,
                wall_s=1.0 + i,
                active_s=0.8 + i,
                switch_s=0.2,
                predicted_s=2,
                slots=[
                    slot("tiny-chat", ("P", 0.1), ("D1", 0.3)),
                    slot("tiny-code", ("P", 0.2), ("Dfin", 0.2)),
                ],
                sp_admitted=1,
                sp_parked=i,
                switches=2,
                open=i == 2,
                age_s=3.0 - i,
            )
            for i in range(3)
        ],
        switches=[
            pb.SwitchRecord(
                instance="cold0",
                round_index=1,
                from_model="tiny-chat",
                to_model="tiny-code",
                path="d2d",
                total_ms=12.5,
                staged_bytes=3 * MIB,
                dirty_bytes=MIB,
                age_s=1.0,
                phases=[
                    pb.SwitchPhase(name=n, ms=ms)
                    for n, ms in zip(names, (1, 6, 0.5, 3, 2), strict=False)
                ],
            )
        ],
    )


def memory(name: str) -> pb.MemoryReply:
    if name == "hot0":
        return pb.MemoryReply(instance=name, managed=False)
    layout = [
        ("weights", 0, 50, "tiny-code"),
        ("kv_pool", 50, 140, "tiny-code"),
        ("staged[0]", 150, 20, "tiny-chat:clean"),
        ("staged[1]", 170, 20, "tiny-chat:dirty"),
        ("graph_pool", 190, 16, "graphs"),
        ("runtime", 206, 50, "runtime"),
    ]
    return pb.MemoryReply(
        instance=name,
        managed=True,
        active_model="tiny-code",
        capacity_bytes=256 * MIB,
        hbm_free_bytes=100 * MIB,
        staging_slack_bytes=10 * MIB,
        layout=[
            pb.Region(region=r, offset=o * MIB, size=s * MIB, owner=w) for r, o, s, w in layout
        ],
        host_kv_bytes=8 * MIB,
        host_kv_capacity_bytes=128 * MIB,
        host_kv_by_model={"tiny-chat": 3 * MIB, "tiny-code": 5 * MIB},
    )


class FakeAdmin(admin_pb2_grpc.AdminServicer):
    def __init__(self):
        self.actions: list[tuple] = []
        self.admission = "open"
        self.leases = [
            pb.Lease(
                session_id="sess-a",
                model="tiny-code",
                instance="cold0",
                kv_len=512,
                expires_in_s=0.9,
            ),
            pb.Lease(
                session_id="sess-b", model="tiny-chat", instance="hot0", kv_len=64, expires_in_s=0.4
            ),
        ]
        self.stop = threading.Event()

    def Status(self, request, context):  # noqa: N802
        return status(self.admission)

    def WatchStatus(self, request, context):  # noqa: N802
        while context.is_active() and not self.stop.is_set():
            yield status(self.admission)
            self.stop.wait(request.interval_s or 1.0)

    def WatchRounds(self, request, context):  # noqa: N802
        yield rounds()
        while context.is_active() and not self.stop.is_set():
            self.stop.wait(0.2)
            yield pb.RoundsReply()

    def WatchRouter(self, request, context):  # noqa: N802
        while context.is_active() and not self.stop.is_set():
            yield pb.RouterState(
                leases=self.leases,
                sessions=self.Sessions(None, None).sessions,
                decisions=self.Decisions(None, None).decisions,
            )
            self.stop.wait(request.interval_s or 1.0)

    def Leases(self, request, context):  # noqa: N802
        return pb.LeasesReply(leases=self.leases)

    def Sessions(self, request, context):  # noqa: N802
        return pb.SessionsReply(
            sessions=[
                pb.Session(
                    session_id="sess-a",
                    instance="cold0",
                    model="tiny-code",
                    kv_len=512,
                    idle_s=0.5,
                    leased=True,
                ),
                pb.Session(
                    session_id="sess-c",
                    instance="hot0",
                    model="tiny-chat",
                    kv_len=9,
                    idle_s=30.0,
                    leased=False,
                ),
            ]
        )

    def Decisions(self, request, context):  # noqa: N802
        cand = lambda i, t, ok: pb.Candidate(  # noqa: E731
            instance=i,
            queue_s=t / 2,
            prefill_s=0.1,
            decode_s=0.2,  # noqa: E731
            kv_recovery_s=0.05,
            activation_s=0.0 if ok else 1.5,
            total_s=t,
            feasible=ok,
            reason="" if ok else "eq2",
            kv_state="device",
        )
        return pb.DecisionsReply(
            decisions=[
                pb.Decision(
                    call_id="c1",
                    kind="cost",
                    instance="cold0",
                    policy="talaria",
                    reason="min cost",
                    age_s=1.0,
                    candidates=[cand("cold0", 0.4, True), cand("hot0", 2.5, False)],
                ),
                pb.Decision(
                    call_id="c0",
                    kind="lease_hit",
                    instance="hot0",
                    policy="talaria",
                    reason="lease",
                    age_s=2.0,
                    candidates=[cand("hot0", 0.3, True)],
                ),
            ]
        )

    def Memory(self, request, context):  # noqa: N802
        return memory(request.instance)

    def PoolPlan(self, request, context):  # noqa: N802
        return plan()

    def DrainInstance(self, request, context):  # noqa: N802
        self.actions.append(("drain", request.instance))
        self.admission = "drained"
        return status(self.admission).instances[1]

    def RevokeLease(self, request, context):  # noqa: N802
        self.actions.append(("revoke", request.session_id, request.model))
        self.leases = [le for le in self.leases if le.session_id != request.session_id]
        return pb.LeasesReply()


def plan() -> pb.PlanReply:
    move = pb.PlanMove(
        instance="hot0",
        before="hot:tiny-chat",
        after="hot:tiny-code",
        drain_s=0.2,
        load_s=0.2,
        kv_s=1.5,
        during_s=0.5,
        cost_s=2.0,
    )
    return pb.PlanReply(
        mode="advise",
        assignment=["hot0=hot:tiny-chat", "cold0=cold:tiny-chat,tiny-code"],
        has_move=True,
        move=move,
        delay_now_s=0.8,
        delay_after_s=0.1,
        gain_s=420.0,
        reasons=["expected delay 0.800 s per s", "move: gain 420.0 s > 2 x cost 2.0 s"],
        history=[pb.PlanEvent(age_s=30, move=move, by="operator", outcome="done", took_s=1.2)],
    )


def serve(path: str) -> tuple[grpc.Server, FakeAdmin]:
    server = grpc.server(futures.ThreadPoolExecutor(8))
    fake = FakeAdmin()
    admin_pb2_grpc.add_AdminServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server, fake
