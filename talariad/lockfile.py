"""One daemon per admin socket: an exclusive flock on `SOCKET.lock`, held for the daemon's life.

The lock is taken before the socket is touched, so a second daemon never unlinks a live socket;
the kernel drops it when the holder exits however it exits, so a stale lock cannot block a restart.
"""

from __future__ import annotations

import fcntl
import os
import pathlib


class Busy(Exception):
    """Another process holds the lock; `pid` is the holder's, when it wrote one."""

    def __init__(self, path: str, pid: int | None):
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"another talariad ({who}) is running on admin socket {path}")
        self.pid = pid


def acquire(socket_path: str) -> int:
    """Lock `socket_path`.lock and write our pid into it; the open descriptor is the lock.
    Raises Busy when a live daemon holds it."""
    lock = pathlib.Path(f"{socket_path}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise Busy(socket_path, int(text) if text.isdigit() else None) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
