"""Launch and stop one SGLang server process (reference §2): its flags, port, key and readiness."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from talariad.config import InstanceConfig
from talariad.engine.executors.sglang.client import SGLangClient

log = logging.getLogger("talariad.engine.sglang")


class LaunchError(RuntimeError):
    """A server did not come up (exited, or no healthy /health before the deadline)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def hicache_dir(inst: InstanceConfig) -> Path:
    return Path(inst.sglang.hicache_dir) / inst.name


def server_args(
    inst: InstanceConfig, model: str, model_path: str, port: int, api_key: str
) -> list[str]:
    """The flags of `sglang.launch_server` for `model` on this instance (exact 0.5.23 names)."""
    sg = inst.sglang
    args = [
        "--model-path",
        model_path,
        "--served-model-name",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        str(len(inst.devices)),
        "--base-gpu-id",
        str(inst.devices[0]),
        "--enable-metrics",
        "--api-key",
        api_key,
    ]
    if sg.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(sg.mem_fraction_static)]
    if sg.max_total_tokens is not None:
        args += ["--max-total-tokens", str(sg.max_total_tokens)]
    if inst.pool == "cold":
        args += ["--enable-memory-saver", "--enable-weights-cpu-backup"]
        if sg.kv_host == "storage":
            args += ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]
    return args + list(sg.extra_args)


def server_env(inst: InstanceConfig) -> dict[str, str]:
    env = dict(os.environ)
    if inst.pool == "cold" and inst.sglang.kv_host == "storage":
        # the file backend's directory (mem_cache/hicache_storage.py::HiCacheFile)
        env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = str(hicache_dir(inst))
    return env


def launch_command(inst: InstanceConfig) -> list[str]:
    return list(inst.sglang.launch_command or [sys.executable, "-m", "sglang.launch_server"])


def _child_setup() -> None:
    """In the child: own process group (SGLang spawns schedulers; we signal them all), and
    SIGTERM when the instance process dies, so no server is orphaned (Linux)."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class ServerProcess:
    model: str
    port: int
    proc: asyncio.subprocess.Process
    client: SGLangClient

    @classmethod
    async def launch(
        cls, inst: InstanceConfig, model: str, model_path: str, ready_timeout_s: float
    ) -> ServerProcess:
        port, key = (
            free_port(),
            secrets.token_hex(24),
        )  # fresh per start; hex: never starts with "-" (argparse)
        argv = launch_command(inst) + server_args(inst, model, model_path, port, key)
        if inst.sglang.kv_host == "storage" and inst.pool == "cold":
            hicache_dir(inst).mkdir(parents=True, exist_ok=True)
        log.info("starting SGLang server for %s on port %d", model, port)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=server_env(inst),
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=_child_setup,
            )
        except OSError as err:
            raise LaunchError(f"cannot start {argv[0]!r}: {err.strerror or err}") from None
        server = cls(model, port, proc, SGLangClient(f"http://127.0.0.1:{port}", key))
        await server._wait_ready(ready_timeout_s)
        return server

    async def _wait_ready(self, timeout_s: float) -> None:
        """Poll /health (the server is active: nothing is paused or released yet)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if self.proc.returncode is not None:
                await self.client.aclose()
                raise LaunchError(
                    f"SGLang server for {self.model} exited with status {self.proc.returncode} "
                    f"during startup"
                )
            if await self.client.health():
                return
            await asyncio.sleep(0.1)
        await self.stop(5.0)
        raise LaunchError(
            f"SGLang server for {self.model} was not healthy within {timeout_s:.0f} s"
        )

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`."""
        await self.client.aclose()
        if self.proc.returncode is None:
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                self._signal(signal.SIGKILL)
                await self.proc.wait()
        return self.proc.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
