"""Where the admin socket lives when nobody says: one rule that talariad and talaria-ctl share.

1. `TALARIA_SOCKET` (talaria-ctl also takes `--socket`; talariad takes `listen.admin_socket`).
2. Under systemd, the unit's `RuntimeDirectory=talaria`: `/run/talaria/admin.sock`. talaria-ctl
   uses that socket whenever it exists, so on a box running the service no flag is needed.
3. A user run: `$XDG_RUNTIME_DIR/talaria/admin.sock`, or `~/.local/state/talaria/admin.sock`
   where XDG_RUNTIME_DIR is unset.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

SERVICE_SOCKET = "/run/talaria/admin.sock"


def _user_socket(env: Mapping[str, str]) -> str:
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "talaria", "admin.sock")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "talaria", "admin.sock")


def daemon_socket(configured: str | None, env: Mapping[str, str] = os.environ) -> str:
    """The absolute path talariad binds: the config's, else TALARIA_SOCKET, systemd's, the user's."""
    if configured:
        return os.path.abspath(configured)
    if env.get("TALARIA_SOCKET"):
        return os.path.abspath(env["TALARIA_SOCKET"])
    if env.get("RUNTIME_DIRECTORY"):  # systemd RuntimeDirectory=talaria
        return os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], "admin.sock")
    return _user_socket(env)


def client_socket(env: Mapping[str, str] = os.environ) -> str:
    """The path talaria-ctl and talaria-tui dial when not given --socket."""
    if env.get("TALARIA_SOCKET"):
        return os.path.abspath(env["TALARIA_SOCKET"])
    if pathlib.Path(SERVICE_SOCKET).is_socket():
        return SERVICE_SOCKET
    return _user_socket(env)
