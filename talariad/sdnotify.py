"""systemd notify protocol: a datagram to $NOTIFY_SOCKET; does nothing when the variable is unset."""

from __future__ import annotations

import os
import socket


def notify(*fields: str) -> bool:
    """Send `READY=1`, `STOPPING=1`, `WATCHDOG=1`, `STATUS=...` lines; False when not under systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto("\n".join(fields).encode(), addr)
        except OSError:
            return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the watchdog timeout systemd asked for, or None when the watchdog is off."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit():
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6
