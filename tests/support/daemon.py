"""A real `talariad run` on loopback ports: start one, wait for it, stop it (the one daemon factory
of the tests)."""

from __future__ import annotations

import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclass
class Daemon:
    proc: subprocess.Popen
    endpoint: str
    socket_path: str
    config_path: pathlib.Path
    notify: socket.socket
    lines: queue.Queue = field(default_factory=queue.Queue)

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def notifications(self) -> list[str]:
        out = []
        self.notify.setblocking(False)
        while True:
            try:
                out += self.notify.recv(4096).decode().splitlines()
            except BlockingIOError:
                return out


def _pump(stream, sink: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        sink.put(line)


def tiny_default() -> dict:
    """The embedded default with its hot instance on `tiny-chat` instead of the real `smol-chat`:
    the suite's daemons start in seconds on the tiny models (tests/e2e/test_real_model.py is the
    one module that serves smol-chat)."""
    cfg = yaml.safe_load((ROOT / "etc" / "talaria.yaml").read_text())
    cfg["models"] = [m for m in cfg["models"] if m["name"] != "smol-chat"]
    for inst in cfg["instances"]:
        if inst["models"] == ["smol-chat"]:
            inst["models"] = ["tiny-chat"]
    return cfg


def start_daemon(
    tmp_path: pathlib.Path,
    overrides: dict | None = None,
    executor: str | None = None,
    base: dict | None = None,
    instance: dict | None = None,
) -> Daemon:
    """The embedded default config on the tiny models (or `base`), with `overrides` merged into its sections, every
    instance's executor replaced by `executor` when given and `instance` merged into every instance."""
    cfg = base or tiny_default()
    for inst in cfg["instances"] if executor else ():
        inst["executor"] = executor
    for inst in cfg["instances"]:
        inst.update(instance or {})
    sock_path = str(tmp_path / "admin.sock")
    cfg["listen"] = {"http": "127.0.0.1:0", "admin_socket": sock_path}
    for key, value in (overrides or {}).items():
        cfg.setdefault(key, {}).update(value)
    cfg["listen"]["admin_socket"] = sock_path = cfg["listen"].get("admin_socket", sock_path)
    config_path = tmp_path / "talaria.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "talariad.cli", "run", "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 90
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        m = re.search(r"listening on (http://\S+)/v1", line)
        if m:
            return Daemon(proc, m.group(1), sock_path, config_path, notify, lines)
    proc.kill()
    raise RuntimeError("talariad did not start:\n" + "".join(seen))


def stop_daemon(d: Daemon, timeout: float = 15) -> int:
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
    try:
        return d.proc.wait(timeout)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
        for child in d.children():
            child.kill()
