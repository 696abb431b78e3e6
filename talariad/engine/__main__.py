"""`python -m talariad.engine --config FILE --instance NAME`: one instance process.

It binds a loopback port and a unix socket for the call stream (`wire/stream.py`), prints one JSON
ready line (`{"ready": true, "port": N, "socket": PATH, "token": T}`) on stdout for the supervisor,
serves the internal API to holders of the per-start token T only, and exits with status 0 on
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from talariad import httpserver
from talariad.config import ConfigError, InstanceConfig, TalariaConfig, load_config
from talariad.engine.api import build_app
from talariad.engine.build import build_worker
from talariad.wire import stream

log = logging.getLogger("talariad.engine")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m talariad.engine")
    p.add_argument("--config", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--socket", help="unix socket path of the call stream (default: in a new temp folder)"
    )
    p.add_argument(
        "--role",
        default=None,
        help="JSON override of the instance's pool and models (pool move, pin)",
    )
    return p.parse_args(argv)


async def _serve(
    cfg: TalariaConfig,
    inst: InstanceConfig,
    host: str,
    config_dir: Path,
    socket_path: str | None = None,
) -> int:
    stop = httpserver.stop_event()
    try:
        worker = build_worker(cfg, inst, config_dir)
    except ValueError as err:  # a config the engine cannot serve (no CUDA, memory too small ...)
        print(f"instance {inst.name}: {err}", file=sys.stderr)
        return 2
    executor = worker.executor
    try:  # an executor with servers to bring up (sglang) is ready only after them
        await executor.start()
    except Exception as err:
        print(f"instance {inst.name}: {err}", file=sys.stderr)
        await executor.aclose()
        return 1
    loop = asyncio.create_task(worker.run())
    sock = httpserver.bind(host, 0)
    token = secrets.token_urlsafe(32)  # read by the supervisor from our stdout pipe, nowhere else
    server, task = await httpserver.start(build_app(worker, token), sock)
    own_dir = None if socket_path else tempfile.mkdtemp(prefix="talaria-")  # mode 0700
    socket_path = socket_path or os.path.join(own_dir, "calls.sock")
    calls = await stream.serve(worker, socket_path)
    try:
        print(
            json.dumps(
                {
                    "ready": True,
                    "port": sock.getsockname()[1],
                    "socket": socket_path,
                    "token": token,
                }
            ),
            flush=True,
        )
        await asyncio.wait(
            [task, loop, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        server.should_exit = True
        calls.close()
        await task
        await executor.aclose()
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(socket_path)
    if loop.done():  # the scheduler loop died: exit non-zero so the supervisor restarts us
        log.error("instance loop stopped", exc_info=loop.exception())
        return 1
    loop.cancel()
    return 0


def _die_with_parent() -> None:
    """Get SIGTERM when the daemon dies without stopping us (Linux), so no instance is orphaned."""
    parent = os.environ.get("TALARIA_PARENT_PID")
    if not parent or not parent.isdigit():
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    args = _args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    inst = next((i for i in cfg.instances if i.name == args.instance), None)
    if inst is None:
        print(f"{args.config}: instances: no instance named {args.instance!r}", file=sys.stderr)
        return 2
    if args.role:
        try:
            inst = InstanceConfig.model_validate({**inst.model_dump(), **json.loads(args.role)})
        except ValueError as err:
            print(f"--role: {err}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s {inst.name}: %(message)s"
    )
    return asyncio.run(
        _serve(cfg, inst, args.host, Path(args.config).resolve().parent, args.socket)
    )


if __name__ == "__main__":
    sys.exit(main())
