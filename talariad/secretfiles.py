"""The secrets files a config names, read beside it: the API keys (`listen.api_keys_file`) and
the pool token (`pool.token_file`, and the picker's `token_file`). A problem is a ValueError of
one line that starts with the config field's name."""

from __future__ import annotations

import pathlib


def secret_lines(path: pathlib.Path, field: str) -> list[str]:
    """The lines of a secrets file (API keys, a pool token), stripped, blank lines and `#`
    comments skipped. Raises ValueError, one line naming the config `field`, when the file is
    unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or err
        raise ValueError(f"{field}: cannot read {path}: {why}") from None
    return [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]


def load_keys(path: pathlib.Path) -> frozenset[str]:
    """The keys in `path`, one per line (`secret_lines`). Raises ValueError with a one-line reason
    when the file is unreadable or holds no key."""
    keys = frozenset(secret_lines(path, "listen.api_keys_file"))
    if not keys:
        raise ValueError(f"listen.api_keys_file: {path} holds no key")
    return keys


def load_token(path: pathlib.Path, field: str = "pool.token_file") -> str:
    """The token on the first line of `path` (`secret_lines`); ValueError with one line (naming
    the config `field`) if none. The box and the pool's picker read it alike."""
    lines = secret_lines(path, field)
    if not lines:
        raise ValueError(f"{field}: {path} holds no token")
    return lines[0]
