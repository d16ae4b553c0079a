"""Bulk matching on Spark: an event table against a subscription table, written as (event_id, sub_id) pairs.

How it works:

1. The subscriptions (Parquet, JSON lines or CSV with columns ``sub_id`` and
   ``filter``, the filter in the text form) are read on the driver with pyarrow
   and parsed. Plain conjunctions of comparisons with string or integer
   constants, each attribute once (``a3 = "v7" & a9 = "v1"``, all a W1 workload
   holds), never become Python objects one by one: Arrow kernels cut every text
   at ``&`` and dictionary-encode the trimmed comparisons over the whole column,
   only the *distinct* comparisons are read by a regular expression (two
   thousand in a million W1 filters), and the rows are kept in columnar form
   (:class:`PlainConjunctions`: predicate codes per row). Anything else goes
   row by row through the same regular expression or the full LALR parser
   (:func:`flowbus.filters.parse`, ~0.2 ms a filter). Either way a row means
   what ``parse`` makes of it (a test checks it), and a bad row is reported with
   its row number before anything is started.
2. One :class:`~flowbus.matching.Matcher` (clustering strategy: about four times
   the counting strategy's throughput on W1 at a million subscriptions) is
   built on the driver -- the columnar rows in one
   :meth:`~flowbus.matching.Matcher.add_conjunctions` call, with array
   operations -- then pickled and broadcast (a classic session) or shipped
   inside the task (Spark Connect has no broadcast variables). Many
   subscriptions are never one giant OR of Column filters: Catalyst overflows
   its stack near a thousand of them. A million W1 subscriptions take about 4 s
   to read, index and pickle (32 s when every filter was an object).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowbus.errors import FilterError, InputError, UserError
from flowbus.filters import Conjunction, Filter, Op, Predicate, parse
from flowbus.matching import Matcher, Strategy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BulkResult",
    "PlainConjunctions",
    "Shipped",
    "Subscriptions",
    "build_matcher",
    "bulk_match",
    "check_out",
    "event_format",
    "executor_matcher",
    "join_baseline",
    "match_events",
    "pairs_of",
    "parse_filter",
    "read_events",
    "read_subscriptions",
    "ship",
]

T = TypeVar("T")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
_KEYWORDS = frozenset(
    {"and", "or", "not", "in", "prefix", "suffix", "contains", "exists", "between", "true", "false"}
)
_LIT = r'([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|=|<|>)\s*(?:"([^"\\\n\r]*)"|(-?\d+))'
_SIMPLE = re.compile(rf"\s*{_LIT}(?:\s*&\s*{_LIT})*\s*")
_ONE = re.compile(_LIT)
_PIECE = re.compile(rf"\s*{_LIT}\s*")


def _keyword(name: str) -> bool:
    """Does the grammar refuse ``name`` as an attribute? It may not start with a keyword followed by a
    word boundary: ``in``, ``TRUE``, ``and.x``."""
    return name.split(".", 1)[0].lower() in _KEYWORDS


# ------------------------------------------------------------------ subscriptions (driver side)


@dataclass(frozen=True, slots=True, eq=False)
class PlainConjunctions:
    """Subscriptions held in columnar form: row ``rows[i]``'s filter is the conjunction of the
    predicates ``predicates[k]`` for ``k`` in ``codes[offsets[i]:offsets[i + 1]]`` (what
    :meth:`flowbus.matching.Matcher.add_conjunctions` takes). The predicates are distinct and in
    literal order, and so are each row's codes."""

    rows: np.ndarray
    offsets: np.ndarray
    codes: np.ndarray
    predicates: list[Predicate]

    @staticmethod
    def empty() -> PlainConjunctions:
        return PlainConjunctions(np.empty(0, np.int64), np.zeros(1, np.int64), np.empty(0, np.int64), [])

    def filters(self) -> list[Filter]:
        """One :class:`Filter` per row (what ``parse`` makes of its text)."""
        preds, bounds, codes = self.predicates, self.offsets.tolist(), self.codes.tolist()
        return [Filter((Conjunction(tuple([preds[k] for k in codes[a:b]])),)) for a, b in pairwise(bounds)]


@dataclass(frozen=True, eq=False)
class Subscriptions:
    """Parsed subscriptions: ids (all ints or all strings), their filters, and the attributes they read.

    The plain conjunctions (all a W1 table holds) stay in columnar form (``plain``); the other
    filters are :class:`Filter` objects by row number (``other``). ``filters`` makes the object of
    every row on first use (a few seconds for a million: the bulk paths never ask for it).
    """

    ids: list[Any]
    fields: frozenset[str]
    plain: PlainConjunctions
    other: dict[int, Filter]

    @classmethod
    def of(cls, ids: list[Any], filters: list[Filter]) -> Subscriptions:
        """Subscriptions from filter objects."""
        if len(ids) != len(filters):
            raise UserError(f"{len(ids)} subscription ids for {len(filters)} filters")
        fields = frozenset().union(*(f.fields() for f in filters))
        return cls(ids, fields, PlainConjunctions.empty(), dict(enumerate(filters)))

    @property
    def int_ids(self) -> bool:
        return not self.ids or type(self.ids[0]) is int

    @cached_property
    def filters(self) -> list[Filter]:
        if not self.other:
            return self.plain.filters()
        out: list[Filter | None] = [None] * len(self.ids)
        for row, f in zip(self.plain.rows.tolist(), self.plain.filters(), strict=True):
            out[row] = f
        for row, f in self.other.items():
            out[row] = f
        return out  # type: ignore[return-value]  # every row is one or the other


class _Reader:
    """The per-row fast path of the filter text form, remembering the predicates it has built."""

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
            _keyword(name) for name, _, _, _ in found
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
    plain, _ = _read_plain(pa.chunked_array([[text]], pa.string()))
    return plain.filters()[0] if plain.rows.size else _Reader()(text)


def _split(texts: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Each text cut at ``&`` and trimmed: (pieces per row, each piece's number, the distinct pieces)."""
    distinct: dict[str, int] = {}
    lengths, entries = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for chunk in texts.chunks:
        if len(chunk) == 0:
            continue
        lists = pc.split_pattern(chunk, "&")
        lengths.append(pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64))
        pieces = pc.dictionary_encode(pc.ascii_trim_whitespace(lists.flatten()))
        local = [distinct.setdefault(t, len(distinct)) for t in pieces.dictionary.to_pylist()]
        entries.append(np.asarray(local, np.int64)[pieces.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(lengths), np.concatenate(entries), list(distinct)


def _read_plain(texts: pa.ChunkedArray) -> tuple[PlainConjunctions, np.ndarray]:
    """The columnar fast path: the rows that are plain conjunctions (``a3 = "v7" & n >= -2``, every
    attribute once, no keyword), and the row numbers of all the others (for the per-row reader).

    The texts are cut and trimmed by Arrow kernels over whole columns; only each *distinct*
    comparison is read in Python (two thousand in a million W1 filters), by the regular expression of
    the per-row fast path. A row is kept only if that path would take it too (so its filter is
    ``parse(text)``, see there) and its attributes are distinct.
    """
    n = len(texts)
    lengths, entries, distinct = _split(texts)
    canon: dict[Predicate, int] = {}
    pred_of = np.full(len(distinct) + 1, -1, np.int64)  # the last one stands for "not a comparison"
    for k, text in enumerate(distinct):
        m = _PIECE.fullmatch(text)
        if m is not None and not _keyword(m.group(1)):
            name, op, string, number = m.groups()
            p = Predicate(name, Op(op), string if number is None else int(number))
            pred_of[k] = canon.setdefault(p, len(canon))
    preds = list(canon)
    order = sorted(range(len(preds)), key=lambda k: preds[k].sort_key())
    rank = np.empty(len(preds) + 1, np.int64)
    rank[order] = np.arange(len(preds), dtype=np.int64)
    rank[-1] = -1
    names = sorted({p.attr for p in preds})
    attr_id = {name: i for i, name in enumerate(names)}
    aid_of = np.asarray([attr_id[preds[k].attr] for k in order] + [-1], np.int64)  # by rank
    code = rank[pred_of[entries]]
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    bad = np.zeros(n, np.bool_)
    bad[row[code < 0]] = True
    aid = aid_of[code]
    # a repeated attribute: the parser may fold the pair (or refuse a keyword); literal order, the
    # order to_text writes, has strictly increasing attributes and needs no sort to tell
    suspect = (row[1:] == row[:-1]) & (aid[1:] <= aid[:-1])
    if suspect.any():
        rows = np.unique(row[1:][suspect])
        mask = np.isin(row, rows) & (code >= 0)
        key = np.sort(row[mask] * max(1, len(names)) + aid[mask])
        bad[key[1:][key[1:] == key[:-1]] // max(1, len(names))] = True
    keep = ~bad[row]
    used = np.bincount(code[keep], minlength=len(preds)) > 0
    codes = (np.cumsum(used) - 1)[code[keep]]
    width = max(1, int(used.sum()))
    key = row[keep] * width + codes
    if key.size > 1 and not (key[1:] > key[:-1]).all():
        codes = np.sort(key) % width  # each row's literals in literal order (its attributes are distinct)
    ranked = [preds[k] for k in order]
    plain = PlainConjunctions(
        np.flatnonzero(~bad),
        np.concatenate([[0], np.cumsum(lengths[~bad])]).astype(np.int64),
        codes,
        [p for p, u in zip(ranked, used.tolist(), strict=True) if u],
    )
    return plain, np.flatnonzero(bad)


def _read_table(path: Path, what: str) -> pa.Table:
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    if not path.exists():
        raise InputError(f"{what} {path} does not exist")
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
        raise InputError(f"cannot read {what} {path}: {exc}") from None


def _first_null(column: pa.ChunkedArray) -> int:
    return int(np.flatnonzero(np.asarray(column.is_null()))[0])


def _sub_ids(table: pa.Table, path: Path) -> list[Any]:
    column = table.column("sub_id")
    if column.null_count:
        raise InputError(f"{path}: row {_first_null(column) + 1} has no sub_id")
    if pa.types.is_integer(column.type):
        ids: list[Any] = column.to_pylist()
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        ids = column.to_pylist()
    else:
        raise InputError(f"{path}: sub_id must hold integers or strings, not {column.type}")
    if len(set(ids)) < len(ids):
        seen: set[Any] = set()
        for row, sid in enumerate(ids, 1):
            if sid in seen:
                raise InputError(f"{path}: row {row} repeats sub_id {sid!r}")
            seen.add(sid)
    return ids


def read_subscriptions(path: Path) -> Subscriptions:
    """Read and parse a subscription table (Parquet, JSON lines or CSV; columns ``sub_id``, ``filter``)."""
    table = _read_table(path, "subscriptions")
    missing = [c for c in ("sub_id", "filter") if c not in table.column_names]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {', '.join(missing)}"
            f" (found: {', '.join(table.column_names) or 'none'})"
        )
    ids = _sub_ids(table, path)
    texts = table.column("filter")
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise InputError(f"{path}: the filter column must hold text, not {texts.type}")
    if texts.null_count:
        raise InputError(f"{path}: row {_first_null(texts) + 1} has no filter")
    plain, rest = _read_plain(texts)
    reader = _Reader()
    other: dict[int, Filter] = {}
    gc_was = gc.isenabled()
    gc.disable()  # many small filter objects: the cyclic collector would dominate
    try:
        for row, text in zip(rest.tolist(), texts.take(rest).to_pylist(), strict=True):
            try:
                other[row] = reader(text)
            except FilterError as exc:
                raise InputError(f"{path}: row {row + 1} (sub_id {ids[row]!r}): {exc}") from None
    finally:
        if gc_was:
            gc.enable()
    fields = frozenset(reader.fields | {p.attr for p in plain.predicates})
    return Subscriptions(ids, fields, plain, other)


def build_matcher(subs: Subscriptions, *, strategy: Strategy = "clustering") -> Matcher:
    """One matcher holding every subscription (the plain conjunctions installed in bulk).

    Clustering is the default: on W1 at a million subscriptions it matches about four times as
    fast as counting (each event reads one cluster per satisfied predicate instead of bumping a
    counter for every conjunction that holds the predicate).
    """
    matcher = Matcher(workers=1, strategy=strategy)
    plain = subs.plain
    ids = subs.ids if plain.rows.size == len(subs.ids) else [subs.ids[r] for r in plain.rows.tolist()]
    gc_was = gc.isenabled()
    gc.disable()
    try:
        matcher.add_conjunctions(ids, plain.offsets, plain.codes, plain.predicates)
        matcher.add_many((subs.ids[row], f) for row, f in subs.other.items())
    except FilterError as exc:
        raise InputError(f"cannot index the subscriptions: {exc}") from None
    finally:
        if gc_was:
            gc.enable()
    return matcher


# ------------------------------------------------------------------ events


def event_format(path: Path) -> str:
    """``parquet`` or ``json``: the format of an events file or directory (an error for anything else)."""
    if not path.exists():
        raise InputError(f"events {path} does not exist")
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    suffixes = {p.suffix.lower() for p in files if not p.name.startswith(("_", "."))}
    if suffixes and suffixes <= {".parquet"}:
        return "parquet"
    if suffixes and suffixes <= set(_JSON_SUFFIXES):
        return "json"
    found = ", ".join(sorted(suffixes)) or "no data files"
    raise InputError(f"events {path}: expected Parquet or JSON lines (.jsonl) files, found {found}")


def read_events(spark: SparkSession, path: Path, *, id_column: str | None = None) -> DataFrame:
    """The events as a DataFrame with an ``event_id`` (int64) column."""
    fmt = event_format(path)
    try:
        df = spark.read.parquet(str(path)) if fmt == "parquet" else spark.read.json(str(path))
        columns = df.columns
    except Exception as exc:  # Spark's errors come from the JVM or the Connect server
        raise InputError(f"cannot read events {path}: {str(exc).splitlines()[0]}") from None
    if "_corrupt_record" in columns:
        raise InputError(f"events {path}: some lines are not JSON objects")
    return _spread(spark, _with_ids(df, path, id_column))


def _with_ids(df: DataFrame, path: Path, id_column: str | None) -> DataFrame:
    from pyspark.sql import functions as F

    columns = df.columns
    if id_column is not None:
        if id_column not in columns:
            raise InputError(f"events {path}: no column {id_column!r} for the event ids")
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
class Shipped:
    """How a task finds the matcher: a broadcast of its pickle, or the pickle itself (Spark Connect)."""

    version: str
    int_ids: bool
    broadcast: Any = None
    payload: bytes | None = None

    def key(self) -> str:
        """A fresh random token per shipped matcher: it tells one broadcast (and build) from another."""
        return self.version


def _without_gc(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` with the cyclic collector off: (un)pickling a matcher makes or walks
    millions of small tuples, each batch of which would start a collection."""
    was = gc.isenabled()
    gc.disable()
    try:
        return fn(*args, **kwargs)
    finally:
        if was:
            gc.enable()


_MATCHERS: dict[str, Matcher] = {}
"""The matcher each Python worker process has unpickled (only the latest is kept)."""


def ship(
    spark: SparkSession | None, matcher: Matcher, *, int_ids: bool, remote: bool, tag: str = ""
) -> Shipped:
    """``matcher`` pickled under a fresh version: broadcast, or carried by the tasks (``remote``: Connect)."""
    data = _without_gc(pickle.dumps, matcher, protocol=pickle.HIGHEST_PROTOCOL)
    version = f"{tag}{uuid.uuid4().hex}"
    if remote or spark is None:
        return Shipped(version, int_ids, payload=data)
    return Shipped(version, int_ids, broadcast=spark.sparkContext.broadcast(data))


def executor_matcher(ref: Shipped) -> Matcher:
    """The matcher ``ref`` names, unpickled once per Python worker (only the latest is kept)."""
    matcher = _MATCHERS.get(ref.key())
    if matcher is None:
        data: bytes = ref.payload if ref.broadcast is None else ref.broadcast.value  # type: ignore[assignment]
        matcher = _without_gc(pickle.loads, data)
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


def _match_partition(batches: Iterator[pa.RecordBatch], ref: Shipped) -> Iterator[pa.RecordBatch]:
    matcher = executor_matcher(ref)
    for batch in batches:
        yield pairs_of(matcher, batch, int_ids=ref.int_ids)


def match_events(spark: SparkSession, events: DataFrame, matcher: Matcher, subs: Subscriptions) -> DataFrame:
    """The (event_id, sub_id) pairs of ``events`` (lazy: nothing runs until an action)."""
    from flowbus.spark.session import is_connect

    ref = ship(spark, matcher, int_ids=subs.int_ids, remote=is_connect(spark))
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
        raise InputError(f"output {out} exists already: give a new path")


def bulk_match(
    spark: SparkSession,
    events: Path,
    subscriptions: Path | Subscriptions,
    out: Path,
    *,
    id_column: str | None = None,
    strategy: Strategy = "clustering",
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
    matcher = build_matcher(subs, strategy=strategy)
    t2 = time.perf_counter()
    match_events(spark, df, matcher, subs).write.parquet(str(out))
    t3 = time.perf_counter()
    pairs = spark.read.parquet(str(out)).count()
    return BulkResult(str(out), len(subs.ids), pairs, t1 - t0, t2 - t1, t3 - t2)


# ------------------------------------------------------------------ the broadcast-hash-join baseline


def _baseline_table(subs: Subscriptions) -> pa.Table:
    """One row per subscription: the key equality, then the other equalities (null-padded)."""
    n = len(subs.ids)
    plain = subs.plain
    preds = list(plain.predicates)
    eq = np.asarray([p.op is Op.EQ and type(p.value) is str for p in preds], np.bool_)
    sizes = np.diff(plain.offsets)
    bad = plain.rows[
        (sizes == 0)
        | (np.bincount(np.repeat(np.arange(sizes.size), sizes)[~eq[plain.codes]], minlength=sizes.size) > 0)
    ]
    extra: dict[int, list[int]] = {}  # the rows the fast path left: their literals, numbered after the others
    for row, f in subs.other.items():
        lits = f.disjuncts[0].literals if len(f.disjuncts) == 1 else ()
        good = [
            p for p in lits
            if isinstance(p, Predicate) and p.op is Op.EQ and not p.negated and type(p.value) is str
        ]  # fmt: skip
        if not lits or len(good) < len(lits):
            bad = np.append(bad, row)
            continue
        extra[row] = list(range(len(preds), len(preds) + len(good)))
        preds += good
    if bad.size:
        sid = subs.ids[int(bad.min())]
        raise InputError(
            f"subscription {sid!r}: the join baseline takes conjunctions of string equalities only"
        )
    width = max(1, int(sizes.max()) if sizes.size else 0, max(map(len, extra.values()), default=0))
    attrs = pa.array([p.attr for p in preds], pa.string())
    values = pa.array([p.value for p in preds], pa.string())
    columns: dict[str, Any] = {"sub_id": subs.ids}
    for i in range(width):
        index = np.full(n, -1, np.int64)
        has = sizes > i
        index[plain.rows[has]] = plain.codes[plain.offsets[:-1][has] + i]
        for row, ks in extra.items():
            if i < len(ks):
                index[row] = ks[i]
        taken = pa.array(index, pa.int64(), mask=index < 0)
        columns[f"attr{i}"] = attrs.take(taken)
        columns[f"value{i}"] = values.take(taken)
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
        raise InputError(f"the join baseline takes string attributes only; {', '.join(bad)} are not")
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
