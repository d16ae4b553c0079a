"""The bus at both ends of ``flowbus run``: publication points read from the bus, subscription
points published into it (``--source POINT=flowbus://HOST:PORT[/SPACE]``, ``--sink
flowbus://HOST:PORT``, ``--sink POINT=flowbus://HOST:PORT/SPACE``).

How it works (the source and the sink are :mod:`flowbus.spark.bus`):

* **In.** One more streaming query, ``ingest-bus``, reads the sources' spaces (one
  ``format("flowbus")`` source per broker list, its spaces read by pulled subscriptions named
  after the run) and appends them to the run's input log with Spark's file sink (exactly
  once), as the files of ``--source POINT=DIR`` would be: ``_point``, ``_order = [position]``
  (a broker's positions are the order its events arrived in) and the point's struct column.
  The delivery and state queries read the log as before, so the plan and its order are the
  same as for files; :meth:`flowbus.spark.flow.SparkFlow.process_available` runs this
  query first. The queue is acknowledged when the query commits a micro-batch.
* **Out.** A subscription point with a sink publishes each micro-batch's rows, ordered by
  ``_order`` in one task, into its space; the event ids are ``(<run>/<point>/<log>-<batch>/0,
  row)``, so a micro-batch replayed after a crash publishes nothing twice. The run's id is
  made once and kept in ``OUT/_flowbus/run-id`` (``--fresh`` makes a new one).
* **Before anything starts** (:func:`check_ends`), the driver checks every end: brokers
  reachable, a source's space known with the point's fields and types, a sink's space
  declared with the point's schema if missing, or the same schema if not. An error names
  the broker list, the space and the field.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from flowbus.errors import ClientError, FlowError, SchemaError
from flowbus.flow.deploy import bus_name
from flowbus.flow.graph import Graph
from flowbus.flow.plan import Log
from flowbus.spark.bus import BusOptions, clash, declare, register, space_schemas

__all__ = [
    "BUS_LEVEL",
    "BusEnd",
    "BusIngest",
    "check_ends",
    "parse_end",
    "publish_rows",
    "run_id",
    "sink_points",
]

SCHEME = "flowbus://"
BUS_LEVEL = "_bus"
"""The level of the ``ingest-bus`` query: before the input log's."""


@dataclass(frozen=True, slots=True)
class BusEnd:
    """Where a point meets the bus: a broker list and a space."""

    brokers: tuple[str, ...]
    space: str

    def options(self, **more: str) -> dict[str, str]:
        return {"brokers": ",".join(self.brokers), "space": self.space, **more}


def parse_end(url: str, default_space: str | None) -> BusEnd:
    """``flowbus://HOST:PORT[,HOST:PORT...][/SPACE]`` (the space defaults to ``default_space``)."""
    if not url.startswith(SCHEME):
        raise FlowError(f"a bus address is {SCHEME}HOST:PORT or {SCHEME}HOST:PORT/SPACE, got {url!r}")
    where, _, space = url[len(SCHEME) :].partition("/")
    brokers = tuple(b for b in where.split(",") if b)
    if not brokers or not all(b.rpartition(":")[2].isdigit() for b in brokers):
        raise FlowError(f"{url!r}: give the brokers as HOST:PORT, comma-separated")
    space = space or default_space or ""
    if not space:
        raise FlowError(f"{url!r}: name the space ({SCHEME}HOST:PORT/SPACE)")
    return BusEnd(brokers, space)


def run_id(work: Path) -> str:
    """The run's id, made at its first start and kept under ``work``."""
    path = work / "run-id"
    if path.exists():
        return path.read_text().strip()
    work.mkdir(parents=True, exist_ok=True)
    made = uuid.uuid4().hex[:16]
    path.write_text(made)
    return made


def check_ends(g: Graph, sources: Mapping[str, BusEnd], sinks: Mapping[str, BusEnd]) -> None:
    """Every end reachable, its space known (a source's) or declared (a sink's), and of the
    point's schema; an error naming the point, the brokers, the space or the field."""
    read: dict[str, str] = {}
    for point, end in sources.items():
        if read.setdefault(end.space, point) != point:
            raise FlowError(f"--source: {read[end.space]!r} and {point!r} read one space, {end.space!r}")
    for point, end in sources.items():
        fields = dict(g.event_space(point).schema.fields)
        try:
            clash(end.space, space_schemas(BusOptions.of(end.options()))[end.space], fields)
        except (ClientError, SchemaError) as exc:
            raise FlowError(f"--source {point}: {exc}") from None
    for point, end in sinks.items():
        fields = dict(g.event_space(point).schema.fields)
        try:
            declare(BusOptions.of(end.options()), fields)
        except (ClientError, SchemaError) as exc:
            raise FlowError(f"--sink {bus_name(point)}: {exc}") from None


class BusIngest:
    """The ``ingest-bus`` query of a run (see the module note)."""

    def __init__(
        self, g: Graph, log: Log, schema: StructType, sources: Mapping[str, BusEnd], run: str
    ) -> None:
        self.graph = g
        self.log = log
        self.schema = schema  # (the input log's rows)
        self.sources = sources
        self.run = run

    def frame(self, spark: SparkSession) -> DataFrame:
        """The sources' events as rows of the input log."""
        register(spark)
        by_brokers: dict[tuple[str, ...], dict[str, str]] = {}  # brokers -> space -> point
        for point, end in self.sources.items():
            by_brokers.setdefault(end.brokers, {})[end.space] = point  # (one point a space: check_ends)
        frames = [self._rows(spark, brokers, points) for brokers, points in by_brokers.items()]
        return reduce(DataFrame.unionByName, frames).coalesce(1)  # (one file per micro-batch: the
        # input log is read a file at a time, and a batch's events are ordered within it)

    def _rows(self, spark: SparkSession, brokers: tuple[str, ...], points: Mapping[str, str]) -> DataFrame:
        reader = spark.readStream.format("flowbus")
        opts = BusEnd(brokers, ",".join(points)).options(subscription=f"flowbus-run-{self.run}")
        df = reader.options(**opts).load()
        columns: list[Column] = [F.unhex(F.lpad(F.hex(F.col("_seq").cast("long")), 16, "0")).alias("_order")]
        mapping = F.create_map(*[F.lit(x) for kv in points.items() for x in kv])
        columns.insert(0, mapping[F.col("_space")].alias("_point"))
        for p in self.log.points:
            column = self.log.column(p)
            names = list(self.graph.event_space(p).schema.fields)
            space = next((s for s, q in points.items() if q == p), None)
            if space is None:
                value = F.lit(None)
            elif len(points) == 1:
                value = F.struct(*[F.col(n) for n in names])
            else:
                value = F.when(F.col("_space") == space, F.col(space))
            columns.append(value.cast(self.schema[column].dataType).alias(column))
        return df.select(*columns)


def publish_rows(rows: DataFrame, end: BusEnd, event_ids: str) -> int:
    """Publish ``rows`` (ordered by ``_order``, from one task) into ``end``'s space; how many."""
    observed = Observation(f"bus-{event_ids}")
    ordered = (
        rows.repartition(1).sortWithinPartitions("_order").observe(observed, F.count(F.lit(1)).alias("n"))
    )
    ordered.write.format("flowbus").options(**end.options(id=event_ids)).mode("append").save()
    return int(observed.get.get("n", 0))


def sink_points(g: Graph, recorded: tuple[str, ...] | list[str], specs: list[str]) -> dict[str, BusEnd]:
    """``--sink`` values: ``flowbus://HOST:PORT`` (every subscription point into the space of
    its name) or ``POINT=flowbus://HOST:PORT/SPACE``; subscription points by their bus names."""
    by_name = {bus_name(p): p for p in recorded} | {p: p for p in recorded}
    out: dict[str, BusEnd] = {}
    for spec in specs:
        if spec.startswith(SCHEME):
            for p in recorded:
                out[p] = parse_end(spec, bus_name(p))
            continue
        point, sep, url = spec.partition("=")
        if not sep or point not in by_name:
            known = ", ".join(sorted(bus_name(p) for p in recorded))
            raise FlowError(
                f"--sink {spec!r}: POINT=flowbus://HOST:PORT/SPACE, POINT a subscription point ({known})"
            )
        out[by_name[point]] = parse_end(url, None)
    return out
