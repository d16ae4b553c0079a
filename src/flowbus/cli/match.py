"""The Spark commands: ``flowbus match`` (bulk matching of an event table against a subscription table).

:func:`match` is a command function, mounted as ``flowbus match``. Every input
is read and checked before a Spark job starts; a bad input (a missing path, an
unreadable file, a filter that does not parse -- with its row --, a missing
column) prints a red message on standard error and exits with status 2, without
a traceback, and nothing is written. ``--json`` prints exactly one JSON document.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from flowbus.errors import FlowbusError

__all__ = ["match"]


def _cli() -> Any:
    """The main command line module, for its helpers (imported late: it imports this module)."""
    from flowbus import cli

    return cli


def match(
    events: Annotated[Path, typer.Option(help="Events: Parquet or JSON lines (a file or a directory).")],
    subscriptions: Annotated[
        Path, typer.Option(help="Subscriptions: Parquet, JSON lines or CSV with columns sub_id and filter.")
    ],
    out: Annotated[
        Path, typer.Option(help="Where to write the (event_id, sub_id) pairs (Parquet, a new path).")
    ],
    master: Annotated[str | None, typer.Option(help="Spark master URL (default: local[*]).")] = None,
    remote: Annotated[str | None, typer.Option(help="Spark Connect server, sc://HOST:PORT.")] = None,
    id_column: Annotated[
        str | None, typer.Option(help="Event column to use as event_id (default: event_id, else generated).")
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Match an event table against a subscription table on Spark; write (event_id, sub_id) pairs."""
    cli = _cli()
    try:
        from flowbus.spark.bulk import bulk_match, check_out, event_format, read_subscriptions
        from flowbus.spark.session import spark_session

        # a cluster or a Connect server reads and writes these paths: never relative to its directory
        events, subscriptions, out = events.resolve(), subscriptions.resolve(), out.resolve()
        check_out(out)
        event_format(events)
        subs = read_subscriptions(subscriptions)  # every row checked before Spark starts (5-7 s)
        t = time.perf_counter()
        spark = spark_session(master=master, remote=remote, app_name="flowbus-match")
        session_s = time.perf_counter() - t
        result = bulk_match(spark, events, subs, out, id_column=id_column)
    except FlowbusError as exc:
        cli.fail(str(exc))
        return
    where = remote if remote is not None else spark.sparkContext.master
    summary = {
        "command": "match",
        "master": where,
        "events": str(events),
        **result.to_dict(),
        "session_s": session_s,
    }
    cli.emit(summary, as_json=json, title="flowbus match")


def bench_spark(
    events: Annotated[
        int, typer.Option(min=1, help="Trades through the two plans of the stock flow.")
    ] = 100_000,
    engine_events: Annotated[
        int, typer.Option(min=1, help="Events through flowbus run (stock flow, state paths).")
    ] = 20_000,
    batch_events: Annotated[int, typer.Option(min=1, help="Events per micro-batch.")] = 5_000,
    match_events: Annotated[int, typer.Option(min=1, help="Events of bulk matching.")] = 100_000,
    subscriptions: Annotated[
        list[int] | None, typer.Option(help="W1 subscription counts of bulk matching (repeatable).")
    ] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs of each plan (the best counts).")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the generators.")] = 1,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Spark: the stock flow rewritten vs hop by hop, flowbus run, state paths, bulk matching vs a join."""
    cli = _cli()
    try:
        cli._benchmarks()
        from benchmarks import spark_flow, spark_match  # type: ignore[import-not-found]

        from flowbus.spark.session import spark_session

        spark = spark_session(
            master=master,
            app_name="flowbus-bench-spark",
            conf={"spark.driver.memory": "8g", "spark.sql.shuffle.partitions": "2"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        with cli.progress_bar(True) as progress:
            doc = {"master": master, "cores": spark.sparkContext.defaultParallelism}
            doc.update(
                spark_flow.run(
                    spark, events=events, engine_events=engine_events, batch_events=batch_events,
                    rounds=rounds, seed=seed, progress=progress,
                )
            )  # fmt: skip
            doc["bulk_match"] = spark_match.run(
                events=match_events,
                subscriptions=subscriptions or [100_000, 1_000_000],
                seed=seed,
                master=master,
                progress=progress,
            )
    except FlowbusError as exc:
        cli.fail(str(exc))
        return
    cli.emit(doc if json else _flat(doc), as_json=json, title="bench spark")


def _flat(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                out.update(
                    _flat(item, f"{prefix}{k}[{i}].")
                    if isinstance(item, dict)
                    else {f"{prefix}{k}[{i}]": item}
                )
        else:
            out[f"{prefix}{k}"] = v
    return out
