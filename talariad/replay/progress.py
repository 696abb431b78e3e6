"""A rich progress bar for long replay runs (configurations x sessions); silent when disabled."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress_bar(
    total: int, description: str, *, console: Console | None = None, enabled: bool = True
) -> Iterator[Callable[..., None]]:
    """Yields `advance(n=1, description=None)`; the bar goes to stderr unless a console is given."""
    if not enabled:
        yield lambda n=1, description=None: None
        return
    console = console or Console(stderr=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1, description: str | None = None) -> None:
            bar.update(task, advance=n, description=description)  # None keeps the old text

        yield advance
