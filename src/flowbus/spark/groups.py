"""The micro-batches of a flow's stateful groups: a keyed fold over Arrow, or Spark's own aggregation.

How it works: the delivery query of a group's input log (for Spark's own
aggregation, a state query; :class:`flowbus.spark.flow.SparkFlow`) hands each
micro-batch's rows (the routes into the collapsed space, and the names of the
key's columns) to one of two runners, each writing the derived events of
micro-batch ``b`` to the group's log, published at once (the next level's
delivery query streams that directory, and a replayed micro-batch writes the
same rows again).

* :class:`FoldBatches` (``--collapse state``): the rows and the group's *state
  table* (key columns, one pickled ``_state`` per key) are repartitioned by
  key; on the Python workers :class:`~flowbus.spark.state.PartitionFold` folds
  each key's events in ``_order`` (:class:`~flowbus.spark.state.ArrowFold`) and
  writes its partition's derived events and new state as files of two hidden
  directories, which the driver renames: ``batch-<b>/`` in the log, version
  ``b`` of the state table (:class:`Versions`). Micro-batch ``b`` reads the
  version before ``b``, so a replay starts from the same state and derives the
  same events -- exactly once with the checkpoints, as the file sink was. Every
  key's state passes through each micro-batch (a key with no events keeps its
  row): the table's size is the number of keys.
* :class:`AggregateBatches` (``--collapse aggregate``): Spark's streaming
  aggregation (``max``, ``max_by(x, _order)``, ``count``, ``sum``, update mode)
  folds in the JVM; per changed key, the expand arcs send the shortest sequence
  from the row they last delivered (kept per micro-batch, as the state table is)
  to the new row; the driver writes them as one file, ``batch-<b>.parquet``.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from flowbus.filters.ast import Field
from flowbus.flow.aggregates import Aggregate, Aggregates
from flowbus.flow.collapse import Key
from flowbus.flow.collapse import Row as StateRow
from flowbus.flow.eventlog import ROW_GROUP, arrow_schema, order_key
from flowbus.flow.graph import Collapse, Expand, Graph
from flowbus.flow.plan import Log, StatefulGroup
from flowbus.flow.validate import replays_collapse
from flowbus.spark.bus import schema_struct
from flowbus.spark.state import ArrowFold, PartitionFold, SparkFold

__all__ = [
    "AggregateBatches",
    "FoldBatches",
    "Versions",
    "batch_frame",
    "expands_need_no_backlog",
    "log_schema",
    "write_log",
]


def log_schema(g: Graph, log: Log) -> StructType:
    """The Spark schema of ``log``'s rows: ``_point``, ``_order``, one struct column per point."""
    fields = [StructField("_point", StringType()), StructField("_order", BinaryType())]
    fields += [StructField(log.column(p), schema_struct(g.event_space(p).schema)) for p in log.points]
    return StructType(fields)


def batch_frame(df: DataFrame, schema: StructType, checkpoint: Path, batch_id: int) -> tuple[DataFrame, int]:
    """Micro-batch ``batch_id`` of a log as a scan of its files, and its number of rows.

    ``foreachBatch`` hands a micro-batch over as the rows its plan made (a
    ``LogicalRDD``): every action on it decodes every column of the files into
    rows again, where a scan of the batch's files reads only the columns each
    action needs. The files are in the query's checkpoint, in Spark's source
    log (``sources/0/<batch>`` or the ``.compact`` file holding it: a line of
    JSON per file); the rows are read off their Parquet footers. Without that
    log: ``df`` as handed, and a count job.
    """
    for name in (str(batch_id), f"{batch_id}.compact"):
        log = checkpoint / "sources" / "0" / name
        if log.is_file():
            entries = [json.loads(line) for line in log.read_text().splitlines()[1:] if line.strip()]
            files = [e["path"] for e in entries if e.get("batchId") == batch_id]
            break
    else:
        return df, int(df.count())
    scan = df.sparkSession.read.schema(schema).parquet(*files)
    urls = [urlparse(f) for f in files]
    if not all(u.scheme in ("", "file") for u in urls):
        return scan, int(scan.count())
    return scan, sum(pq.read_metadata(unquote(u.path)).num_rows for u in urls)


def write_log(g: Graph, log: Log, directory: Path, batch_id: int, table: pa.Table) -> None:
    """Micro-batch ``batch_id``'s derived events as one file of ``log`` (nothing when there are none)."""
    if not table.num_rows:
        return
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".batch-{batch_id:06d}.tmp"
    # row groups of at most ROW_GROUP rows: the next level's scans split the file into as many tasks
    pq.write_table(table.cast(arrow_schema(g, log)), tmp, row_group_size=ROW_GROUP)
    tmp.replace(directory / f"batch-{batch_id:06d}.parquet")


class Versions:
    """One file or directory per micro-batch under ``directory``: the version micro-batch ``b`` reads is
    the last one saved before ``b``; saving ``b`` keeps ``b`` and the one before (a replay of ``b``
    needs it)."""

    def __init__(self, directory: Path, suffix: str) -> None:
        self.directory = directory
        self.suffix = suffix

    def _saved(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[: -len(self.suffix)]) for p in self.directory.glob(f"*{self.suffix}"))

    def before(self, batch_id: int) -> Path | None:
        earlier = [b for b in self._saved() if b < batch_id]
        return self.directory / f"{earlier[-1]}{self.suffix}" if earlier else None

    def staging(self, batch_id: int) -> Path:
        """Where version ``batch_id`` is made before :meth:`publish` (hidden: not a version yet)."""
        return self.directory / f".{batch_id}.tmp"

    def save(self, batch_id: int, write: Callable[[Path], object]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write(self.staging(batch_id))
        self.publish(batch_id)

    def publish(self, batch_id: int) -> None:
        """Make what :meth:`staging` holds version ``batch_id`` (replacing one saved before: a replay)."""
        target, staged = self.directory / f"{batch_id}{self.suffix}", self.staging(batch_id)
        if target.is_dir() or staged.is_dir():  # (a file replaces a file at once)
            _remove(target)
        staged.replace(target)
        for b in self._saved():
            if b < batch_id - 1:
                _remove(self.directory / f"{b}{self.suffix}")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fresh(directory: Path) -> Path:
    _remove(directory)
    directory.mkdir(parents=True)
    return directory


class FoldBatches:
    """A group's micro-batches folded per key on the Python workers, which write the derived log's
    files and the state's (:class:`PartitionFold`); the driver publishes both directories."""

    def __init__(self, graph: Graph, group: StatefulGroup, log: Log, work: Path) -> None:
        self.graph = graph
        self.group = group
        self.log = log
        self.log_dir = work / "logs" / log.name
        # (a version is a directory of the workers' files; a single file before them, still read)
        self.versions = Versions(work / "state" / group.name, ".parquet")

    def run(self, rows: DataFrame, keys: list[str], batch_id: int) -> int:
        """Fold micro-batch ``batch_id``'s ``rows``; the number of derived events.

        The rows and the state table before ``batch_id`` are repartitioned by
        key, each partition folded and written by the worker holding it into
        two hidden directories, ``logs/<log>/.batch-<b>.tmp`` and the state's
        staging directory; once every task is done, the driver renames them
        ``batch-<b>`` (the next level's delivery query streams the log's
        directories: all of a micro-batch's files appear at once) and the
        state's version ``b``. A replay writes the same rows again: a
        ``batch-<b>`` already published is kept, the state's version replaced.
        """
        spark = rows.sparkSession
        state_schema = StructType([rows.schema[k] for k in keys] + [StructField("_state", BinaryType())])
        before = self.versions.before(batch_id)
        if before is None or (before.is_dir() and not any(before.glob("*.parquet"))):
            state = spark.createDataFrame([], state_schema)
        else:
            state = spark.read.schema(state_schema).parquet(str(before))
        out = StructType(log_schema(self.graph, self.log).fields + state_schema.fields)
        staged = _fresh(self.log_dir / f".batch-{batch_id:06d}.tmp")
        self.versions.directory.mkdir(parents=True, exist_ok=True)
        states = _fresh(self.versions.staging(batch_id))
        fold = PartitionFold(
            ArrowFold(self.graph, self.group, self.log, to_arrow_schema(out), keys),
            str(staged), str(states), arrow_schema(self.graph, self.log), ROW_GROUP,
        )  # fmt: skip
        both = rows.withColumn("_state", F.lit(None).cast(BinaryType()))
        both = both.unionByName(state, allowMissingColumns=True)
        parts = int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
        summary = StructType([StructField(f.name, LongType()) for f in PartitionFold.SUMMARY])
        # (a function of the batches: PySpark would count a callable object's ``self`` as an argument)
        written = both.repartition(parts, *keys).mapInArrow(lambda b: fold(b), summary).collect()
        target = self.log_dir / f"batch-{batch_id:06d}"
        if target.is_dir() or not any(staged.glob("*.parquet")):  # published before (a replay), or none
            shutil.rmtree(staged)
        else:
            staged.replace(target)
        self.versions.publish(batch_id)
        return sum(int(r["derived"]) for r in written)


class AggregateBatches:
    """A group whose collapses are plain aggregates: Spark aggregates, the driver expands per key."""

    def __init__(
        self, graph: Graph, group: StatefulGroup, log: Log, work: Path, aggregates: Mapping[str, Aggregates]
    ) -> None:
        self.graph = graph
        self.group = group
        self.log = log
        self.log_dir = work / "logs" / log.name
        self.aggregates = aggregates
        self.versions = Versions(work / "delivered" / group.name, ".pkl")
        self.folds = [
            (arc, aggregates[arc.name], SparkFold(graph, arc, group.targets).deliverers)
            for arc in group.collapses
        ]

    def query(self, rows: DataFrame, keys: list[str]) -> DataFrame:
        """The streaming aggregation: per key, ``_last`` (the latest ``_order``) and each component."""
        space = self.graph.event_space(self.group.space).schema.fields
        columns = [F.max("_order").alias("_last")]
        for ci, arc in enumerate(self.group.collapses):
            for a in self.aggregates[arc.name].components:
                columns.append(_aggregate_column(a, space).alias(f"_c{ci}_{a.component}"))
        return rows.where(F.col("_k0").isNotNull()).groupBy(*keys).agg(*columns)

    def run(self, df: DataFrame, batch_id: int) -> int:
        """A micro-batch of changed aggregate rows: per key, the expand arcs' shortest sequences.

        The rows each expand arc last delivered are kept per micro-batch, so a
        replayed micro-batch starts from the same rows and writes the same
        derived events. Returns the number of changed rows.
        """
        before = self.versions.before(batch_id)
        delivered: dict[str, dict[Key, StateRow]] = pickle.loads(before.read_bytes()) if before else {}
        out_rows: list[dict[str, Any]] = []
        changed = df.collect()
        for r in sorted(changed, key=lambda r: r["_last"]):
            key = tuple(r[f"_k{i}"] for i in range(len(self.group.key)))
            for ci, (_arc, aggs, deliverers) in enumerate(self.folds):
                row = tuple(_combine(a, r[f"_c{ci}_{a.component}"]) for a in aggs.components)
                k = 0
                for deliverer, target, names, kinds in deliverers:
                    last = delivered.setdefault(deliverer.arc.name, {})
                    had = last.get(key, deliverer.bound.initial)
                    new = deliverer.project(row)
                    if new == had:
                        continue
                    last[key] = new
                    for e in deliverer.search(key, had, new).events:
                        ev = {
                            n: float(e[n]) if t is float else e[n] for n, t in zip(names, kinds, strict=True)
                        }
                        point = self.group.targets[target]
                        order = bytes(r["_last"]) + order_key(ci, k)
                        out_rows.append({"_point": point, "_order": order, self.log.column(point): ev})
                        k += 1
        table = pa.Table.from_pylist(out_rows, schema=arrow_schema(self.graph, self.log))
        write_log(self.graph, self.log, self.log_dir, batch_id, table)
        self.versions.save(
            batch_id, lambda path: path.write_bytes(pickle.dumps(delivered, pickle.HIGHEST_PROTOCOL))
        )
        return len(changed)


def expands_need_no_backlog(graph: Graph, collapse: Collapse, aggregates: Aggregates) -> bool:
    """Can Spark's aggregation serve this collapse? It hands each expand only the key's new row,
    never the events that made it, so every expand out of the state must reach any such row
    from the values of the rows alone: one that writes any row in one event does; one that
    replays the collapse does when every component is a last, max or min (the goal row's values
    are events' values). A replayed count or sum may need values no row holds (from t = 3 to
    t = 10 an event of 7): that collapse is folded per key, with its backlog (:class:`FoldBatches`)."""
    if {a.kind for a in aggregates.components} <= {"last", "max", "min"}:
        return True
    expands = [arc for arc in graph.arcs if isinstance(arc, Expand) and arc.source == collapse.target]
    return not any(replays_collapse(graph, collapse, arc) for arc in expands)


def _aggregate_column(a: Aggregate, space: Mapping[str, type]) -> Column:
    """The Spark aggregate of one component (NaN skipped by max and min, as the rules skip it)."""
    if a.kind == "count":
        return F.count(F.lit(1))
    assert a.arg is not None
    arg = F.col(a.arg.name) if isinstance(a.arg, Field) else F.lit(a.arg.value)
    if a.kind == "last":
        return F.max_by(arg, F.col("_order"))
    if a.kind == "sum":
        return F.sum(arg)
    if isinstance(a.arg, Field) and space.get(a.arg.name) is float:
        arg = F.when(~F.isnan(arg), arg)
    return F.max(arg) if a.kind == "max" else F.min(arg)


def _combine(a: Aggregate, value: Any) -> Any:
    """A component's value: the aggregate over the key's events so far, merged with the initial value."""
    if a.kind in ("count", "sum"):
        return a.initial + (value or 0)  # type: ignore[operator]
    if value is None:
        return a.initial
    if a.kind == "last":
        return value
    if a.kind == "max":
        return value if value > a.initial or (a.inclusive and value == a.initial) else a.initial
    return value if value < a.initial or (a.inclusive and value == a.initial) else a.initial
