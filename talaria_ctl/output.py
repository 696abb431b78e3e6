"""What every talaria-ctl command shares: its options, the admin call, and how it prints."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from talariad.admin.client import Refused, Unreachable, as_dict

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document")]
InstanceArg = Annotated[str, typer.Argument(help="Instance name")]
ModelArg = Annotated[str, typer.Argument(help="Model name")]
OnOpt = Annotated[str, typer.Option("--on", help="Instance name")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Even when it leaves a model with no instance to take its calls (503)"
    ),
]


def fetch(fn: Callable):
    try:
        return as_dict(fn())
    except Unreachable as e:
        print(f"talaria-ctl: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    except Refused as e:
        print(f"talaria-ctl: {e}", file=sys.stderr)
        raise typer.Exit(3) from None


def cell(v) -> Text:
    # Text, not str: session ids and reasons are client data, never Rich markup
    return Text(f"{v:.3f}" if isinstance(v, float) else str(v))


def table(title: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    t = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left")
    for col in columns:
        t.add_column(col, no_wrap=True)
    for row in rows:
        t.add_row(*(cell(v) for v in row))
    # A pipe gets the full table rather than Rich's 80-column default.
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def mib(n) -> str:
    return f"{int(n) / 2**20:.1f}"
