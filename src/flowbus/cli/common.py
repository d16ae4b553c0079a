"""What every command group shares: the two consoles, the one way to fail, the one way to print a
result, the progress bar, the ``--json`` option and the flow spec argument.

As everywhere in the command line, ``--json`` prints exactly one JSON document on standard
output (progress, if any, goes to standard error), otherwise a table; a bad input prints a red
message on standard error and exits with status 2, without a traceback (:func:`fail`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["JsonOption", "ProgressFn", "SpecArgument", "emit", "err", "fail", "out", "progress_bar"]

out = Console()
err = Console(stderr=True)

ProgressFn = Callable[[str, int, int], None]

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
SpecArgument = Annotated[Path, typer.Argument(help="A flow spec (YAML), e.g. examples/stocks/flow.yaml.")]


def fail(message: str) -> NoReturn:
    """Print ``message`` in red on standard error and exit with status 2."""
    # The message's brackets are text; a long path stays one piece (the terminal wraps, not rich).
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def progress_bar(enabled: bool) -> Iterator[ProgressFn | None]:
    """A progress callback drawing on standard error, or None when disabled."""
    if not enabled or not err.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=err, transient=True,
    ) as bar:  # fmt: skip
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done)

        yield update


def emit(result: dict[str, Any], *, as_json: bool, title: str) -> None:
    """Print a result: one JSON document, or a two-column table."""
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    table = Table(title=title, show_header=False)
    for key, value in result.items():
        table.add_row(key, f"{value:,.4g}" if isinstance(value, float) else str(value))
    out.print(table)
