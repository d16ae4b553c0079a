"""An IRBR sweep's runs as Spark tasks, and their aggregation with Spark DataFrame operations.

How it works: :func:`run_spark` takes the same :class:`~flowbus.experiments.irbr.IrbrSweep`
as the serial runner :func:`flowbus.experiments.irbr.run` and gives the same
:class:`~flowbus.experiments.output.Result` (timing aside; aggregates to float rounding),
so one writer writes both. :func:`run_dataframe` starts from
``spark.range(n, numPartitions=n)`` -- one partition, so one task, per group of runs (one
protocol and seed, every failure rate: :meth:`~flowbus.experiments.irbr.IrbrSweep.groups`)
-- and maps each group index through ``mapInArrow`` to
:func:`flowbus.experiments.irbr_run.run_group` (the group list travels with the function;
the runs of a group share one subscription phase). Each run gives one row: the run's
:data:`~flowbus.experiments.irbr.RUN_COLUMNS`, ``run_s``, and its per-event rows in an
array-of-struct column ``event_rows`` (explicit schema). Nothing here uses
``sparkContext``, so it works on classic and Spark Connect sessions alike (the executors
need flowbus: see :func:`flowbus.spark.session.spark_session`).

:func:`run_spark` caches that DataFrame, collects it (a few kB per run: the run rows, and
the event rows flattened on the driver), and aggregates the cached run rows in Spark
(:func:`aggregate_dataframe`: ``groupBy(protocol, failure)`` with mean, sample standard
deviation, count, sums and maxima; the 95 % t interval is a column expression over the
same t table as :func:`flowbus.experiments.stats.t975`). The rows, events and aggregates
then go through :func:`flowbus.experiments.irbr.assemble`, as the serial runner's do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from flowbus.experiments.irbr import (
    EVENT_COLUMNS,
    MAXES,
    MEANS,
    PEAKS,
    RATES,
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    SUMS,
    IrbrSweep,
    assemble,
)
from flowbus.experiments.irbr_run import IrbrRun, run_group
from flowbus.experiments.output import ProgressFn, Result
from flowbus.experiments.stats import T975_SEGMENTS, T975_TABLE

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["aggregate_dataframe", "result_ddl", "run_dataframe", "run_spark", "t975_column"]

_SPARK_TYPES = {"str": "string", "int": "long", "float": "double", "bool": "boolean"}
_EVENT_FIELDS = EVENT_COLUMNS[3:]  # the run's key (protocol, failure, seed) is in the run row


def result_ddl() -> str:
    """The DDL schema of a run's result row (``run_s`` and the ``event_rows`` array included)."""
    cols = [f"{name} {_SPARK_TYPES[kind]}" for name, kind in RUN_COLUMNS]
    cols.append("run_s double")
    struct = ", ".join(f"{name}: {_SPARK_TYPES[kind]}" for name, kind in _EVENT_FIELDS)
    cols.append(f"event_rows array<struct<{struct}>>")
    return ", ".join(cols)


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    event = pa.struct([(name, types[kind]) for name, kind in _EVENT_FIELDS])
    return pa.schema(
        [(name, types[kind]) for name, kind in RUN_COLUMNS]
        + [("run_s", pa.float64()), ("event_rows", pa.list_(event))]
    )


def _run_partition(
    batches: Iterator[pa.RecordBatch], groups: Sequence[Sequence[IrbrRun]]
) -> Iterator[pa.RecordBatch]:
    """The tasks' function: each group index in ``batches`` -> one result row per run."""
    import pyarrow as pa

    schema = _arrow_schema()
    for batch in batches:
        for index in batch.column("id").to_pylist():
            rows = []
            for result in run_group(groups[index]):
                row = dict(result.row)
                row["event_rows"] = [{name: e[name] for name, _ in _EVENT_FIELDS} for e in result.events]
                rows.append(row)
            yield pa.RecordBatch.from_pylist(rows, schema=schema)


def run_dataframe(spark: SparkSession, groups: Sequence[Sequence[IrbrRun]]) -> DataFrame:
    """One row per run; one Spark task per group of runs sharing their subscription phase
    (:func:`~flowbus.experiments.irbr_run.run_group`). Lazy: nothing runs until an action."""
    n = len(groups)
    ids = spark.range(0, n, 1, numPartitions=max(n, 1))
    return ids.mapInArrow(partial(_run_partition, groups=[list(g) for g in groups]), result_ddl())


def t975_column(df: Column) -> Column:
    """:func:`flowbus.experiments.stats.t975` as a Spark column expression of degrees of freedom ``df``."""
    from pyspark.sql import functions as F

    expr: Any = None
    for k, t in sorted(T975_TABLE.items()):
        cond = df == k
        expr = F.when(cond, F.lit(t)) if expr is None else expr.when(cond, F.lit(t))
    for a, ta, b, tb in T975_SEGMENTS:
        inv_b = 0.0 if b is None else 1.0 / b
        value = F.lit(ta) + F.lit(tb - ta) * (F.lit(1.0 / a) - F.lit(1.0) / df) / F.lit(1.0 / a - inv_b)
        cond = df > a if b is None else (df > a) & (df < b)
        expr = expr.when(cond, value)
    return expr  # type: ignore[no-any-return]


def aggregate_dataframe(runs: DataFrame) -> DataFrame:
    """The :data:`~flowbus.experiments.irbr.SUMMARY_COLUMNS` rows of ``runs``: per (protocol, failure)."""
    from pyspark.sql import functions as F

    aggs: list[Column] = [F.count(F.lit(1)).alias("runs")]
    for rate in RATES:
        aggs += [F.avg(rate).alias(f"{rate}_mean"), F.stddev_samp(rate).alias(f"{rate}_sd")]
    aggs += [F.avg(m).alias(f"{m}_mean") for m in MEANS]
    aggs += [F.max(p).alias(p) for p in PEAKS]
    aggs += [F.sum(c).alias(c) for c in SUMS]
    aggs += [F.max(c).alias(f"{c}_max") for c in MAXES]
    g = runs.groupBy("protocol", "failure").agg(*aggs)
    n = F.col("runs")
    t = t975_column(n - F.lit(1))
    for rate in RATES:
        mean, sd = F.col(f"{rate}_mean"), F.col(f"{rate}_sd")
        half = F.when(n >= 2, t * sd / F.sqrt(n.cast("double")))
        g = g.withColumn(f"{rate}_ci95", half)
        g = g.withColumn(f"{rate}_lo", mean - F.col(f"{rate}_ci95"))
        g = g.withColumn(f"{rate}_hi", mean + F.col(f"{rate}_ci95"))
    return g.select(*SUMMARY_COLUMNS)


@contextmanager
def _task_progress(
    spark: SparkSession, progress: ProgressFn | None, total: int, per_task: int
) -> Iterator[None]:
    """While the block runs, report the runs of finished tasks (a classic session's status
    tracker, polled twice a second; a Connect session has none: 0, then the total)."""
    from flowbus.spark.session import is_connect

    if progress is None or is_connect(spark):
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.5):
            done = 0
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                done = max(done, info.numCompletedTasks if info is not None else 0)
            progress("runs (spark)", min(done * per_task, total), total)

    thread = threading.Thread(target=poll, name="flowbus-sweep-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_spark(
    spark: SparkSession,
    sweep: IrbrSweep,
    *,
    master: str | None = None,
    progress: ProgressFn | None = None,
) -> Result:
    """Every run of ``sweep`` as a Spark task; rows and events collected, aggregates computed by Spark.

    ``master`` is what the result records as where it ran (default: the session's
    ``spark.master`` setting).
    """
    t0 = time.perf_counter()
    total = len(sweep.configs())
    if progress is not None:
        progress("runs (spark)", 0, total)
    groups = sweep.groups()
    results = run_dataframe(spark, groups).cache()
    try:
        runs: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        with _task_progress(spark, progress, total, total // len(groups)):
            collected = results.collect()  # one row per run: a few kB each, the event rows included
        for r in collected:
            row = r.asDict(recursive=True)
            key = {"protocol": row["protocol"], "failure": row["failure"], "seed": row["seed"]}
            events.extend({**key, **e} for e in row.pop("event_rows"))
            runs.append(row)
        if progress is not None:
            progress("runs (spark)", total, total)
        summary = [r.asDict() for r in aggregate_dataframe(results.drop("event_rows")).collect()]
        summary.sort(key=lambda r: (r["protocol"], r["failure"]))
    finally:
        results.unpersist()
    if master is None:
        try:
            master = spark.conf.get("spark.master")
        except Exception:  # a Connect server may not expose it
            master = None
    runner = {"name": "spark", "master": master, "tasks": len(groups)}
    return assemble(sweep, runs, events, runner=runner, started=t0, summary=summary)
