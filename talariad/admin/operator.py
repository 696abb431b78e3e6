"""The operator's actions on a running daemon: drain, cordon, restart, pool moves, model rotation,
leases, sessions, config reload and round records. Each is idempotent and answers with the
resulting state; one that cannot apply raises `ActionRefused` (the admin server maps it to a gRPC code).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from talariad.admin import admin_pb2, views
from talariad.wire.client import InstanceUnreachable

if TYPE_CHECKING:
    from talariad.calls.branches import PrefixBranches
    from talariad.config import TalariaConfig
    from talariad.gateway.health import Availability
    from talariad.gateway.instances import InstanceDirectory
    from talariad.router import Router
    from talariad.supervisor import Supervisor


class DaemonState(Protocol):
    """What the operator reads of the daemon's own books."""

    cfg: TalariaConfig
    config_path: str
    admin_socket: str

    def reload_config(self) -> tuple[list[str], list[str]]: ...

    def pool_of(self, name: str) -> str: ...

    def serving_models(self, name: str) -> list[str]: ...

    def availability(self, model: str) -> Availability: ...

    def instance_status(self, name: str) -> admin_pb2.InstanceStatus: ...

    def residency(self, model: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Services:
    """The narrow parts of the daemon the operator acts through."""

    state: DaemonState
    supervisor: Supervisor
    router: Router
    branches: PrefixBranches
    directory: InstanceDirectory


RefusalKind = Literal["not_found", "failed_precondition", "invalid_argument"]
POOLS = ("hot", "cold")


class ActionRefused(Exception):
    def __init__(self, kind: RefusalKind, message: str):
        super().__init__(message)
        self.kind = kind


class Operator:
    def __init__(self, services: Services, drain_timeout_s: float = 120.0):
        self.s = services
        self.drain_timeout_s = drain_timeout_s
        self._moving: set[str] = set()
        self.automatic: str | None = None
        """The planner's move in progress (`talariad.admin.planning`): other moves wait for it."""

    # ---- helpers ---------------------------------------------------------------------------

    def _inst(self, name: str):
        m = self.s.supervisor.procs.get(name)
        if m is None:
            raise ActionRefused(
                "not_found",
                f"no instance named {name!r} (instances: {', '.join(self.s.supervisor.procs)})",
            )
        return m

    def _model(self, name: str) -> None:
        if self.s.state.cfg.model(name) is None:
            raise ActionRefused(
                "not_found",
                f"no model named {name!r} (models: {', '.join(m.name for m in self.s.state.cfg.models)})",
            )

    def _ready(self, name: str) -> None:
        proc = self.s.supervisor.procs[name]
        if proc.base_url is None:
            raise ActionRefused(
                "failed_precondition", f"instance {name} is not ready (state {proc.state.value})"
            )

    def status(self, name: str) -> admin_pb2.InstanceStatus:
        return self.s.state.instance_status(name)

    def _keep_a_taker(self, name: str, models: list[str], doing: str, force: bool) -> None:
        """Refuse to leave a model with no instance that takes its calls, unless forced."""
        for model in [] if force else models:
            if self.s.state.availability(model).takers == [name]:
                raise ActionRefused(
                    "failed_precondition",
                    f"{name} is the last instance that takes {model!r} calls; {doing} leaves "
                    "them failing with 503: repeat with --force to do it anyway",
                )

    # ---- instances -------------------------------------------------------------------------

    def drain(self, name: str, force: bool = False) -> admin_pb2.InstanceStatus:
        self._inst(name)
        self._keep_a_taker(name, self.s.state.serving_models(name), "draining it", force)
        self.s.router.close_instance(name, drain=True)
        return self.status(name)

    def cordon(self, name: str, force: bool = False) -> admin_pb2.InstanceStatus:
        self._inst(name)
        self._keep_a_taker(name, self.s.state.serving_models(name), "cordoning it", force)
        self.s.router.close_instance(name, drain=False)
        return self.status(name)

    def undrain(self, name: str) -> admin_pb2.InstanceStatus:
        self._inst(name)
        if name in self._moving:
            raise ActionRefused("failed_precondition", f"instance {name} is moving between pools")
        self.s.router.reopen_instance(name)
        return self.status(name)

    async def restart(
        self, name: str, role: dict | None = None, keep_role: bool = True
    ) -> admin_pb2.InstanceStatus:
        m = self._inst(name)
        if not self.s.supervisor.restart(name, m.role if keep_role else role):
            raise ActionRefused(
                "failed_precondition", f"instance {name} is not running (state {m.state.value})"
            )
        await self._ready(name)
        return self.status(name)

    async def _ready(self, name: str) -> None:
        m = self.s.supervisor.procs[name]
        try:
            await asyncio.wait_for(m.ready.wait(), self.s.state.cfg.supervisor.ready_timeout_s)
        except TimeoutError:
            raise ActionRefused(
                "failed_precondition",
                f"instance {name} did not come back within "
                f"{self.s.state.cfg.supervisor.ready_timeout_s}s",
            ) from None
        await self.s.directory.poll_once()

    async def _drained(self, name: str) -> None:
        """Wait until the instance has no call running or queued (telemetry says so)."""
        deadline = time.monotonic() + self.drain_timeout_s
        while True:
            await self.s.directory.poll_once()
            snap = self.s.directory.snapshot(name)
            if (
                snap is not None
                and snap.running == 0
                and not any(snap.queued.values())
                and not any(i == name for i in self.s.router.in_flight().values())
            ):
                return
            if time.monotonic() > deadline:
                raise ActionRefused(
                    "failed_precondition",
                    f"instance {name} still has calls after "
                    f"{self.drain_timeout_s:.0f}s of draining",
                )
            await asyncio.sleep(0.1)

    async def move(
        self, name: str, to: str, model: str = "", force: bool = False, automatic: bool = False
    ) -> admin_pb2.InstanceStatus:
        """Drain, restart in the new pool, place calls on it again (the paper's future-work
        dynamic pool reallocation, by hand or by the planner: `automatic`)."""
        if self.automatic is not None and not automatic:
            raise ActionRefused(
                "failed_precondition",
                f"an automatic move is in progress ({self.automatic}); "
                "see `talaria-ctl pool plan`, and retry when it has ended",
            )
        m = self._inst(name)
        if to not in POOLS:
            raise ActionRefused("invalid_argument", f"pool must be hot or cold, not {to!r}")
        pool = (m.role or {}).get("pool", m.inst.pool)
        if pool == to and (not model or to == "cold" or self._models_of(name) == [model]):
            return self.status(name)
        if name in self._moving:
            raise ActionRefused("failed_precondition", f"instance {name} is already moving")
        role = self._role(name, to, model)
        self._keep_a_taker(name, self.s.state.serving_models(name), "moving it", force)
        was_closed = name in self.s.router.closed_instances()
        self._moving.add(name)
        try:
            self.s.router.close_instance(name, drain=True)
            await self._drained(name)
            await self.restart(name, role, keep_role=False)
        finally:
            self._moving.discard(name)
            if not was_closed:
                self.s.router.reopen_instance(name)
        return self.status(name)

    def _models_of(self, name: str) -> list[str]:
        m = self.s.supervisor.procs[name]
        return list((m.role or {}).get("models", m.inst.models))

    def _role(self, name: str, to: str, model: str) -> dict | None:
        inst = self.s.supervisor.procs[name].inst
        if to == "cold":
            if model:
                raise ActionRefused("invalid_argument", "--model applies to a move to the hot pool")
            return None if inst.pool == "cold" else {"pool": "cold"}
        snap = self.s.directory.snapshot(name)
        model = model or (
            snap.active_model if snap and snap.active_model else self._models_of(name)[0]
        )
        self._model(
            model
        )  # any model of the config: the instance process is built for it on restart
        return (
            None
            if inst.pool == "hot" and inst.models == [model]
            else {"pool": "hot", "models": [model]}
        )

    # ---- models ----------------------------------------------------------------------------

    def models(self) -> admin_pb2.ModelsReply:
        return admin_pb2.ModelsReply(
            models=[self.model_status(m.name) for m in self.s.state.cfg.models]
        )

    def model_status(self, model: str) -> admin_pb2.ModelStatus:
        serving = [n for n in self.s.supervisor.procs if model in self.s.state.serving_models(n)]
        pinned = [n for n in serving if self.s.state.pool_of(n) == "hot"]
        cfg = self.s.state.cfg.model(model)
        return admin_pb2.ModelStatus(
            name=model,
            instances=serving,
            pinned_on=pinned,
            status=self.s.state.residency(model) if serving else "unserved",
            max_context=cfg.max_context,
            profile=cfg.profile or "",
        )

    def _hot(self, name: str) -> None:
        if self.s.state.pool_of(name) != "hot":
            raise ActionRefused(
                "failed_precondition",
                f"instance {name} is in the cold pool; "
                f"use `model load` for a cold instance's rotation",
            )

    async def pin(self, model: str, name: str, force: bool = False) -> admin_pb2.ModelStatus:
        self._model(model)
        self._inst(name)
        self._hot(name)
        if self._models_of(name) != [model]:
            await self.move(name, "hot", model, force)
        return self.model_status(model)

    async def unpin(self, model: str, name: str, force: bool = False) -> admin_pb2.ModelStatus:
        self._model(model)
        m = self._inst(name)
        self._hot(name)
        if self._models_of(name) != [model]:
            raise ActionRefused(
                "failed_precondition",
                f"instance {name} pins {self._models_of(name)[0]!r}, not {model!r}",
            )
        if m.role is None:
            raise ActionRefused(
                "failed_precondition",
                f"{model!r} is the model the config pins on {name}; pin another one instead",
            )
        if m.inst.pool == "cold":
            raise ActionRefused(
                "failed_precondition",
                f"{name} is a cold instance moved to the hot pool; "
                f"move it back with `pool move {name} --to cold`",
            )
        await self.move(name, "hot", m.inst.models[0], force)  # back to the model the config pins
        return self.model_status(model)

    async def rotation(
        self, model: str, name: str, serve: bool, force: bool = False
    ) -> admin_pb2.ModelStatus:
        self._model(model)
        self._inst(name)
        if self.s.state.pool_of(name) != "cold":
            raise ActionRefused(
                "failed_precondition", f"instance {name} is a hot instance; use `model pin`"
            )
        if not serve:
            self._keep_a_taker(name, [model], f"unloading {model} from it", force)
        self._ready(name)
        try:
            refused = await self.s.directory.client.rotation(name, model, serve)
        except InstanceUnreachable as err:
            raise ActionRefused("failed_precondition", str(err)) from None
        if refused is not None:
            raise ActionRefused("failed_precondition", refused)
        await self.s.directory.poll_once()  # the router sees the new rotation before we answer
        return self.model_status(model)

    # ---- pools, leases, sessions -------------------------------------------------------------

    def pools(self) -> admin_pb2.PoolsReply:
        out = []
        for pool in POOLS:
            names = [n for n in self.s.supervisor.procs if self.s.state.pool_of(n) == pool]
            snaps = [s for n in names if (s := self.s.directory.snapshot(n)) is not None]
            models = sorted({m for n in names for m in self.s.state.serving_models(n)})
            out.append(
                admin_pb2.Pool(
                    name=pool,
                    instances=names,
                    models=models,
                    running=sum(s.running for s in snaps),
                    queued=sum(sum(s.queued.values()) for s in snaps),
                )
            )
        return admin_pb2.PoolsReply(pools=out)

    def revoke(self, session_id: str, model: str) -> admin_pb2.LeasesReply:
        if not session_id:
            raise ActionRefused("invalid_argument", "session_id is empty")
        if model:
            self._model(model)
        router = self.s.router
        # a session's leases are its branches' (`S~<key>`); a branch's name revokes that branch
        names = {session_id} | {
            e.session_id for e in router.sessions() if _of_session(e.session_id, session_id)
        }
        dropped = [le for name in sorted(names) for le in router.revoke(name, model or None)]
        if (
            not dropped
            and names == {session_id}
            and all(e.session_id != session_id for e in router.sessions())
        ):
            raise ActionRefused("not_found", f"no session {session_id!r} in the router's table")
        now = time.monotonic()
        return admin_pb2.LeasesReply(
            leases=[
                lease for lease in _live_leases(self.s.router, now) if lease.session_id in names
            ]
        )

    async def forget(self, session_id: str) -> admin_pb2.ForgetReply:
        if not session_id:
            raise ActionRefused("invalid_argument", "session_id is empty")
        known, dropped = False, []
        freed = []
        # the session and its branches (`S~<key>`): each is a session to the router and the
        # instances; a branch the gateway already evicted but something still holds goes too
        for branch in self._branch_names(session_id):
            was_known, gone = self.s.router.forget_session(branch)
            known, dropped = known or was_known, dropped + gone
            for name, m in self.s.supervisor.procs.items():
                if m.base_url is None:
                    continue
                try:
                    if await self.s.directory.client.forget(name, branch) and name not in freed:
                        freed.append(name)
                except InstanceUnreachable as err:
                    raise ActionRefused("failed_precondition", str(err)) from None
        if not known and not freed:
            raise ActionRefused(
                "not_found", f"no session {session_id!r} in the router's table or on any instance"
            )
        return admin_pb2.ForgetReply(
            session_id=session_id,
            known=known or bool(freed),
            leases_dropped=len(dropped),
            instances_freed=freed,
        )

    def _branch_names(self, session_id: str) -> list[str]:
        names = set(self.s.branches.forget(session_id))
        names.update(
            e.session_id for e in self.s.router.sessions() if _of_session(e.session_id, session_id)
        )
        return sorted(names)

    # ---- config --------------------------------------------------------------------------------

    def reload(self) -> tuple[list[str], list[str]]:
        """Re-read the config file: (applied, needs restart); ConfigError when it is invalid."""
        return self.s.state.reload_config()

    def config(self) -> tuple[str, dict]:
        """The config in effect: its path and data, with run-time pool moves and pins and the
        admin socket in use (also when defaulted)."""
        data = self.s.state.cfg.model_dump(mode="json")
        data["listen"]["admin_socket"] = self.s.state.admin_socket
        for inst in data["instances"]:
            inst.update(self.s.supervisor.procs[inst["name"]].role or {})
        return self.s.state.config_path, data

    # ---- rounds ------------------------------------------------------------------------------

    async def rounds(self, instance: str, limit: int) -> admin_pb2.RoundsReply:
        names = (
            [instance]
            if instance
            else [n for n in self.s.supervisor.procs if self.s.state.pool_of(n) == "cold"]
        )
        if instance:
            self._inst(instance)
        reply = admin_pb2.RoundsReply()
        for name in names:
            data = await self.s.directory.client.rounds(name, limit)
            if data is None:
                continue
            reply.rounds.extend(round_record(name, x) for x in data.get("rounds", []))
            reply.switches.extend(switch_record(name, x) for x in data.get("switches", []))
        return reply


def _of_session(name: str, session_id: str) -> bool:
    """`name` is one of `session_id`'s branches (`calls.branches`: `S~<key>`)."""
    return name.startswith(f"{session_id}~")


def _live_leases(router: Router, now: float):
    return views.leases(router, now).leases


def round_record(instance: str, r: dict) -> admin_pb2.RoundRecord:
    slots = [
        admin_pb2.Slot(
            model=s["model"],
            sp_admitted=s["sp_admitted"],
            sp_parked=s["sp_parked"],
            phases=[
                admin_pb2.SlotPhase(phase=p, seconds=v) for p, v in s["phases"].items() if v > 0
            ],
        )
        for s in r.get("slots", [])
    ]
    return admin_pb2.RoundRecord(
        instance=instance,
        index=r["index"],
        wall_s=r["wall_s"],
        active_s=r["active_s"],
        switch_s=r["switch_s"],
        predicted_s=r["predicted_s"],
        slots=slots,
        sp_admitted=r["sp_admitted"],
        sp_parked=r["sp_parked"],
        switches=r["switches"],
        open=r["open"],
        age_s=r["age_s"],
    )


def switch_record(instance: str, w: dict) -> admin_pb2.SwitchRecord:
    return admin_pb2.SwitchRecord(
        instance=instance,
        round_index=w["round_index"],
        from_model=w["from_model"],
        to_model=w["to_model"],
        path=w["path"],
        total_ms=1e3 * w["total_s"],
        phases=[admin_pb2.SwitchPhase(name=n, ms=1e3 * s) for n, s in w["phases"].items()],
        staged_bytes=w["staged_bytes"],
        dirty_bytes=w["dirty_bytes"],
        age_s=w["age_s"],
    )
