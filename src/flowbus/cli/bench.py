"""``flowbus bench ...``: every benchmark of :mod:`flowbus.bench`, and the plots of their results.

``bench_app`` is a typer sub-app (mounted as ``flowbus bench`` by :mod:`flowbus.cli`). Each
command runs one benchmark module's ``run(...)`` and prints its result: with ``--json``
exactly one JSON document on standard output (progress goes to standard error), otherwise
a table. The benchmarks are part of the package, so they run from an installed wheel too;
``bench flow`` and ``bench spark`` also read the stock example of a checkout
(``examples/stocks/flow.yaml``) and say so when there is none.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from flowbus.cli.common import JsonOption, emit, fail, out, progress_bar
from flowbus.errors import FlowbusError, UserError

if TYPE_CHECKING:
    from flowbus.bench.workloads import WorkloadName
    from flowbus.matching import Strategy

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks; each prints one JSON document with --json.", no_args_is_help=True)
plot_app = typer.Typer(help="Plot a benchmark's result (the figures of docs/results).", no_args_is_help=True)


def _ints(text: str) -> list[int]:
    """``1,3`` or ``10,1_000`` as integers."""
    try:
        return [int(x.replace("_", "")) for x in text.split(",") if x]
    except ValueError:
        fail(f"a comma-separated list of integers is expected, got {text!r}")


@bench_app.command("match")
def bench_match(
    workload: Annotated[str, typer.Option(help="w1, w1-mixed or w-rein.")] = "w1",
    subscriptions: Annotated[int, typer.Option(min=1, help="Number of subscriptions.")] = 100_000,
    events: Annotated[int, typer.Option(min=1, help="Number of events matched.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 1,
    strategy: Annotated[str, typer.Option(help="counting or clustering.")] = "counting",
    input: Annotated[str, typer.Option(help="arrow (a pyarrow Table) or dicts.")] = "arrow",
    as_json: JsonOption = False,
) -> None:
    """Matching throughput on W1 / W1-mixed / W-REIN against brute force in the same run."""
    if workload not in ("w1", "w1-mixed", "w-rein"):
        fail(f"unknown workload {workload!r} (expected w1, w1-mixed or w-rein)")
    if strategy not in ("counting", "clustering"):
        fail(f"unknown strategy {strategy!r} (expected counting or clustering)")
    if input not in ("arrow", "dicts"):
        fail(f"unknown input {input!r} (expected arrow or dicts)")
    from flowbus.bench.match import run

    with progress_bar(True) as progress:
        result = run(
            workload=cast("WorkloadName", workload), subscriptions=subscriptions, events=events,
            seed=seed, strategy=cast("Strategy", strategy), input=input, progress=progress,
        )  # fmt: skip
    emit(result, as_json=as_json, title=f"match {workload} x {subscriptions:,} ({strategy})")


@bench_app.command("flow")
def bench_flow(
    trades: Annotated[int, typer.Option(min=1, help="Trades through each graph.")] = 200_000,
    seed: Annotated[int, typer.Option(help="Seed of the trade generator.")] = 1,
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs of each graph (the best counts).")] = 3,
    as_json: JsonOption = False,
) -> None:
    """The stock example, original against rewritten graph (local interpreter), and A* reconnects."""
    from flowbus.bench.flow import run

    try:
        with progress_bar(True) as progress:
            result = run(trades=trades, seed=seed, rounds=rounds, progress=progress)
    except FlowbusError as exc:
        fail(str(exc))
    emit(result, as_json=as_json, title=f"flow: stock example, {trades:,} trades")


@bench_app.command("spark")
def bench_spark(
    events: Annotated[
        int, typer.Option(min=1, help="Trades through the plans and flowbus run of the stock flow.")
    ] = 100_000,
    engine_events: Annotated[
        int | None,
        typer.Option(min=1, help="Events through flowbus run (stock flow, state paths); default --events."),
    ] = None,
    batch_events: Annotated[
        int | None,
        typer.Option(min=1, help="Events per micro-batch; default half the run, 5,000 to 1,000,000."),
    ] = None,
    match_events: Annotated[int, typer.Option(min=1, help="Events of bulk matching.")] = 100_000,
    subscriptions: Annotated[
        list[int] | None, typer.Option(help="W1 subscription counts of bulk matching (repeatable).")
    ] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs of each plan (the best counts).")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the generators.")] = 1,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    engine_only: Annotated[
        bool, typer.Option(help="Only flowbus run's engine against the local interpreter (--engine-events).")
    ] = False,
    warm_up: Annotated[
        int,
        typer.Option(min=0, help="Events through the flow before the timed run, while ingesting (0: none)."),
    ] = 2000,
    as_json: JsonOption = False,
) -> None:
    """Spark: the stock flow rewritten vs hop by hop, flowbus run, state paths, bulk matching vs a join."""
    from flowbus.bench import spark_flow, spark_match
    from flowbus.spark.session import STREAMING_CONF, spark_session

    try:
        spark = spark_session(
            master=master,
            app_name="flowbus-bench-spark",
            conf={"spark.driver.memory": "8g", "spark.sql.shuffle.partitions": "2", **STREAMING_CONF},
        )
        spark.sparkContext.setLogLevel("ERROR")
        with progress_bar(True) as progress:
            doc = {"master": master, "cores": spark.sparkContext.defaultParallelism}
            doc.update(
                spark_flow.run(
                    spark, events=events, engine_events=engine_events, batch_events=batch_events,
                    rounds=rounds, seed=seed, progress=progress, engine_only=engine_only, warm_up=warm_up,
                )
            )  # fmt: skip
            if engine_only:
                emit(doc if as_json else _flat(doc), as_json=as_json, title="bench spark")
                return
            doc["bulk_match"] = spark_match.run(
                events=match_events,
                subscriptions=subscriptions or [100_000, 1_000_000],
                seed=seed,
                master=master,
                progress=progress,
            )
    except FlowbusError as exc:
        fail(str(exc))
    emit(doc if as_json else _flat(doc), as_json=as_json, title="bench spark")


def _flat(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            flat.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                flat.update(
                    _flat(item, f"{prefix}{k}[{i}].")
                    if isinstance(item, dict)
                    else {f"{prefix}{k}[{i}]": item}
                )
        else:
            flat[f"{prefix}{k}"] = v
    return flat


@bench_app.command("spark-match")
def bench_spark_match(
    events: Annotated[int, typer.Option(min=1, help="W1 events matched.")] = 100_000,
    subscriptions: Annotated[
        list[int] | None, typer.Option(help="W1 subscription counts (repeatable; default 100000, 1000000).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 1,
    master: Annotated[str | None, typer.Option(help="Spark master (default: local[*]).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Bulk matching on Spark alone: flowbus's broadcast matcher against a broadcast hash join."""
    from flowbus.bench.spark_match import run

    try:
        with progress_bar(True) as progress:
            doc = run(
                events=events, subscriptions=subscriptions or [100_000, 1_000_000], seed=seed,
                master=master, progress=progress,
            )  # fmt: skip
    except FlowbusError as exc:
        fail(str(exc))
    emit(doc if as_json else _flat(doc), as_json=as_json, title="bench spark-match")


@bench_app.command("broker")
def bench_broker(
    brokers: Annotated[str, typer.Option(help="Broker counts, e.g. 1,3.")] = "1,3",
    subscriptions: Annotated[
        str, typer.Option(help="K values, e.g. 10,1000,10000,100000.")
    ] = "10,1000,10000,100000",
    events: Annotated[int, typer.Option(min=1, help="Events published per run.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 1,
    max_ring_subscriptions: Annotated[
        int, typer.Option(help="Rings of >1 broker run up to this K.")
    ] = 10_000,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Also write result.json, rows.csv and a PNG here.")
    ] = None,
    clients: Annotated[int, typer.Option(min=1, help="Subscriber connections.")] = 4,
    window: Annotated[
        int | None,
        typer.Option(min=1, help="The publisher's window (unacknowledged publishes; default 10000; native)."),
    ] = None,
    rate: Annotated[float, typer.Option(min=0, help="Pace the publisher (events/s; 0: flat out).")] = 0.0,
    broker_window: Annotated[int | None, typer.Option(help="The brokers' per-subscriber window.")] = None,
    broker_memory: Annotated[int | None, typer.Option(help="The brokers' per-subscription memory.")] = None,
    broker_heartbeat: Annotated[float | None, typer.Option(help="The brokers' ring heartbeat (s).")] = None,
    subscribe_timeout: Annotated[
        float, typer.Option(help="Seconds to subscribe; then the row fails.")
    ] = 900.0,
    profile_dir: Annotated[Path | None, typer.Option(help="Run the brokers under cProfile.")] = None,
    tls: Annotated[bool, typer.Option(help="Brokers and clients in TLS (mutual between brokers).")] = False,
    baseline: Annotated[
        str | None, typer.Option(help="Also run this broker on each K's workload: activemq.")
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            help="native (flowbus's client) or stomp (the stomp.py program of --baseline activemq, "
            "at each broker's STOMP door)."
        ),
    ] = "native",
    as_json: JsonOption = False,
) -> None:
    """Brokers on loopback (one, and a ring): events/s in, deliveries/s, latency, RSS, against ActiveMQ."""
    from flowbus.bench.broker import run, table

    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    try:
        with progress_bar(True) as progress:
            result = run(
                brokers=_ints(brokers), subscriptions=_ints(subscriptions), events=events, seed=seed,
                clients=clients, window=window, rate=rate, broker_window=broker_window,
                broker_memory=broker_memory, broker_heartbeat=broker_heartbeat,
                max_ring_subscriptions=max_ring_subscriptions, subscribe_timeout=subscribe_timeout,
                profile_dir=profile_dir, progress=progress, tls=tls, baseline=baseline, protocol=protocol,
            )  # fmt: skip
    except UserError as exc:  # an unknown --baseline or --protocol, or one that cannot run here
        fail(str(exc))
    if out_dir is not None:
        _write_broker(result, out_dir)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    else:
        out.print(table(result))


def _write_broker(result: dict[str, Any], directory: Path) -> None:
    """``result.json``, ``rows.csv`` and ``broker.png`` in ``directory``."""
    import csv

    from flowbus.bench.plot_broker import plot

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "result.json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    rows = result["rows"]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with (directory / "rows.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    plot(result, directory / "broker.png")


@bench_app.command("flow-bus")
def bench_flow_bus(
    brokers: Annotated[str, typer.Option(help="Broker counts, e.g. 1,3.")] = "1,3",
    events: Annotated[int, typer.Option(min=1, help="Source events of the stock flow per run.")] = 100_000,
    subs: Annotated[int, typer.Option(min=1, help="Filtered subscriptions per subscription space.")] = 100,
    rate: Annotated[float, typer.Option(min=1, help="The paced runs' source events/s.")] = 5_000.0,
    seed: Annotated[int, typer.Option(help="Seed of the subscription filters.")] = 1,
    clients: Annotated[int, typer.Option(min=1, help="Subscriber connections.")] = 4,
    repeats: Annotated[
        int, typer.Option(min=1, help="Flat-out pairs per broker count, alternating (the median counts).")
    ] = 3,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Also write result.json, rows.csv and a PNG here.")
    ] = None,
    profile_dir: Annotated[Path | None, typer.Option(help="Run the brokers under cProfile.")] = None,
    as_json: JsonOption = False,
) -> None:
    """The stock flow deployed on brokers against plain content routing of the same brokers."""
    from flowbus.bench.flow_bus import run, table, write

    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    try:
        with progress_bar(True) as progress:
            result = run(
                brokers=_ints(brokers), events=events, subscriptions=subs, rate=rate, seed=seed,
                clients=clients, profile_dir=profile_dir, progress=progress, repeats=repeats,
            )  # fmt: skip
    except FlowbusError as exc:
        fail(str(exc))
    if out_dir is not None:
        write(result, out_dir)
        (out_dir / "result.json").write_text(
            json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8"
        )
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    else:
        out.print(table(result))


@bench_app.command("flow-core")
def bench_flow_core(
    events: Annotated[int, typer.Option(min=1, help="Source events of the stock flow per repeat.")] = 20_000,
    subs: Annotated[int, typer.Option(min=1, help="Filtered subscriptions per subscription space.")] = 100,
    step: Annotated[int, typer.Option(min=1, help="Events published per step of the core.")] = 200,
    repeats: Annotated[int, typer.Option(min=1, help="Times the flow and plain cores alternate.")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the subscription filters.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """The flow's routing core alone against plain routing's, in one process (no sockets)."""
    from flowbus.bench.flow_core import run, table

    with progress_bar(True) as progress:
        result = run(
            events=events, subscriptions=subs, step=step, repeats=repeats, seed=seed, progress=progress
        )
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        out.print(table(result))


@bench_app.command("floor")
def bench_floor(
    rounds: Annotated[int, typer.Option(min=1, help="Batches of 2,000 deliveries timed per step.")] = 200,
    deliveries_per_s: Annotated[
        float, typer.Option(min=0, help="The goal's deliveries a second, for cores_at.")
    ] = 20_000 * 20.0,
    as_json: JsonOption = False,
) -> None:
    """What one delivery costs at the least: packing, unpacking, the hand-off to the subscriber's task."""
    from flowbus.bench.broker_floor import run

    emit(run(rounds=rounds, deliveries_per_s=deliveries_per_s), as_json=as_json, title="broker floor")


@bench_app.command("cbr")
def bench_cbr(
    sizes: Annotated[str, typer.Option(help="Subscription counts K, e.g. 1000,10000,100000.")] = (
        "1000,10000,100000"
    ),
    events: Annotated[int, typer.Option(min=1, help="Events routed.")] = 5_000,
    batch: Annotated[int, typer.Option(min=1, help="Events per route_batch call.")] = 1_000,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 1,
    cbr: Annotated[Path | None, typer.Option(help="Load the router from this file instead.")] = None,
    max_seconds: Annotated[
        float | None, typer.Option(help="Skip a size whose subscribing would take longer (estimated).")
    ] = None,
    local_only: Annotated[bool, typer.Option(help="Skip the remote (from a neighbour) phase.")] = False,
    as_json: JsonOption = False,
) -> None:
    """The covering-based content router alone: subscribing and routing at K subscriptions."""
    from flowbus.bench.cbr import run

    if cbr is not None and not cbr.is_file():
        fail(f"--cbr: {str(cbr)!r} is not a file")
    with progress_bar(True) as progress:
        doc = run(
            sizes=_ints(sizes), events=events, batch=batch, seed=seed,
            cbr=str(cbr) if cbr is not None else None, max_seconds=max_seconds,
            local_only=local_only, progress=progress,
        )  # fmt: skip
    emit(doc if as_json else _flat(doc), as_json=as_json, title="bench cbr")


@bench_app.command("cbr-adverts")
def bench_cbr_adverts(
    brokers: Annotated[int, typer.Option(min=2, help="Brokers of the random tree.")] = 31,
    publishers: Annotated[int, typer.Option(min=1, help="Publisher brokers (disjoint symbols).")] = 5,
    subscriptions: Annotated[int, typer.Option(min=1, help="Subscriptions at random brokers.")] = 3000,
    events: Annotated[int, typer.Option(min=1, help="Events published.")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the tree and the workload.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Advertisements in the content router: the tables and messages they save (exit 1 on a mismatch)."""
    from flowbus.bench.cbr_adverts import run

    if publishers > brokers:
        fail(f"--publishers {publishers} is more than --brokers {brokers}")
    doc = run(brokers=brokers, publishers=publishers, subscriptions=subscriptions, events=events, seed=seed)
    emit(doc if as_json else _flat(doc), as_json=as_json, title="bench cbr-adverts")
    if not (doc["delivery_equal"] and doc["late_state_equal"]):
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------- plots

ResultArgument = Annotated[Path, typer.Argument(help="The benchmark's --json output.")]
PngArgument = Annotated[Path, typer.Argument(help="The PNG to write.")]


def _read(path: Path, load: Callable[[Path], Any]) -> Any:
    """``load(path)``, its failures as a clean error naming the file."""
    try:
        return load(path)
    except OSError as exc:
        fail(f"cannot read {str(path)!r}: {exc.strerror}")
    except json.JSONDecodeError as exc:
        fail(f"{str(path)!r} is not JSON: {exc.msg} at line {exc.lineno}")


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@plot_app.command("match")
def plot_match(
    result: Annotated[Path, typer.Argument(help="bench match --json documents, one a line.")],
    png: PngArgument,
) -> None:
    """bench match results against the reference matchers' published figures."""
    from flowbus.bench.plot_match import load, plot

    plot(_read(result, load), png)


@plot_app.command("broker")
def plot_broker(result: ResultArgument, png: PngArgument) -> None:
    """bench broker: events/s in and p99 latency against K, with ActiveMQ's figures and the goal."""
    from flowbus.bench.plot_broker import plot

    plot(_read(result, _json), png)


@plot_app.command("spark")
def plot_spark(
    result: ResultArgument,
    png: PngArgument,
    csv: Annotated[Path, typer.Argument(help="The CSV of the figures to write.")],
    engine: Annotated[
        Path | None, typer.Option(help="A bench spark --engine-only --json document to plot beside.")
    ] = None,
) -> None:
    """bench spark: the plans, the state paths and bulk matching; its figures as CSV too."""
    from flowbus.bench.plot_spark import plot, write_csv

    doc = _read(result, _json)
    run = _read(engine, _json) if engine is not None else None
    plot(doc, png, run)
    write_csv(doc, csv, run)


bench_app.add_typer(plot_app, name="plot")
