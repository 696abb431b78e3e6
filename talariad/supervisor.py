"""Instance process lifecycle: spawn one `python -m talariad.engine` per instance, wait until it
reports ready, restart it with exponential backoff when it exits, stop them all on shutdown."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

from talariad.config import InstanceConfig, TalariaConfig

log = logging.getLogger("talariad.supervisor")

_STABLE_S = 30.0  # a process that lived this long resets its restart backoff


class ProcState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"
    STOPPED = "stopped"


@dataclass
class Managed:
    inst: InstanceConfig
    state: ProcState = ProcState.STARTING
    port: int | None = None
    socket: str | None = None
    token: str | None = field(default=None, repr=False)
    """The per-start secret the instance's internal API requires (from its ready line)."""
    pid: int | None = None
    restarts: int = 0
    role: dict | None = None
    """Run-time override of the instance's `pool` and `models` (pool move, pin); None: as configured."""
    restarting: bool = False
    """An operator restart is under way: the next start skips the crash backoff."""
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)
    ready: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def base_url(self) -> str | None:
        return (
            f"http://127.0.0.1:{self.port}" if self.port and self.state == ProcState.READY else None
        )

    @property
    def call_socket(self) -> str | None:
        """The instance's call-stream unix socket (`wire/stream.py`), when it is ready."""
        return self.socket if self.state == ProcState.READY else None


class Supervisor:
    def __init__(self, cfg: TalariaConfig, config_path: str):
        self.cfg, self.config_path = cfg, config_path
        self.procs = {i.name: Managed(i) for i in cfg.instances}
        self._stopping = False
        self._tasks: list[asyncio.Task] = []
        self.socket_dir = ""  # the instances' call-stream sockets, made by start()

    async def start(self) -> None:
        """Spawn every instance and return once all reported ready (or raise on timeout)."""
        self.socket_dir = tempfile.mkdtemp(
            prefix="talaria-"
        )  # mode 0700: only this user reaches them
        self._tasks = [asyncio.create_task(self._keep(m)) for m in self.procs.values()]
        waits = [
            asyncio.wait_for(m.ready.wait(), self.cfg.supervisor.ready_timeout_s)
            for m in self.procs.values()
        ]
        try:
            await asyncio.gather(*waits)
        except TimeoutError:
            slow = [m.inst.name for m in self.procs.values() if not m.ready.is_set()]
            raise RuntimeError(
                f"instances not ready after {self.cfg.supervisor.ready_timeout_s}s: {', '.join(slow)}"
            ) from None

    async def _keep(self, m: Managed) -> None:
        backoff = self.cfg.supervisor.restart_backoff_s
        while not self._stopping:
            started = time.monotonic()
            rc = await self._run_once(m)
            if self._stopping:
                break
            m.state, m.port, m.socket = ProcState.BACKOFF, None, None
            if m.restarting:  # asked for: no backoff, and not a crash
                m.restarting = False
                m.restarts += 1
                continue
            backoff = (
                self.cfg.supervisor.restart_backoff_s
                if time.monotonic() - started > _STABLE_S
                else backoff
            )
            log.warning("instance %s exited with %s; restarting in %.1fs", m.inst.name, rc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.cfg.supervisor.max_backoff_s)
            m.restarts += 1
        m.state = ProcState.STOPPED

    async def _run_once(self, m: Managed) -> int:
        m.state = ProcState.STARTING
        # A session of its own: a terminal's SIGINT/SIGHUP reach the daemon only, which drains
        # calls before it stops its instances (PDEATHSIG still ends them if the daemon dies).
        m.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "talariad.engine",
            "--config",
            self.config_path,
            "--instance",
            m.inst.name,
            "--socket",
            os.path.join(self.socket_dir, f"{m.inst.name}.sock"),
            *(["--role", json.dumps(m.role)] if m.role else []),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "TALARIA_PARENT_PID": str(os.getpid())},
            start_new_session=True,
        )
        m.pid = m.proc.pid
        async for line in m.proc.stdout:
            ready = _ready_line(line)
            if ready:
                m.port, m.socket, m.token, m.state = ready[0], ready[1], ready[2], ProcState.READY
                m.ready.set()
                log.info("instance %s ready on port %d (pid %d)", m.inst.name, m.port, m.pid)
        return await m.proc.wait()

    def restart(self, name: str, role: dict | None = None) -> bool:
        """Stop one instance process so `_keep` starts it again at once, with `role` as its
        pool/models override (None: as configured); False if it is not running now."""
        m = self.procs[name]
        if m.proc is None or m.proc.returncode is not None or m.restarting:
            return False
        m.role, m.restarting = role, True
        m.ready.clear()
        m.state, m.port, m.socket = ProcState.STARTING, None, None
        m.proc.send_signal(signal.SIGTERM)
        return True

    def token_for(self, port: int | None) -> str | None:
        """The internal-API token of the instance listening on `port`."""
        return next((m.token for m in self.procs.values() if port and m.port == port), None)

    def kill_now(self) -> None:
        """SIGKILL every instance process at once (a second SIGINT: exit without draining)."""
        self._stopping = True
        for m in self.procs.values():
            if m.proc and m.proc.returncode is None:
                m.proc.kill()

    async def stop(self) -> None:
        """SIGTERM every instance, SIGKILL those still alive after the grace period."""
        self._stopping = True
        live = [m.proc for m in self.procs.values() if m.proc and m.proc.returncode is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(p.wait() for p in live)), self.cfg.supervisor.stop_timeout_s
            )
        except TimeoutError:
            for p in live:
                if p.returncode is None:
                    p.kill()
            await asyncio.gather(*(p.wait() for p in live))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for m in self.procs.values():
            m.state = ProcState.STOPPED
        if self.socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def _ready_line(line: bytes) -> tuple[int, str | None, str | None] | None:
    """(port, call-stream socket, token) from an instance's ready line; None for any other output."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(msg, dict) and msg.get("ready") and isinstance(msg.get("port"), int)):
        return None
    path = msg.get("socket")
    return msg["port"], path if isinstance(path, str) and path else None, msg.get("token")
