"""Bulk matching on Spark: flowbus (a broadcast matcher in ``mapInArrow``) against a broadcast hash join.

W1 events and subscriptions are written to a temporary directory as Parquet
(filters in the text form, through ``Filter.to_text()``), then for each
subscription count, in one Spark session:

* ``flowbus`` -- :func:`flowbus.spark.bulk.bulk_match`: read and parse the
  subscriptions (``read_s``), build the matcher (``build_s``), broadcast it and
  run the ``mapInArrow`` job writing the pairs as Parquet (``match_s``);
* ``join`` -- :func:`flowbus.spark.bulk.join_baseline`: the same parsed
  subscriptions as a table (``prep_s``), then a broadcast hash join on one
  equality with the rest as join condition, writing its pairs (``join_s``).

``ratio_spark_job`` is ``join_s / match_s`` (the Spark jobs, from parsed
subscriptions); ``ratio_end_to_end`` also counts reading, parsing and
building. Both pair sets are compared in full (they are small: about
``events * subscriptions / 10**6`` pairs). Before timing, both jobs run once on
a few events so Python workers, numba kernels and the JVM's code are warm.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flowbus.bench.workloads import Workload

Progress = Callable[[str, int, int], None]


def _write_inputs(tmp: Path, events: int, subscriptions: int, seed: int, progress: Progress | None) -> None:
    wl = Workload("w1", seed)
    table = wl.events(events)
    table = table.append_column("event_id", pa.array(range(events), pa.int64()))
    pq.write_table(table, tmp / "events.parquet")
    pq.write_table(table.slice(0, 200), tmp / "warm_events.parquet")
    with pq.ParquetWriter(
        tmp / "subs.parquet", pa.schema([("sub_id", pa.int64()), ("filter", pa.string())])
    ) as w:
        done = 0
        for chunk in wl.filters(subscriptions, chunk=50_000):
            w.write_table(
                pa.table({"sub_id": [i for i, _ in chunk], "filter": [f.to_text() for _, f in chunk]})
            )
            done += len(chunk)
            if progress:
                progress(f"writing {subscriptions:,} subscriptions", done, subscriptions)


def _pairs(path: Path) -> set[tuple[int, int]]:
    t = pq.read_table(path)
    return set(zip(t.column("event_id").to_pylist(), t.column("sub_id").to_pylist(), strict=True))


def _one(spark: Any, tmp: Path, subscriptions: int, progress: Progress | None) -> dict[str, Any]:
    from flowbus.spark.bulk import bulk_match, join_baseline, read_events, read_subscriptions

    label = f"{subscriptions:,} subscriptions"
    step = 0

    def tick(what: str) -> None:
        nonlocal step
        step += 1
        if progress:
            progress(f"{label}: {what}", step, 4)

    tick("flowbus")
    gc.collect()
    mine = bulk_match(spark, tmp / "events.parquet", tmp / "subs.parquet", tmp / f"flowbus_{subscriptions}")
    tick("join baseline (parse)")
    t = time.perf_counter()
    subs = read_subscriptions(tmp / "subs.parquet")
    events = read_events(spark, tmp / "events.parquet")
    prep_s = time.perf_counter() - t
    tick("join baseline (broadcast hash join)")
    t = time.perf_counter()
    join_baseline(spark, events, subs).write.parquet(str(tmp / f"join_{subscriptions}"))
    join_s = time.perf_counter() - t
    tick("comparing")
    same = _pairs(tmp / f"flowbus_{subscriptions}") == _pairs(tmp / f"join_{subscriptions}")
    flowbus_total = mine.read_s + mine.build_s + mine.match_s
    return {
        "subscriptions": subscriptions,
        "pairs": mine.pairs,
        "flowbus_read_parse_s": mine.read_s,
        "flowbus_build_s": mine.build_s,
        "flowbus_match_s": mine.match_s,
        "flowbus_total_s": flowbus_total,
        "join_read_parse_s": prep_s,
        "join_s": join_s,
        "join_total_s": prep_s + join_s,
        "ratio_spark_job": join_s / mine.match_s,
        "ratio_end_to_end": (prep_s + join_s) / flowbus_total,
        "same_pairs": same,
    }


def _warm_up(spark: Any, tmp: Path) -> None:
    from flowbus.spark.bulk import bulk_match, join_baseline, read_events, read_subscriptions

    bulk_match(spark, tmp / "warm_events.parquet", tmp / "subs.parquet", tmp / "warm_flowbus")
    subs = read_subscriptions(tmp / "subs.parquet")
    join_baseline(spark, read_events(spark, tmp / "warm_events.parquet"), subs).count()


def run(
    *,
    events: int = 100_000,
    subscriptions: Sequence[int] = (100_000, 1_000_000),
    seed: int = 1,
    master: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    from flowbus.spark.session import spark_session

    spark = spark_session(
        master=master,
        app_name="flowbus-bench-spark-match",
        conf={"spark.driver.memory": "8g", "spark.sql.shuffle.partitions": "8"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    cores = spark.sparkContext.defaultParallelism
    results: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="flowbus-bench-spark-"))
    try:
        for n in subscriptions:
            case = tmp / str(n)
            case.mkdir()
            _write_inputs(case, events, n, seed, progress)
            if not results:
                _warm_up(spark, case)
            results.append(_one(spark, case, n, progress))
            shutil.rmtree(case, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "spark_match",
        "workload": "w1",
        "events": events,
        "seed": seed,
        "master": master or "local[*]",
        "cores": cores,
        "runs": results,
    }
