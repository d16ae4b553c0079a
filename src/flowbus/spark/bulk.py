"""Bulk matching on Spark: an event table against a subscription table, written as (event_id, sub_id) pairs.

How it works:

1. The subscriptions (Parquet, JSON lines or CSV with columns ``sub_id`` and
   ``filter``, the filter in the text form) are read on the driver with pyarrow
   and parsed. Plain conjunctions of comparisons with string or integer
   constants (``a3 = "v7" & a9 = "v1"``, all a W1 workload holds) are read by
   one regular expression straight into the canonical form -- the full LALR
   parser takes ~0.2 ms a filter, minutes for a million -- and anything else
   goes through :func:`flowbus.filters.parse`; both give the same
   :class:`~flowbus.filters.Filter` (a test checks it). A bad row is reported
   with its row number and nothing is started.
2. One :class:`~flowbus.matching.Matcher` is built on the driver, pickled and
   broadcast (a classic session) or shipped inside the task (Spark Connect has
   no broadcast variables). Many subscriptions are never one giant OR of Column
   filters: Catalyst overflows its stack near a thousand of them.
3. The events (Parquet or JSON lines, a file or a directory; ``event_id`` taken
   from a column or made by ``monotonically_increasing_id``) go through
   ``mapInArrow``: each Python worker unpickles the matcher once (cached per
   process by broadcast id and version, workers are reused), calls
   ``match_batch`` on each Arrow record batch with one thread (Spark already
   runs a task per core) and yields ``(event_id int64, sub_id int64|string)``.
4. The pairs are written as Parquet.

:func:`join_baseline` is the formulation a Spark user would write for W1-like
filters (conjunctions of string equalities): events exploded to (attribute,
value) rows, a broadcast hash join on the subscriptions' first equality, the
other equalities as the join condition on a map of the event's attributes.
"""

from __future__ import annotations

import gc
import pickle
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from flowbus.errors import FilterError, FlowbusError
from flowbus.filters import Conjunction, Filter, Op, Predicate, parse
from flowbus.matching import Matcher

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BulkResult",
    "Subscriptions",
    "build_matcher",
    "bulk_match",
    "check_out",
    "event_format",
    "join_baseline",
    "match_events",
    "pairs_of",
    "parse_filter",
    "read_events",
    "read_subscriptions",
]

_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
_KEYWORDS = frozenset(
    {"and", "or", "not", "in", "prefix", "suffix", "contains", "exists", "between", "true", "false"}
)
_LIT = r'([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|=|<|>)\s*(?:"([^"\\\n\r]*)"|(-?\d+))'
_SIMPLE = re.compile(rf"\s*{_LIT}(?:\s*&\s*{_LIT})*\s*")
_ONE = re.compile(_LIT)


# ------------------------------------------------------------------ subscriptions (driver side)


@dataclass(frozen=True, slots=True)
class Subscriptions:
    """Parsed subscriptions: ids (all ints or all strings), filters, and the attributes they read."""

    ids: list[Any]
    filters: list[Filter]
    fields: frozenset[str]

    @property
    def int_ids(self) -> bool:
        return not self.ids or type(self.ids[0]) is int


class _Reader:
    """The fast path of the filter text form, remembering the predicates it has built."""

    def __init__(self) -> None:
        self.preds: dict[tuple[str, str, str, str], Predicate] = {}
        self.fields: set[str] = set()

    def __call__(self, text: str) -> Filter:
        if _SIMPLE.fullmatch(text) is None:
            f = parse(text)
            self.fields.update(f.fields())
            return f
        found = _ONE.findall(text)
        if len({name for name, _, _, _ in found}) < len(found) or any(
            name.lower() in _KEYWORDS for name, _, _, _ in found
        ):
            f = parse(text)  # a repeated attribute may fold; a keyword is refused: the parser decides
            self.fields.update(f.fields())
            return f
        return Filter((Conjunction(tuple(self._pred(k) for k in found)),))

    def _pred(self, key: tuple[str, str, str, str]) -> Predicate:
        p = self.preds.get(key)
        if p is None:
            name, op, text, number = key
            p = self.preds[key] = Predicate(name, Op(op), text if number == "" else int(number))
            self.fields.add(name)
        return p


def parse_filter(text: str) -> Filter:
    """One filter's text, through the same fast path as the bulk reader (equal to ``parse(text)``)."""
    return _Reader()(text)


def _read_table(path: Path, what: str) -> pa.Table:
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    if not path.exists():
        raise FlowbusError(f"{what} {path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pcsv.read_csv(
                path, convert_options=pcsv.ConvertOptions(column_types={"filter": pa.string()})
            )
        if suffix in _JSON_SUFFIXES:
            return pjson.read_json(path)
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise FlowbusError(f"cannot read {what} {path}: {exc}") from None


def _first_null(column: pa.ChunkedArray) -> int:
    return int(np.flatnonzero(np.asarray(column.is_null()))[0])


def _sub_ids(table: pa.Table, path: Path) -> list[Any]:
    column = table.column("sub_id")
    if column.null_count:
        raise FlowbusError(f"{path}: row {_first_null(column) + 1} has no sub_id")
    if pa.types.is_integer(column.type):
        ids: list[Any] = column.to_pylist()
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        ids = column.to_pylist()
    else:
        raise FlowbusError(f"{path}: sub_id must hold integers or strings, not {column.type}")
    if len(set(ids)) < len(ids):
        seen: set[Any] = set()
        for row, sid in enumerate(ids, 1):
            if sid in seen:
                raise FlowbusError(f"{path}: row {row} repeats sub_id {sid!r}")
            seen.add(sid)
    return ids


def read_subscriptions(path: Path) -> Subscriptions:
    """Read and parse a subscription table (Parquet, JSON lines or CSV; columns ``sub_id``, ``filter``)."""
    table = _read_table(path, "subscriptions")
    missing = [c for c in ("sub_id", "filter") if c not in table.column_names]
    if missing:
        raise FlowbusError(
            f"{path}: missing column(s) {', '.join(missing)}"
            f" (found: {', '.join(table.column_names) or 'none'})"
        )
    ids = _sub_ids(table, path)
    texts = table.column("filter")
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise FlowbusError(f"{path}: the filter column must hold text, not {texts.type}")
    if texts.null_count:
        raise FlowbusError(f"{path}: row {_first_null(texts) + 1} has no filter")
    reader = _Reader()
    filters: list[Filter] = []
    gc_was = gc.isenabled()
    gc.disable()  # a million small filter objects: the cyclic collector would dominate
    try:
        for row, text in enumerate(texts.to_pylist(), 1):
            try:
                filters.append(reader(text))
            except FilterError as exc:
                raise FlowbusError(f"{path}: row {row} (sub_id {ids[row - 1]!r}): {exc}") from None
    finally:
        if gc_was:
            gc.enable()
    return Subscriptions(ids, filters, frozenset(reader.fields))


def build_matcher(subs: Subscriptions) -> Matcher:
    """One matcher holding every subscription."""
    matcher = Matcher(workers=1)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        matcher.add_many(zip(subs.ids, subs.filters, strict=True))
    except FilterError as exc:
        raise FlowbusError(f"cannot index the subscriptions: {exc}") from None
    finally:
        if gc_was:
            gc.enable()
    return matcher


# ------------------------------------------------------------------ events


def event_format(path: Path) -> str:
    """``parquet`` or ``json``: the format of an events file or directory (an error for anything else)."""
    if not path.exists():
        raise FlowbusError(f"events {path} does not exist")
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    suffixes = {p.suffix.lower() for p in files if not p.name.startswith(("_", "."))}
    if suffixes and suffixes <= {".parquet"}:
        return "parquet"
    if suffixes and suffixes <= set(_JSON_SUFFIXES):
        return "json"
    found = ", ".join(sorted(suffixes)) or "no data files"
    raise FlowbusError(f"events {path}: expected Parquet or JSON lines (.jsonl) files, found {found}")


def read_events(spark: SparkSession, path: Path, *, id_column: str | None = None) -> DataFrame:
    """The events as a DataFrame with an ``event_id`` (int64) column."""
    fmt = event_format(path)
    try:
        df = spark.read.parquet(str(path)) if fmt == "parquet" else spark.read.json(str(path))
        columns = df.columns
    except Exception as exc:  # Spark's errors come from the JVM or the Connect server
        raise FlowbusError(f"cannot read events {path}: {str(exc).splitlines()[0]}") from None
    if "_corrupt_record" in columns:
        raise FlowbusError(f"events {path}: some lines are not JSON objects")
    return _spread(spark, _with_ids(df, path, id_column))


def _with_ids(df: DataFrame, path: Path, id_column: str | None) -> DataFrame:
    from pyspark.sql import functions as F

    columns = df.columns
    if id_column is not None:
        if id_column not in columns:
            raise FlowbusError(f"events {path}: no column {id_column!r} for the event ids")
        return df.withColumn("event_id", F.col(id_column).cast("long"))
    if "event_id" in columns:
        return df.withColumn("event_id", F.col("event_id").cast("long"))
    return df.withColumn("event_id", F.monotonically_increasing_id())


def _spread(spark: SparkSession, df: DataFrame) -> DataFrame:
    """At least one partition per core (a single small file is read as one partition, i.e. one core)."""
    from flowbus.spark.session import is_connect

    if is_connect(spark):
        return df
    cores = spark.sparkContext.defaultParallelism
    return df.repartition(cores) if df.rdd.getNumPartitions() < cores else df


# ------------------------------------------------------------------ matching (executor side)


@dataclass(frozen=True, slots=True)
class _Shipped:
    """How a task finds the matcher: a broadcast of its pickle, or the pickle itself (Spark Connect)."""

    version: str
    int_ids: bool
    broadcast: Any = None
    payload: bytes | None = None

    def key(self) -> str:
        """A fresh random token per shipped matcher: it tells one broadcast (and build) from another."""
        return self.version


_MATCHERS: dict[str, Matcher] = {}
"""The matcher each Python worker process has unpickled (only the latest is kept)."""


def _executor_matcher(ref: _Shipped) -> Matcher:
    matcher = _MATCHERS.get(ref.key())
    if matcher is None:
        data: bytes = ref.payload if ref.broadcast is None else ref.broadcast.value  # type: ignore[assignment]
        matcher = pickle.loads(data)
        matcher.workers = 1
        _MATCHERS.clear()
        _MATCHERS[ref.key()] = matcher
    return matcher


def _schema(int_ids: bool) -> pa.Schema:
    return pa.schema([("event_id", pa.int64()), ("sub_id", pa.int64() if int_ids else pa.string())])


def pairs_of(matcher: Matcher, batch: pa.RecordBatch, *, int_ids: bool) -> pa.RecordBatch:
    """The (event_id, sub_id) pairs of one record batch (it has an ``event_id`` column)."""
    schema = _schema(int_ids)
    results = matcher.match_batch(batch)
    if not results:
        return pa.record_batch([pa.array([], field.type) for field in schema], schema=schema)
    counts = np.fromiter((r.size for r in results), np.int64, len(results))
    event_ids = np.repeat(batch.column("event_id").to_numpy(zero_copy_only=False), counts)
    subs = np.concatenate(results)
    sub_array = pa.array(subs.astype(np.int64) if int_ids else subs.tolist(), schema.field("sub_id").type)
    return pa.record_batch([pa.array(event_ids, pa.int64()), sub_array], schema=schema)


def _match_partition(batches: Iterator[pa.RecordBatch], ref: _Shipped) -> Iterator[pa.RecordBatch]:
    matcher = _executor_matcher(ref)
    for batch in batches:
        yield pairs_of(matcher, batch, int_ids=ref.int_ids)


def match_events(spark: SparkSession, events: DataFrame, matcher: Matcher, subs: Subscriptions) -> DataFrame:
    """The (event_id, sub_id) pairs of ``events`` (lazy: nothing runs until an action)."""
    from flowbus.spark.session import is_connect

    data = pickle.dumps(matcher, protocol=pickle.HIGHEST_PROTOCOL)
    version = uuid.uuid4().hex
    if is_connect(spark):
        ref = _Shipped(version, subs.int_ids, payload=data)
    else:
        ref = _Shipped(version, subs.int_ids, broadcast=spark.sparkContext.broadcast(data))
    columns = ["event_id", *(c for c in events.columns if c in subs.fields and c != "event_id")]
    schema = "event_id long, sub_id " + ("long" if subs.int_ids else "string")
    return events.select(*columns).mapInArrow(partial(_match_partition, ref=ref), schema)


# ------------------------------------------------------------------ the whole job


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk match did, and how long each stage took (seconds)."""

    out: str
    subscriptions: int
    pairs: int
    read_s: float
    build_s: float
    match_s: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def check_out(out: Path) -> None:
    """Refuse an output path that holds something already."""
    if out.exists() and (out.is_file() or any(out.iterdir())):
        raise FlowbusError(f"output {out} exists already: give a new path")


def bulk_match(
    spark: SparkSession,
    events: Path,
    subscriptions: Path | Subscriptions,
    out: Path,
    *,
    id_column: str | None = None,
) -> BulkResult:
    """Match ``events`` against ``subscriptions`` and write the (event_id, sub_id) pairs to ``out`` (Parquet).

    ``subscriptions`` is a path or what :func:`read_subscriptions` made of one.
    Every input is read and checked before anything is written.
    """
    check_out(out)
    t0 = time.perf_counter()
    subs = subscriptions if isinstance(subscriptions, Subscriptions) else read_subscriptions(subscriptions)
    df = read_events(spark, events, id_column=id_column)
    t1 = time.perf_counter()
    matcher = build_matcher(subs)
    t2 = time.perf_counter()
    match_events(spark, df, matcher, subs).write.parquet(str(out))
    t3 = time.perf_counter()
    pairs = spark.read.parquet(str(out)).count()
    return BulkResult(str(out), len(subs.ids), pairs, t1 - t0, t2 - t1, t3 - t2)


# ------------------------------------------------------------------ the broadcast-hash-join baseline


def _baseline_table(subs: Subscriptions) -> pa.Table:
    """One row per subscription: the key equality, then the other equalities (null-padded)."""
    width = 1
    rows: list[list[tuple[str, str]]] = []
    for sid, f in zip(subs.ids, subs.filters, strict=True):
        lits = f.disjuncts[0].literals if len(f.disjuncts) == 1 else ()
        pairs = [
            (p.attr, p.value)
            for p in lits
            if isinstance(p, Predicate) and p.op is Op.EQ and not p.negated and type(p.value) is str
        ]
        if not lits or len(pairs) < len(lits):
            raise FlowbusError(
                f"subscription {sid!r}: the join baseline takes conjunctions of string equalities only"
            )
        rows.append(pairs)  # type: ignore[arg-type]  # the values are str, checked above
        width = max(width, len(pairs))
    columns: dict[str, Any] = {"sub_id": subs.ids}
    for i in range(width):
        columns[f"attr{i}"] = pa.array([r[i][0] if i < len(r) else None for r in rows], pa.string())
        columns[f"value{i}"] = pa.array([r[i][1] if i < len(r) else None for r in rows], pa.string())
    return pa.table(columns)


def join_baseline(spark: SparkSession, events: DataFrame, subs: Subscriptions) -> DataFrame:
    """The broadcast-hash-join formulation of the same match (W1-like filters only), as (event_id, sub_id)."""
    from pyspark.sql import functions as F

    table = _baseline_table(subs)
    width = (table.num_columns - 1) // 2
    attrs = [c for c in events.columns if c in subs.fields and c != "event_id"]
    types = dict(events.dtypes)
    bad = [c for c in attrs if types[c] != "string"]
    if bad:
        raise FlowbusError(f"the join baseline takes string attributes only; {', '.join(bad)} are not")
    pairs = [x for c in attrs for x in (F.lit(c), F.col(c))]
    exploded = events.select(
        "event_id", F.create_map(*pairs).alias("m"), F.explode(F.create_map(*pairs)).alias("k", "v")
    ).where(F.col("v").isNotNull())
    subs_df = F.broadcast(spark.createDataFrame(table))
    cond = (exploded["k"] == subs_df["attr0"]) & (exploded["v"] == subs_df["value0"])
    for i in range(1, width):
        a, v = subs_df[f"attr{i}"], subs_df[f"value{i}"]
        cond = cond & (a.isNull() | (F.try_element_at(exploded["m"], a) == v))
    return exploded.join(subs_df, cond, "inner").select("event_id", "sub_id")
