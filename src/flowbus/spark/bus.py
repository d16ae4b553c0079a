"""The bus as a Spark data source and sink: ``format("flowbus")`` through PySpark's Python Data
Source API (``pyspark.sql.datasource``, Spark 4).

::

    register(spark)
    trades = (spark.readStream.format("flowbus").option("brokers", "127.0.0.1:7001,127.0.0.1:7002")
              .option("space", "NYSE").option("filter", "vol > 100").load())
    (derived.writeStream.format("flowbus").option("brokers", "127.0.0.1:7001")
     .option("space", "big_trades").option("checkpointLocation", "ck").start())
    held = spark.read.format("flowbus").option("brokers", ...).option("space", "NYSE").load()

How it works:

* **Reading** uses a *pulled* durable subscription per space (:mod:`flowbus.broker.pull`,
  named by the ``subscription`` option, ``spark-<spaces>`` by default): the broker keeps
  each of its events in its SQLite queue at a position, one increasing sequence per store.
  An offset holds a :class:`~flowbus.client.pull.Mark` per space (``{"spaces": {space:
  {"seq", "store", "marks"}}}``: a position, the store it is one of, and per publisher the
  highest sequence number read up to it). A micro-batch reads, per space (one partition
  each), in a Python worker with a connection of its own, what is queued between its start
  and end marks, and changes nothing at the broker; only :meth:`BusStreamReader.commit`
  (Spark committed the batch) acknowledges up to ``end``, so a query restarted from its
  checkpoint re-reads what it had not committed, and nothing it had. ``latestOffset`` marks
  what is queued now. Every call finds the broker that serves the subscription now
  (:func:`~flowbus.client.pull.serving`: a new query's is made at the first broker that
  answers, and holds what was published from its first start on). So when that broker dies
  and another takes the subscription over, with positions of its own and maybe events the
  dead one had queued already, each event is still read once: by the marks (the module
  note of :mod:`flowbus.client.pull`). The rows have the event's position (``_seq``, at its
  store), space and id (``_publisher``, ``_pseq``), then the space's fields (typed by its
  schema) -- or, with several spaces, one struct column per space. A batch read
  (``spark.read``) gives what the subscriptions hold, without acknowledging.
* **Writing** publishes each row (its columns not starting with ``_``) into ``space``, from
  each task's own client, named after the query, the micro-batch and the partition
  (``spark/<query id>/<batch>/<partition>``; a batch write's ``id`` option stands for the
  first two), so the ``n``-th row of a partition is the event ``(that name, n)``. The
  broker's publish ledger takes an event id once (:mod:`flowbus.broker.ledger`): a replayed
  micro-batch, whose partitions hold the same rows, publishes nothing twice. Each task waits
  until the broker has acknowledged every row.
* **Spaces.** A sink declares its space, when the bus does not know it, by deploying a flow
  of that one space (``spark_<space>``, a source with the rows' schema: publishable and
  subscribable on every broker, :mod:`flowbus.flow.deploy`); a space the bus knows must
  have the rows' fields and types, or the error names the space and the field. A source's
  space must exist and have a schema.

An unreachable broker, an unknown space and a schema clash are errors naming it
(:class:`~flowbus.errors.ClientError`, :class:`~flowbus.errors.SchemaError`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from flowbus.client.client import Client, connect
from flowbus.client.pull import Mark, serving
from flowbus.errors import ClientError, SchemaError
from flowbus.model import Schema

__all__ = [
    "BusOptions",
    "FlowbusDataSource",
    "check_sink",
    "clash",
    "declare",
    "register",
    "schema_struct",
    "space_schemas",
    "spark_type",
]

_TO_SPARK: Mapping[type, DataType] = {
    str: StringType(),
    int: LongType(),
    float: DoubleType(),
    bool: BooleanType(),
}
_FROM_SPARK: Mapping[type, type] = {
    StringType: str,
    LongType: int,
    IntegerType: int,
    ShortType: int,
    ByteType: int,
    DoubleType: float,
    FloatType: float,
    BooleanType: bool,
}
_META = [
    StructField("_space", StringType(), False),
    StructField("_seq", LongType(), False),
    StructField("_publisher", StringType(), False),
    StructField("_pseq", LongType(), False),
]


def register(spark: SparkSession) -> None:
    """Make ``format("flowbus")`` known to ``spark``."""
    spark.dataSource.register(FlowbusDataSource)


@dataclass(frozen=True, slots=True)
class BusOptions:
    """A source's or sink's options: ``brokers`` (``HOST:PORT,...``), ``space`` (a sink: one;
    a source: one or more, comma-separated), ``filter``, ``subscription``, ``timeout``
    (seconds to find a broker), ``flush_timeout`` (seconds a write task waits for the brokers'
    acknowledgements: until the subscribers have its events, in memory or on disk) and, for a
    batch write, ``id``."""

    brokers: tuple[str, ...]
    spaces: tuple[str, ...]
    filter: str
    subscription: str
    timeout: float
    id: str
    flush_timeout: float = 600.0

    @classmethod
    def of(cls, options: Mapping[str, str]) -> BusOptions:
        brokers = tuple(b.strip() for b in options.get("brokers", "").split(",") if b.strip())
        spaces = tuple(s.strip() for s in options.get("space", "").split(",") if s.strip())
        if not brokers:
            raise ClientError('format("flowbus"): give option("brokers", "HOST:PORT,...")')
        if not spaces:
            raise ClientError('format("flowbus"): give option("space", NAME)')
        name = options.get("subscription") or f"spark-{'-'.join(spaces)}"
        seconds = {k: options.get(k, d) for k, d in (("timeout", "30"), ("flush_timeout", "600"))}
        try:
            timeout, flush = (float(v) for v in seconds.values())
        except ValueError:
            raise ClientError(f'format("flowbus"): timeouts are seconds, got {seconds}') from None
        return cls(brokers, spaces, options.get("filter", ""), name, timeout, options.get("id", ""), flush)

    def sub_id(self, space: str) -> str:
        """The pulled subscription that reads ``space``."""
        return self.subscription if len(self.spaces) == 1 else f"{self.subscription}:{space}"

    def client(self, name: str | None = None) -> Client:
        return connect(*self.brokers, name=name, connect_timeout=self.timeout)


def _run(coro: Any) -> Any:
    """``coro`` on an event loop of its own (Spark calls us from plain threads and workers)."""
    return asyncio.run(coro)


async def _welcome(opts: BusOptions) -> dict[str, Schema | None]:
    async with opts.client() as c:
        return dict(c.spaces)


def space_schemas(opts: BusOptions) -> dict[str, Schema]:
    """The schemas of a source's spaces; an error naming a space that is unknown or has none."""
    known = _run(_welcome(opts))
    out: dict[str, Schema] = {}
    for space in opts.spaces:
        if space not in known:
            raise ClientError(
                f"unknown space {space!r} at {', '.join(opts.brokers)} (known: {', '.join(sorted(known))})"
            )
        schema = known[space]
        if schema is None:
            raise SchemaError(f"space {space!r} has no schema: the flowbus source reads spaces with one")
        out[space] = schema
    return out


def spark_type(kind: type) -> DataType:
    """The Spark type of a flowbus field type (``str``, ``int``, ``float``, ``bool``)."""
    return _TO_SPARK[kind]


def schema_struct(schema: Schema) -> StructType:
    """A flowbus schema as a Spark struct (every field nullable: a missing one is null)."""
    return StructType([StructField(n, spark_type(k)) for n, k in schema.fields.items()])


def source_schema(schemas: Mapping[str, Schema]) -> StructType:
    """The rows of a source: position, space, event id, then the fields (one space) or one
    struct column per space."""
    if len(schemas) == 1:
        (schema,) = schemas.values()
        return StructType(_META + list(schema_struct(schema).fields))
    return StructType(_META + [StructField(s, schema_struct(schema)) for s, schema in schemas.items()])


class FlowbusDataSource(DataSource):
    """``format("flowbus")``: the bus as a streaming (and batch) source and sink."""

    @classmethod
    def name(cls) -> str:
        return "flowbus"

    def schema(self) -> StructType:
        return source_schema(space_schemas(BusOptions.of(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BusStreamReader(BusOptions.of(self.options), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BusReader(BusOptions.of(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        opts = BusOptions.of(self.options)
        check_sink(opts, schema)
        return BusStreamWriter(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        opts = BusOptions.of(self.options)
        check_sink(opts, schema)
        return BusWriter(opts)


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class SpaceRange(InputPartition):  # type: ignore[misc]
    """The events of ``space`` queued after the mark ``start`` up to the mark ``end``
    (:meth:`Mark.to_json`)."""

    space: str
    start: dict[str, Any]
    end: dict[str, Any]


@dataclass(frozen=True)
class HeldRange(InputPartition):  # type: ignore[misc]
    """What ``space``'s subscription holds now (a batch read)."""

    space: str


def _serving(opts: BusOptions, space: str, *, resume: bool = True) -> Any:
    """The pulled subscription of ``space`` at the broker that serves it (see serving)."""
    return serving(opts.brokers, opts.sub_id(space), space, opts.filter, resume=resume, timeout=opts.timeout)


Offset = dict[str, Any]  # {"spaces": {space: Mark.to_json()}}


def _marks(opts: BusOptions, offset: Offset) -> dict[str, Mark]:
    """An offset's mark per space (one from before marks, ``{"seq": P}``: P at every space)."""
    spaces = offset.get("spaces")
    if spaces is None:
        return {s: Mark(int(offset.get("seq", 0))) for s in opts.spaces}
    return {s: Mark.from_json(spaces.get(s, {})) for s in opts.spaces}


def _offset(marks: dict[str, Mark]) -> Offset:
    return {"spaces": {s: m.to_json() for s, m in marks.items()}}


async def _initial(opts: BusOptions) -> Offset:
    marks = {}
    for s in opts.spaces:  # (found, or made: they hold what is published from now on)
        async with _serving(opts, s, resume=False) as q:
            marks[s] = Mark(0, q.store)
    return _offset(marks)


async def _latest(opts: BusOptions, start: Offset) -> Offset:
    """What is queued now. The spaces' subscriptions in one store are cut at one position
    (the highest queued for any of them: no row at or below it can still come), so their
    rows' positions order them across batches (``flowbus run`` merges its spaces by them)."""
    starts = _marks(opts, start)
    async with contextlib.AsyncExitStack() as stack:
        qs = {s: await stack.enter_async_context(_serving(opts, s)) for s in opts.spaces}
        stores = {q.store for q in qs.values()}
        cut = None
        if len(stores) == 1 and all(m.at(q.store) for m, q in zip(starts.values(), qs.values(), strict=True)):
            cut = max([await q.top() for q in qs.values()], default=0)
        return _offset({s: await q.advance(starts[s], cut) for s, q in qs.items()})


async def _commit(opts: BusOptions, end: Offset) -> None:
    for s, mark in _marks(opts, end).items():
        async with _serving(opts, s) as q:
            await q.commit(mark)


async def _read(opts: BusOptions, part: SpaceRange) -> list[Any]:
    async with _serving(opts, part.space) as q:
        return cast(list[Any], await q.between(Mark.from_json(part.start), Mark.from_json(part.end)))


async def _held(opts: BusOptions, space: str) -> list[Any]:
    async with _serving(opts, space, resume=False) as q:
        return cast(list[Any], await q.read(after=0, upto=await q.top(wait=opts.timeout)))


def _batch(opts: BusOptions, schema: StructType, space: str, rows: Sequence[Any]) -> pa.RecordBatch:
    """Rows ``(position, (publisher, pseq), event)`` of ``space`` as one Arrow batch of ``schema``."""
    columns: list[pa.Array] = [
        pa.array([space] * len(rows), pa.string()),
        pa.array([r[0] for r in rows], pa.int64()),
        pa.array([r[1][0] for r in rows], pa.string()),
        pa.array([r[1][1] for r in rows], pa.int64()),
    ]
    arrow = pa.schema([pa.field(f.name, _arrow(f.dataType), nullable=f.nullable) for f in schema.fields])
    if len(opts.spaces) == 1:
        for f in schema.fields[len(_META) :]:
            columns.append(pa.array([r[2].get(f.name) for r in rows], _arrow(f.dataType)))
    else:
        for f in schema.fields[len(_META) :]:
            events = [r[2] if f.name == space else None for r in rows]
            columns.append(pa.array(events, _arrow(f.dataType)))
    return pa.RecordBatch.from_arrays(columns, schema=arrow)


def _arrow(t: DataType) -> pa.DataType:
    if isinstance(t, StructType):
        return pa.struct([pa.field(f.name, _arrow(f.dataType)) for f in t.fields])
    return {StringType: pa.string(), LongType: pa.int64(), DoubleType: pa.float64(), BooleanType: pa.bool_()}[
        type(t)
    ]


class BusStreamReader(DataSourceStreamReader):
    """Micro-batches of positions ``(start, end]`` (see the module note)."""

    def __init__(self, opts: BusOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def initialOffset(self) -> Offset:
        return _run(_initial(self.opts))  # type: ignore[no-any-return]

    def latestOffset(self, start: Offset | None = None, limit: Any = None) -> Offset:
        return _run(_latest(self.opts, start if start is not None else _run(_initial(self.opts))))  # type: ignore[no-any-return]

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        starts, ends = _marks(self.opts, start), _marks(self.opts, end)
        return [
            SpaceRange(s, starts[s].to_json(), ends[s].to_json())
            for s in self.opts.spaces
            if starts[s] != ends[s]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpaceRange)
        rows = _run(_read(self.opts, partition))
        if rows:
            yield _batch(self.opts, self.schema, partition.space, rows)

    def commit(self, end: Offset) -> None:
        _run(_commit(self.opts, end))


class BusReader(DataSourceReader):
    """What the subscriptions hold now (nothing is acknowledged)."""

    def __init__(self, opts: BusOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [HeldRange(s) for s in self.opts.spaces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, HeldRange)
        rows = _run(_held(self.opts, partition.space))
        if rows:
            yield _batch(self.opts, self.schema, partition.space, rows)


# ---------------------------------------------------------------- writing


def sink_fields(schema: StructType) -> dict[str, type]:
    """The event fields of a sink's rows (columns not starting with ``_``), as schema types."""
    out: dict[str, type] = {}
    for f in schema.fields:
        if f.name.startswith("_"):
            continue
        kind = _FROM_SPARK.get(type(f.dataType))
        if kind is None:
            raise SchemaError(
                f"column {f.name!r} is {f.dataType.simpleString()}: a flowbus event field is a string, "
                "integer, floating point or boolean",
                field=f.name,
            )
        out[f.name] = kind
    return out


def check_sink(opts: BusOptions, schema: StructType) -> None:
    """The sink's space exists with the rows' schema, declared now if the bus does not know it;
    a :class:`SchemaError` naming the space and the field that clash."""
    declare(opts, sink_fields(schema))


def declare(opts: BusOptions, fields: Mapping[str, type]) -> None:
    """The sink's space with ``fields``: declared if the bus does not know it, else checked."""
    if len(opts.spaces) != 1:
        raise ClientError(f'format("flowbus"): a sink writes one space, got {", ".join(opts.spaces)}')
    _run(_declare(opts, opts.spaces[0], fields))


async def _declare(opts: BusOptions, space: str, fields: Mapping[str, type]) -> None:
    async with opts.client() as c:
        if space not in c.spaces:
            doc = {"kind": "source", "schema": {n: k.__name__ for n, k in fields.items()}}
            await c.deploy(_declaration(space, doc))
            return
        schema = c.spaces[space]
        if schema is not None:
            clash(space, schema, fields)


def _declaration(space: str, doc: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(
        {"name": f"spark_{space}", "spaces": {space: dict(doc)}, "arcs": []}, sort_keys=False
    )


def clash(space: str, schema: Schema, fields: Mapping[str, type]) -> None:
    """A :class:`SchemaError` naming ``space`` and the first field the rows and the space
    disagree on (an ``int`` column may fill a ``float`` field)."""
    for name, kind in fields.items():
        have = schema.fields.get(name)
        if have is None:
            raise SchemaError(
                f"space {space!r} has no field {name!r} (its fields: {', '.join(schema)})", field=name
            )
        if have is not kind and not (have is float and kind is int):
            raise SchemaError(
                f"space {space!r}: field {name!r} is {have.__name__} there, {kind.__name__} in the rows",
                field=name,
            )
    for name in schema.fields:
        if name not in fields:
            raise SchemaError(f"space {space!r}: field {name!r} is missing from the rows", field=name)


@dataclass(frozen=True)
class Published(WriterCommitMessage):  # type: ignore[misc]
    client: str
    events: int


async def _publish(opts: BusOptions, name: str, batches: Iterator[pa.RecordBatch]) -> int:
    """Publish every row as client ``name`` (event ids ``(name, 1..n)``); wait for the acks."""
    space = opts.spaces[0]
    n = 0
    async with opts.client(name) as c:
        for batch in batches:
            keep = [f for f in batch.schema.names if not f.startswith("_")]
            for event in batch.select(keep).to_pylist():
                await c.publish(space, event)
                n += 1
        await c.flush(opts.flush_timeout)
    return n


def _task_name(prefix: str) -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise ClientError("a flowbus sink writes from a Spark task")
    if not prefix:
        query, batch = (
            ctx.getLocalProperty("sql.streaming.queryId"),
            ctx.getLocalProperty("streaming.sql.batchId"),
        )
        if not query or batch is None:
            raise ClientError('a batch write to format("flowbus") needs option("id", ...) (its event ids)')
        prefix = f"spark/{query}/{batch}"
    return f"{prefix}/{ctx.partitionId()}"


def _write_task(opts: BusOptions, prefix: str, batches: Iterator[pa.RecordBatch]) -> Published:
    name = _task_name(prefix)
    return Published(name, _run(_publish(opts, name, batches)))


class BusStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch's rows published, once per (query, batch, partition, row)."""

    def __init__(self, opts: BusOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write_task(self.opts, "", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # (each task waited for the broker's acknowledgements)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # (what was published stays: the replay publishes the rest, nothing twice)


class BusWriter(DataSourceArrowWriter):
    """A batch write's rows published, once per (``id`` option, partition, row); without
    ``id``, inside ``foreachBatch``, the query's and the micro-batch's."""

    def __init__(self, opts: BusOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write_task(self.opts, self.opts.id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass
