"""The ``flowbus`` command.

Every benchmark takes ``--json`` and then prints exactly one JSON document on
standard output (progress, if any, goes to standard error); without it a table.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flowbus import __version__
from flowbus.errors import FlowbusError

if TYPE_CHECKING:
    from flowbus.matching import Strategy
    from flowbus.workloads import WorkloadName

app = typer.Typer(
    name="flowbus",
    help="Content-based event distribution middleware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks; each prints one JSON document with --json.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

out = Console()
err = Console(stderr=True)

ProgressFn = Callable[[str, int, int], None]


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


def _benchmarks() -> Any:
    """Import the repository's ``benchmarks`` package (it lives beside ``src/``)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "benchmarks" / "__init__.py").is_file():
        raise FlowbusError(f"benchmarks/ not found next to {root / 'src'}: run from a checkout of flowbus")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import benchmarks

    return benchmarks


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


@app.command()
def version() -> None:
    """Print the flowbus version."""
    out.print(__version__)


@app.command()
def demo(
    subscriptions: Annotated[int, typer.Option(help="Random subscriptions besides the named ones.")] = 20_000,
    trades: Annotated[int, typer.Option(help="Trades to generate (both exchanges).")] = 200_000,
    seed: Annotated[int, typer.Option(help="Seed of the generator.")] = 7,
) -> None:
    """Match a stream of stock trades (the 000 document's example) against many subscriptions."""
    from flowbus.cli.demo import run_demo

    try:
        run_demo(subscriptions=subscriptions, trades=trades, seed=seed, console=out)
    except FlowbusError as exc:
        fail(str(exc))


@bench_app.command("match")
def bench_match(
    workload: Annotated[str, typer.Option(help="w1, w1-mixed or w-rein.")] = "w1",
    subscriptions: Annotated[int, typer.Option(min=1, help="Number of subscriptions.")] = 100_000,
    events: Annotated[int, typer.Option(min=1, help="Number of events matched.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 1,
    strategy: Annotated[str, typer.Option(help="counting or clustering.")] = "counting",
    input: Annotated[str, typer.Option(help="arrow (a pyarrow Table) or dicts.")] = "arrow",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Matching throughput on W1 / W1-mixed / W-REIN against brute force in the same run."""
    if workload not in ("w1", "w1-mixed", "w-rein"):
        fail(f"unknown workload {workload!r} (expected w1, w1-mixed or w-rein)")
    if strategy not in ("counting", "clustering"):
        fail(f"unknown strategy {strategy!r} (expected counting or clustering)")
    if input not in ("arrow", "dicts"):
        fail(f"unknown input {input!r} (expected arrow or dicts)")
    bench = _benchmarks()
    from benchmarks.match import run  # type: ignore[import-not-found]

    del bench
    with progress_bar(True) as progress:
        result = run(
            workload=cast("WorkloadName", workload), subscriptions=subscriptions, events=events,
            seed=seed, strategy=cast("Strategy", strategy), input=input, progress=progress,
        )  # fmt: skip
    emit(result, as_json=as_json, title=f"match {workload} x {subscriptions:,} ({strategy})")


def _mount() -> None:
    from flowbus.cli.broker import bench_broker, broker_app, cluster_app, pub, sub
    from flowbus.cli.flow import bench_flow, flow_app, run
    from flowbus.cli.sim import sim_app
    from flowbus.cli.spark import bench_spark, match

    app.add_typer(flow_app, name="flow")
    app.add_typer(sim_app, name="sim")
    app.add_typer(broker_app, name="broker")
    app.add_typer(cluster_app, name="cluster")
    app.command("pub")(pub)
    app.command("sub")(sub)
    app.command("run")(run)
    app.command("match")(match)
    bench_app.command("flow")(bench_flow)
    bench_app.command("spark")(bench_spark)
    bench_app.command("broker")(bench_broker)


_mount()


def main() -> None:
    app()
