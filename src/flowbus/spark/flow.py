"""An information flow graph as Structured Streaming queries: the Spark engine of ``flowbus run``.

How it works: the graph is rewritten (one ``[S; T]`` route per publication ->
subscription path) and planned into event logs and stateful groups
(:mod:`flowbus.flow.plan`); published events are written to the input log
(:mod:`flowbus.flow.eventlog`). Then, in one Spark session:

* per event log, a *delivery query* streams the log (one file per micro-batch
  for the input log) and, in ``foreachBatch``, reads the micro-batch's files
  as a Parquet scan (:func:`~flowbus.spark.groups.batch_frame`: each action
  then decodes only the columns it needs), records the log's subscription
  points and applies the routes from its points: selects and transforms
  compiled to Columns (:mod:`flowbus.spark.columns`), lookup tables as literal
  maps, a route's rows kept only where its select holds and its outputs and
  requirements are defined. A point with many routes (``matcher_min`` or more)
  is matched by a :class:`~flowbus.matching.Matcher` of the routes' selects,
  broadcast and applied in ``mapInArrow`` -- never one giant OR -- and
  :meth:`SparkFlow.replace_routes` swaps its routes while the query runs (the
  next micro-batch uses a new broadcast).
* per stateful group, the delivery query of the group's input log, in the same
  ``foreachBatch`` (from a second thread, so the delivery's writes and the fold
  keep both cores busy: one query and one read of the log per micro-batch
  level), applies the routes into the collapsed space and hands the rows, with
  their key columns, to the group's runner
  (:mod:`flowbus.spark.groups`): by default each key's events are folded in
  ``_order`` on the Python workers over Arrow (the rows and the state
  repartitioned by key, ``mapInArrow``; plain aggregates with numpy,
  :mod:`flowbus.spark.vectorfold`), the workers writing the derived events,
  the state of each collapse and the row each expand arc last delivered kept
  per key in a state table versioned per micro-batch; every change sends the
  expand arc's subscriber the shortest equivalent sequence (the cause itself,
  or A*), as the reference interpreter does. With ``collapse="aggregate"``
  Spark's own aggregation folds plain aggregates, in a *state query* of its own. The derived events go to the
  group's log, published per micro-batch at once (a replay writes the same rows), which
  the next level's queries stream.
* a target fed from several points reads the micro-batch once: one filter and
  one projection (``CASE _point``) where a union would scan it per point.
* sinks: per subscription point and micro-batch, Parquet or JSON lines written
  to ``OUT/<point>/<log>-<batch>`` with ``mode("overwrite")``, the points of a
  micro-batch side by side (from threads: their jobs share the cores) -- a replayed
  micro-batch rewrites its own directory, so with the checkpoints output is
  exactly once -- or the console, or a Python callback. A run resumes from its
  checkpoints when started again on the same ``OUT``; :mod:`flowbus.spark.readers`
  reads the files back.

Every output row carries ``_order``; sorted by it, a point's events come in the
reference interpreter's order (see :mod:`flowbus.flow.plan`). It is bytes, 8
big-endian bytes per number of the plan's order list
(:func:`~flowbus.flow.eventlog.order_key`: a prefix sorts first, as lists do),
and hex text in JSON lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial, reduce
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import (
    LongType,
    StructField,
    StructType,
)

from flowbus.errors import FlowError
from flowbus.filters.ast import Field
from flowbus.flow.aggregates import Aggregates, as_aggregates
from flowbus.flow.eventlog import InputLog, order_key, read_source_dir
from flowbus.flow.graph import Collapse, Graph, Route
from flowbus.flow.plan import INPUT, FlowPlan, Log, StatefulGroup, plan
from flowbus.flow.rewrite import rewrite
from flowbus.flow.validate import bind_rules
from flowbus.matching import Matcher
from flowbus.spark.bulk import Shipped, executor_matcher, ship
from flowbus.spark.bus import register, spark_type
from flowbus.spark.columns import ColumnCompiler
from flowbus.spark.groups import (
    AggregateBatches,
    FoldBatches,
    batch_frame,
    expands_need_no_backlog,
    log_schema,
)
from flowbus.spark.pipeline import BUS_LEVEL, BusEnd, BusIngest, publish_rows, run_id
from flowbus.spark.readers import read_matched, read_outputs
from flowbus.spark.routes import Branch, route_columns, scan_branches
from flowbus.spark.state import GroupFolder

__all__ = [
    "BatchReport",
    "GroupFolder",
    "SinkFormat",
    "SparkFlow",
    "read_matched",
    "read_outputs",
    "spark_type",
]

SinkFormat = Literal["parquet", "jsonl", "console"]
CollapseMode = Literal["state", "aggregate"]
Callback = Callable[[str, int, DataFrame], None]

_TRANSIENT = ("failed to connect back", "CANNOT_OPEN_SOCKET")
_MAX_RESTARTS = 3
STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _extend(order: Column, position: int) -> Column:
    return F.concat(order, F.lit(order_key(position)))


def long_bytes(number: Column) -> Column:
    """A column of numbers >= 0 as ``_order`` bytes (:func:`~flowbus.flow.eventlog.order_key`)."""
    return F.unhex(F.lpad(F.hex(number.cast("long")), 16, "0"))


# ------------------------------------------------------------- matched routes


@dataclass
class _MatchedPoint:
    """The routes of one point served through a broadcast matcher (their selects as subscriptions)."""

    routes: list[tuple[int, Route]]
    version: int = 0
    shipped: Any = None


def _match_routes(
    batches: Iterator[pa.RecordBatch], ref: Shipped, fields: list[str]
) -> Iterator[pa.RecordBatch]:
    """Each event once per route whose select it passes, with the route's index in ``_route``."""
    matcher = executor_matcher(ref)
    for batch in batches:
        results = matcher.match_batch(batch.select(fields))
        if not results:
            continue
        counts = np.fromiter((r.size for r in results), np.int64, len(results))
        if not counts.any():
            continue
        take = np.repeat(np.arange(len(results)), counts)
        routes = np.concatenate(results).astype(np.int64)
        out = batch.take(pa.array(take))
        yield out.append_column("_route", pa.array(routes))


# ------------------------------------------------------------------ reporting


@dataclass
class BatchReport:
    """One micro-batch of one query: rows in, rows out per subscription point."""

    query: str
    batch: int
    rows_in: int
    out: dict[str, int]
    seconds: float


@dataclass
class _Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: int = 0
    events_in: int = 0
    out: dict[str, int] = field(default_factory=dict)
    reports: list[BatchReport] = field(default_factory=list)

    def add(self, report: BatchReport, *, counts_input: bool) -> None:
        with self.lock:
            self.batches += 1
            if counts_input:
                self.events_in += report.rows_in
            for point, n in report.out.items():
                self.out[point] = self.out.get(point, 0) + n
            self.reports.append(report)


# ------------------------------------------------------------------- the run


class SparkFlow:
    """Graph ``graph`` (original or rewritten) run on ``spark``, outputs and state under ``out``.

    Build, :meth:`ingest` (or :meth:`ingest_generator`), :meth:`start`, then
    :meth:`process_available` (blocks until every query has processed all its
    input) or let it run; :meth:`stop` always (it is a context manager too).
    """

    def __init__(
        self,
        spark: SparkSession,
        graph: Graph,
        out: Path,
        *,
        sink: SinkFormat = "parquet",
        callback: Callback | None = None,
        batch_events: int = 2000,
        files_per_batch: int = 1,
        matcher_min: int = 64,
        collapse: CollapseMode = "state",
        on_batch: Callable[[BatchReport], None] | None = None,
        bus_sources: Mapping[str, BusEnd] | None = None,
        bus_sinks: Mapping[str, BusEnd] | None = None,
    ) -> None:
        if sink not in ("parquet", "jsonl", "console"):
            raise FlowError(f"unknown sink {sink!r} (parquet, jsonl or console)")
        if collapse not in ("state", "aggregate"):
            raise FlowError(f"unknown collapse mode {collapse!r} (state or aggregate)")
        from flowbus.spark.session import is_connect

        self.spark: SparkSession | None = spark
        self._remote = is_connect(spark)
        self._on_server = False
        self.source_graph = graph
        self.graph = rewrite(graph)
        self.aggregates: dict[str, Aggregates] = {}
        if collapse == "aggregate":
            for arc in self.graph.arcs:
                if isinstance(arc, Collapse):
                    found = as_aggregates(bind_rules(self.graph, arc))
                    if found is not None and expands_need_no_backlog(self.graph, arc, found):
                        self.aggregates[arc.name] = found
        self.collapse: CollapseMode = collapse
        self.plan: FlowPlan = plan(self.graph, aggregate=lambda arc: arc.name in self.aggregates)
        self.out = Path(out).resolve()  # a cluster or Connect server reads and writes these paths too
        self.work = self.out / "_flowbus"
        self.sink = sink
        self.callback = callback
        self.batch_events = batch_events
        self.files_per_batch = files_per_batch
        self.matcher_min = matcher_min
        self.on_batch = on_batch
        self.bus_sources = dict(bus_sources or {})  # publication point -> the bus (flowbus.spark.pipeline)
        self.bus_sinks = dict(bus_sinks or {})  # subscription point -> the bus
        self.run_id = run_id(self.work) if self.bus_sources or self.bus_sinks else ""
        self.functions = self.graph.all_functions
        self.stats = _Stats()
        self.queries: dict[str, StreamingQuery] = {}
        self._query_logs: dict[str, str] = {}
        self._starters: dict[str, Callable[[], StreamingQuery]] = {}
        self._restarts: dict[str, int] = {}
        self._matched: dict[str, _MatchedPoint] = {}
        self._lock = threading.Lock()
        self._compiled: dict[str, list[tuple[str, list[tuple[int, Route, Column, list[Column]]]]]] = {}
        for log in self.plan.logs:
            self._compiled[log.name] = self._compile_deliveries(log)
        self._groups: dict[str, FoldBatches | AggregateBatches] = {
            g.name: AggregateBatches(self.graph, g, self.plan.log(g.log_out), self.work, self.aggregates)
            if g.aggregate
            else FoldBatches(self.graph, g, self.plan.log(g.log_out), self.work)
            for g in self.plan.groups
        }

    # --------------------------------------------- pickling (Spark Connect)

    _LOCAL_ONLY = ("spark", "queries", "_starters", "_restarts", "_lock", "stats", "on_batch")

    def __getstate__(self) -> dict[str, Any]:
        """What a Spark Connect server needs to run the ``foreachBatch`` functions (no session, no queries).

        On Connect, ``foreachBatch`` functions run in a Python process of the
        server: the flow travels there pickled, and reports its micro-batches
        as files under ``OUT/_flowbus/reports`` that this side reads.
        """
        state = {k: v for k, v in self.__dict__.items() if k not in self._LOCAL_ONLY}
        state["_matched"] = {p: _MatchedPoint(m.routes, m.version) for p, m in self._matched.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.spark = None
        self.queries = {}
        self._starters = {}
        self._restarts = {}
        self._lock = threading.Lock()
        self.stats = _Stats()
        self.on_batch = None
        self._on_server = True

    def _spark(self) -> SparkSession:
        if self.spark is None:
            raise FlowError("this flow has no Spark session here")
        return self.spark

    def _session(self, df: DataFrame) -> SparkSession:
        if self.spark is None:
            self.spark = df.sparkSession
        return self.spark

    def _collect_reports(self) -> None:
        """Connect: read the reports the server side wrote since the last look."""
        if not self._remote:
            return
        d = self.work / "reports"
        if not d.is_dir():
            return
        for f in sorted(d.glob("*.json")):
            data = json.loads(f.read_text())
            f.unlink()
            self._on_report(BatchReport(**data))

    # ------------------------------------------------------------ input

    def _log_dir(self, name: str) -> Path:
        return self.work / "logs" / name

    def input_log(self) -> InputLog:
        return InputLog(
            self.graph, self.plan.log(INPUT), self._log_dir(INPUT), batch_events=self.batch_events
        )

    def ingest_generator(self, events: Iterable[tuple[str, Mapping[str, Any]]], *, fingerprint: str) -> int:
        """Write ``events`` to the input log, unless this ``out`` already holds them (then resume).

        ``fingerprint`` names the input (spec, generator, count, seed): a
        directory holding another input is refused rather than mixed.
        """
        marker = self.work / "ingested.json"
        if marker.exists():
            done = json.loads(marker.read_text())
            if done.get("fingerprint") != fingerprint:
                raise FlowError(
                    f"{str(self.out)!r} holds the outputs of another input ({done.get('fingerprint')}); "
                    "choose another --out or delete it"
                )
            return int(done["events"])
        if self.work.exists():  # an ingest that did not finish: no query has read it
            shutil.rmtree(self.work)
        n = self.input_log().publish_all(events)
        marker.write_text(json.dumps({"fingerprint": fingerprint, "events": n}))
        return n

    def ingest_dirs(self, dirs: Mapping[str, Path]) -> int:
        """Write the events of the files not yet read in ``dirs`` (point -> directory); events so far.

        Files are read in name order, directory by directory; the names read
        are kept under ``OUT/_flowbus``, so a resumed or following run reads
        each file once.
        """
        record = self.work / "ingested-files.json"
        state: dict[str, Any] = {"seq": 0, "files": {}}
        if record.exists():
            state = json.loads(record.read_text())
        log = self.input_log()
        log.seq = int(state["seq"])
        for point, directory in dirs.items():
            done = set(state["files"].get(point, []))
            for _name, ev in read_source_dir(Path(directory), done):
                log.publish(point, ev)
            state["files"][point] = sorted(done)
        log.flush()
        state["seq"] = log.seq
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(record)
        return log.seq

    def warm_up(self, sample: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """Run this flow once over ``sample`` in a scratch directory, its outputs thrown away.

        What a session pays once -- the Python workers starting and importing
        flowbus, pyarrow and numba, the rule kernels loading, the JVM compiling
        the queries' code -- is paid here, so the run proper does not: called
        while the input is ingested (another thread), it overlaps the ingest.
        """
        scratch = Path(tempfile.mkdtemp(prefix="flowbus-warm-up-"))
        try:
            rehearsal = SparkFlow(
                self._spark(), self.source_graph, scratch, batch_events=max(1, len(sample)),
                matcher_min=self.matcher_min, collapse=self.collapse,
            )  # fmt: skip
            rehearsal.ingest_generator(sample, fingerprint="warm-up")
            with rehearsal:
                rehearsal.start()
                rehearsal.process_available()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # -------------------------------------------------------- compiling

    def _compiler(self, point: str, struct: str = "") -> ColumnCompiler:
        return ColumnCompiler(self.functions, dict(self.graph.event_space(point).schema.fields), struct)

    def _route_columns(
        self, point: str, route: Route, position: int, struct: str = ""
    ) -> tuple[Column, list[Column]]:
        """The route's condition and output columns over the point's fields (as columns, or as the
        fields of the log's ``struct`` column)."""
        cond, outputs = route_columns(route, self._compiler(point, struct))
        schema = self.graph.event_space(route.target).schema
        cast = [
            c.cast(spark_type(schema.fields[name])).alias(name)
            for c, (name, _) in zip(outputs, route.outputs, strict=True)
        ]
        return cond, [_extend(F.col("_order"), position).alias("_order"), *cast]

    def _compile_deliveries(
        self, log: Log
    ) -> list[tuple[str, list[tuple[int, Route, Column, list[Column]]]]]:
        compiled: list[tuple[str, list[tuple[int, Route, Column, list[Column]]]]] = []
        for point, routes in self.plan.deliveries(log):
            if len(routes) >= self.matcher_min:
                self._matched[point] = _MatchedPoint(routes)
                compiled.append((point, []))
                continue
            struct = log.column(point)
            compiled.append(
                (point, [(pos, r, *self._route_columns(point, r, pos, struct)) for pos, r in routes])
            )
        return compiled

    def replace_routes(self, point: str, routes: Sequence[Route]) -> None:
        """Serve ``point``'s matched routes by ``routes`` from the next micro-batch on (a new broadcast).

        Only for a point served through the matcher (``matcher_min`` routes or
        more at start); each route's target must be a subscription point.
        """
        if self._remote:
            raise FlowError(
                "replace_routes: on Spark Connect the deliveries run on the server, with the routes they "
                "started with; stop the run and start it again (it resumes) with the new subscriptions"
            )
        mp = self._matched.get(point)
        if mp is None:
            raise FlowError(f"{point!r} is not a point served through the matcher")
        for r in routes:
            if r.source != point:
                raise FlowError(f"route {r.name!r} leaves {r.source!r}, not {point!r}")
            if not self.graph.has_space(r.target) or r.target not in self.plan.recorded:
                raise FlowError(f"route {r.name!r}: {r.target!r} is not a subscription point")
        with self._lock:
            mp.routes = list(enumerate(routes))
            mp.version += 1
            mp.shipped = None

    def _shipped(self, point: str, mp: _MatchedPoint) -> tuple[Shipped, list[tuple[int, Route]]]:
        with self._lock:
            if mp.shipped is None:
                matcher = Matcher(functions=self.functions)
                matcher.add_many((i, r.select) for i, r in mp.routes)
                # Spark Connect has no broadcast variables: the pickle then travels with the tasks
                ref = ship(
                    self.spark, matcher, int_ids=True, remote=self._remote, tag=f"{point}/{mp.version}/"
                )
                mp.shipped = (ref, list(mp.routes))
            return mp.shipped  # type: ignore[no-any-return]

    def _matched_rows(self, point: str, pdf: DataFrame) -> list[DataFrame]:
        mp = self._matched[point]
        ref, routes = self._shipped(point, mp)
        schema = StructType([*pdf.schema.fields, StructField("_route", LongType())])
        fields = list(self.graph.event_space(point).schema.fields)
        matched = pdf.mapInArrow(partial(_match_routes, ref=ref, fields=fields), schema)
        out: list[DataFrame] = []
        # routes with the same outputs share one projection
        groups: dict[tuple[Any, ...], list[tuple[int, Route]]] = {}
        for i, r in routes:
            groups.setdefault((r.outputs, r.requires), []).append((i, r))
        for members in groups.values():
            _, first = members[0]
            _, columns = self._route_columns(point, first, 0)
            ids = [i for i, _ in members]
            targets = F.create_map(*(x for i, r in members for x in (F.lit(i), F.lit(r.target))))
            rows = matched.where(F.col("_route").isin(ids))
            defined = self._defined_columns(point, first)
            if defined is not None:
                rows = rows.where(defined)
            rows = rows.select(
                F.concat(F.col("_order"), long_bytes(F.col("_route"))).alias("_order"),
                *columns[1:],
                targets[F.col("_route")].alias("_target"),
            )
            out.append(rows)
        return out

    def _defined_columns(self, point: str, route: Route) -> Column | None:
        """The route's requirements and outputs defined (its select is the matcher's business)."""
        compiler = self._compiler(point)
        parts = [compiler.defined(e) for e in route.requires] + [
            compiler.defined(e) for _, e in route.outputs
        ]
        return reduce(lambda a, b: a & b, parts) if parts else None

    # ----------------------------------------------------------- queries

    def _stream(self, log: Log) -> DataFrame:
        reader = self._spark().readStream.schema(log_schema(self.graph, log))
        if log.name == INPUT:
            reader = reader.option("maxFilesPerTrigger", self.files_per_batch)
        else:  # a derived log: a directory of files per micro-batch, published at once (groups.FoldBatches)
            reader = reader.option("recursiveFileLookup", "true")
        path = self._log_dir(log.name)
        path.mkdir(parents=True, exist_ok=True)
        return reader.parquet(str(path))

    def _point_rows(self, df: DataFrame, log: Log, point: str) -> DataFrame:
        return df.where(F.col("_point") == point).select("_order", f"{log.column(point)}.*")

    def _as_is(self, log: Log, point: str) -> Branch:
        """A point's events as they are (the fields of its struct column)."""
        names = list(self.graph.event_space(point).schema.fields)
        struct = log.column(point)
        columns = {n: F.col(struct).getField(n).alias(n) for n in names}
        return Branch(point, None, {"_order": F.col("_order"), **columns})

    def _deliver_batch(self, log: Log, df: DataFrame, batch_id: int) -> None:
        """Deliver micro-batch ``batch_id`` of ``log``, and fold it into the groups it feeds (alongside)."""
        checkpoint = self.work / "checkpoints" / f"deliver-{log.name}"
        df, rows_in = batch_frame(df, log_schema(self.graph, log), checkpoint, batch_id)
        folds = [g for g in self.plan.groups if g.log_in == log.name and not g.aggregate]
        with ThreadPoolExecutor(max(1, len(folds))) as pool:
            folding = [pool.submit(self._fold_batch, g, df, batch_id) for g in folds]
            self._deliver(log, df, batch_id, rows_in)
            for f in folding:
                f.result()

    def _deliver(self, log: Log, df: DataFrame, batch_id: int, rows_in: int) -> None:
        t0 = time.perf_counter()
        self._session(df)
        # not cached: each write reads the micro-batch's Parquet file again (only the columns it
        # needs), which costs less than building the cache (measured)
        targets: dict[str, list[Branch]] = {}
        matched: list[tuple[str, DataFrame]] = []
        for point, routes in self._compiled[log.name]:
            if point in self.plan.recorded:
                targets.setdefault(point, []).append(self._as_is(log, point))
            if point in self._matched:
                pdf = self._point_rows(df, log, point)
                matched.extend((point, m) for m in self._matched_rows(point, pdf))
            for _pos, route, cond, columns in routes:
                targets.setdefault(route.target, []).append(Branch.of(point, route, cond, columns))
        # files side by side (the writes' tasks fill both cores); callbacks, console, bus one by one
        side = self.sink != "console" and self.callback is None
        with ThreadPoolExecutor(max(1, len(targets))) as pool:
            writing = {
                t: pool.submit(self._write, t, scan_branches(df, f), log.name, batch_id)
                for t, f in targets.items()
                if side and t not in self.bus_sinks
            }
            counts = {
                t: self._write(t, scan_branches(df, f), log.name, batch_id)
                for t, f in targets.items()
                if t not in writing
            }
            counts.update({t: f.result() for t, f in writing.items()})
        for point, frame in matched:
            counts.update(self._write_matched(point, frame, log.name, batch_id))
        self._report(BatchReport(f"deliver {log.name}", batch_id, rows_in, counts, time.perf_counter() - t0))

    def _report(self, report: BatchReport) -> None:
        if self._on_server:  # a Connect server's Python process: the client reads the file
            d = self.work / "reports"
            d.mkdir(parents=True, exist_ok=True)
            name = f"{report.query.replace(' ', '-')}-{report.batch:08d}-{uuid.uuid4().hex[:6]}"
            tmp = d / f".{name}.tmp"
            tmp.write_text(json.dumps(report.__dict__))
            tmp.replace(d / f"{name}.json")
            return
        self._on_report(report)

    def _on_report(self, report: BatchReport) -> None:
        self.stats.add(report, counts_input=report.query == f"deliver {INPUT}")
        if self.on_batch is not None:
            self.on_batch(report)

    def _write(self, point: str, rows: DataFrame, log: str, batch_id: int) -> int:
        path = self.out / point / f"{log}-{batch_id:06d}"
        if point in self.bus_sinks:
            return publish_rows(rows, self.bus_sinks[point], f"{self.run_id}/{point}/{log}-{batch_id}")
        if self.callback is not None:
            rows = rows.persist()
            try:
                n = rows.count()
                self.callback(point, batch_id, rows)
            finally:
                rows.unpersist()
            return n
        if self.sink == "console":
            rows = rows.persist()
            try:
                n = rows.count()
                if n:
                    print(f"-- {point}: batch {log}-{batch_id}, {n} events")
                    rows.orderBy("_order").withColumn("_order", F.hex("_order")).show(20, truncate=False)
            finally:
                rows.unpersist()
            return n
        if self.sink == "jsonl":  # the bytes as hex text, which sorts as they do (JSON would carry base64)
            rows = rows.withColumn("_order", F.hex("_order"))
        observed = Observation(f"{point}-{log}-{batch_id}")
        writer = rows.observe(observed, F.count(F.lit(1)).alias("n")).write.mode("overwrite")
        if self.sink == "jsonl":
            writer.json(str(path))
        else:  # _order is unique per row: a dictionary of it would be built, then dropped (10% of a write)
            writer.option("parquet.enable.dictionary#_order", "false").parquet(str(path))
        return int(observed.get.get("n", 0))

    def _write_matched(self, point: str, rows: DataFrame, log: str, batch_id: int) -> dict[str, int]:
        """Rows of many subscription points: one dataset per point, partitioned by ``_target``."""
        path = self.out / f"{point}.matched" / f"{log}-{batch_id:06d}"
        rows = rows.persist()
        try:
            counts = {
                r["_target"]: r["n"]
                for r in rows.groupBy("_target").agg(F.count(F.lit(1)).alias("n")).collect()
            }
            if self.callback is not None:
                self.callback(f"{point}.matched", batch_id, rows)
            elif self.sink == "console":
                rows.orderBy("_order").withColumn("_order", F.hex("_order")).show(20, truncate=False)
            else:
                if self.sink == "jsonl":
                    rows = rows.withColumn("_order", F.hex("_order"))
                writer = rows.write.mode("overwrite").partitionBy("_target")
                writer.parquet(str(path)) if self.sink == "parquet" else writer.json(str(path))
        finally:
            rows.unpersist()
        return counts

    def _group_rows(self, group: StatefulGroup, src: DataFrame) -> tuple[DataFrame, list[str]]:
        """The events of ``src`` (the group's input log) a stateful group folds -- the routes into its
        space -- and the names of its key columns: a key that is a field of the space is that field's
        column when the group is folded per key, the others are computed as ``_k<i>``."""
        log_in = self.plan.log(group.log_in)
        space = self.graph.event_space(group.space)
        names = list(space.schema.fields)
        branches = []
        for feed in group.feeds:
            if feed.route is None:
                branches.append(self._as_is(log_in, feed.point))
            else:
                struct = log_in.column(feed.point)
                cond, columns = self._route_columns(feed.point, feed.route, feed.position, struct)
                branches.append(Branch.of(feed.point, feed.route, cond, columns))
        rows = scan_branches(src, branches)
        compiler = ColumnCompiler(self.functions, dict(space.schema.fields))
        reserved = {*log_schema(self.graph, self.plan.log(group.log_out)).fieldNames(), "_state"}
        keys = []
        for i, (_, e) in enumerate(group.key):
            if not group.aggregate and isinstance(e, Field) and e.name in names and e.name not in reserved:
                keys.append(e.name)  # grouped by the field itself: no copy of it to shuffle and ship
                continue
            keys.append(f"_k{i}")
            rows = rows.withColumn(f"_k{i}", compiler.single(compiler.value(e), e))
        return rows, keys

    def _fold_batch(self, group: StatefulGroup, df: DataFrame, batch_id: int) -> None:
        t0 = time.perf_counter()
        self._session(df)
        runner = self._groups[group.name]
        assert isinstance(runner, FoldBatches)
        derived = runner.run(*self._group_rows(group, df), batch_id)
        self._report(BatchReport(f"fold {group.name}", batch_id, derived, {}, time.perf_counter() - t0))

    def _expand_batch(self, group: StatefulGroup, df: DataFrame, batch_id: int) -> None:
        t0 = time.perf_counter()
        self._session(df)
        runner = self._groups[group.name]
        assert isinstance(runner, AggregateBatches)
        changed = runner.run(df, batch_id)
        self._report(BatchReport(f"aggregate {group.name}", batch_id, changed, {}, time.perf_counter() - t0))

    def _start_delivery(self, log: Log) -> StreamingQuery:
        name = f"deliver-{log.name}"
        return (
            self._stream(log)
            .writeStream.queryName(f"flowbus-{uuid.uuid4().hex[:8]}-{name}")
            .option("checkpointLocation", str(self.work / "checkpoints" / name))
            .foreachBatch(partial(self._deliver_batch, log))
            .start()
        )

    def _start_state(self, group: StatefulGroup) -> StreamingQuery:
        """The state query of a group folded by Spark's aggregation (the others fold in the delivery
        query of their input log)."""
        name = f"state-{group.name}"
        src = self._stream(self.plan.log(group.log_in))
        runner = self._groups[group.name]
        assert isinstance(runner, AggregateBatches)
        writer = runner.query(*self._group_rows(group, src)).writeStream.outputMode("update")
        writer = writer.foreachBatch(partial(self._expand_batch, group))
        return (
            writer.queryName(f"flowbus-{uuid.uuid4().hex[:8]}-{name}")
            .option("checkpointLocation", str(self.work / "checkpoints" / name))
            .start()
        )

    def _start_bus_ingest(self) -> StreamingQuery:
        log = self.plan.log(INPUT)
        ingest = BusIngest(self.graph, log, log_schema(self.graph, log), self.bus_sources, self.run_id)
        return (
            ingest.frame(self._spark())
            .writeStream.queryName(f"flowbus-{uuid.uuid4().hex[:8]}-ingest-bus")
            .format("parquet")
            .option("path", str(self._log_dir(INPUT)))
            .option("checkpointLocation", str(self.work / "checkpoints" / "ingest-bus"))
            .start()
        )

    def start(self) -> None:
        """Start every query (state queries write the logs the next level's delivery queries read)."""
        self._spark().conf.set("spark.sql.streaming.stateStore.providerClass", STATE_STORE)
        if self.bus_sinks:
            register(self._spark())
        try:
            if self.bus_sources:
                self._starters["ingest-bus"] = self._start_bus_ingest
                self._query_logs["ingest-bus"] = BUS_LEVEL
            for log in self.plan.logs:
                self._starters[f"deliver-{log.name}"] = partial(self._start_delivery, log)
                self._query_logs[f"deliver-{log.name}"] = log.name
            for group in (g for g in self.plan.groups if g.aggregate):
                self._starters[f"state-{group.name}"] = partial(self._start_state, group)
                self._query_logs[f"state-{group.name}"] = group.log_in
            for name, starter in self._starters.items():
                self.queries[name] = starter()
        except Exception:
            self.stop()
            raise

    def _restart(self, name: str, exc: BaseException) -> bool:
        """Restart query ``name`` from its checkpoint after a transient failure (False: not transient).

        A Python worker that starts too slowly on a busy machine misses the
        JVM's connect-back deadline; the query restarts where its checkpoint
        says, so nothing is lost or delivered twice.
        """
        text = str(exc)
        if not any(t in text for t in _TRANSIENT) or self._restarts.get(name, 0) >= _MAX_RESTARTS:
            return False
        self._restarts[name] = self._restarts.get(name, 0) + 1
        with contextlib.suppress(Exception):
            self.queries[name].stop()
        self.queries[name] = self._starters[name]()
        return True

    def process_available(self) -> None:
        """Block until every query has processed all the input there is (level by level)."""
        for level in [[BUS_LEVEL], *self.plan.levels()]:
            for name in list(self.queries):
                if self._query_logs[name] not in level:
                    continue
                while True:
                    try:
                        self.queries[name].processAllAvailable()
                        self._collect_reports()
                        break
                    except Exception as exc:  # a StreamingQueryException: the query failed
                        if not self._restart(name, exc):
                            raise FlowError(f"query {name} failed: {_first_line(exc)}") from exc

    def check(self) -> None:
        """Raise :class:`FlowError` if a query has failed (one that failed transiently is restarted)."""
        self._collect_reports()
        for name, q in list(self.queries.items()):
            exc = q.exception()
            if exc is not None and not self._restart(name, exc):
                raise FlowError(f"query {name} failed: {_first_line(exc)}")

    def stop(self) -> None:
        for q in self.queries.values():
            with contextlib.suppress(Exception):
                q.stop()

    def __enter__(self) -> SparkFlow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return type(exc).__name__


def fingerprint(spec_text: str, generator: str, events: int, seed: int) -> str:
    digest = hashlib.sha256(spec_text.encode()).hexdigest()[:12]
    return f"{generator}:{events}:{seed}:{digest}"
