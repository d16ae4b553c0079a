"""``flowbus match``: bulk matching of an event table against a subscription table, on Spark.

:func:`match` is a command function, mounted as ``flowbus match`` by :mod:`flowbus.cli`
(the work is :func:`flowbus.spark.bulk.bulk_match`). Every input
is read and checked before a Spark job starts; a bad input (a missing path, an
unreadable file, a filter that does not parse -- with its row --, a missing
column) prints a red message on standard error and exits with status 2, without
a traceback, and nothing is written. ``--json`` prints exactly one JSON document.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from flowbus.cli.common import JsonOption, emit, fail
from flowbus.errors import FlowbusError

__all__ = ["match"]


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
    as_json: JsonOption = False,
) -> None:
    """Match an event table against a subscription table on Spark; write (event_id, sub_id) pairs."""
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
        fail(str(exc))
    where = remote if remote is not None else spark.sparkContext.master
    summary = {
        "command": "match",
        "master": where,
        "events": str(events),
        **result.to_dict(),
        "session_s": session_s,
    }
    emit(summary, as_json=as_json, title="flowbus match")
