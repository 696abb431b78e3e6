"""Run a typer app so that a usage mistake is one line on stderr and exit status 2."""

from __future__ import annotations

import sys

import typer


def run_app(app: typer.Typer, prog: str) -> None:
    try:
        rc = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except Exception as err:
        # typer ships its own click; its usage errors all carry format_message() and exit_code
        if not hasattr(err, "format_message"):
            raise
        if type(err).__name__ != "NoArgsIsHelpError":  # a bare command has shown its help already
            print(f"{prog}: {err.format_message()}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 2) or 2)
    sys.exit(rc if isinstance(rc, int) else 0)
