"""Event logs on disk: the input log an engine streams from, written with Arrow (no Spark).

How it works: an event log (:mod:`flowbus.flow.plan`) is a directory of
Parquet files, each row one event: ``_point``, ``_order`` (``[seq]`` in the
input log, as bytes: :func:`order_key`) and one struct column per point. :class:`InputLog` is the
ingestion side: events published at the rewritten graph's publication points
(under their own names or the names of the original graph: ``combined`` for
``combined.pub``) are checked against the point's schema, numbered in arrival
order (the *ingestion sequence*, which defines per-key order) and written in
files of ``batch_events`` events. A file is written under a temporary name
and renamed, so a streaming reader never sees half a file, and files get
increasing modification times, so a reader taking one file per micro-batch
takes them in order. Sources are a generator (``input:`` in the spec) or
directories of JSON lines / Parquet files, one per publication point, read in
file name order.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flowbus.errors import FlowbusError, FlowError
from flowbus.flow.graph import EventSpace, Graph
from flowbus.flow.plan import Log
from flowbus.model import Schema

__all__ = [
    "ARROW_TYPES",
    "ROW_GROUP",
    "InputLog",
    "arrow_schema",
    "order_key",
    "read_source_dir",
    "struct_type",
]

ARROW_TYPES: Mapping[type, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
}


ROW_GROUP = 131_072
"""Rows per Parquet row group in an event log's files: Spark splits a file between tasks by bytes,
a row group going to the split holding its middle, so a file of one row group is scanned by one
task; row groups of this size spread a micro-batch's scans over every core."""


def order_key(*parts: int) -> bytes:
    """An ``_order`` (a list of numbers >= 0) as bytes, 8 big-endian bytes a number: the bytes compare
    as the lists do (a prefix first), and a fixed-width binary column is cheaper than a list column."""
    return struct.pack(f">{len(parts)}Q", *parts)


def struct_type(schema: Schema) -> pa.StructType:
    return pa.struct([(name, ARROW_TYPES[kind]) for name, kind in schema.fields.items()])


def arrow_schema(g: Graph, log: Log) -> pa.Schema:
    """The Arrow schema of ``log``'s files."""
    fields = [pa.field("_point", pa.string()), pa.field("_order", pa.binary())]
    fields += [pa.field(log.column(p), struct_type(g.event_space(p).schema)) for p in log.points]
    return pa.schema(fields)


class InputLog:
    """The input log of rewritten graph ``g`` in ``directory``: publish, then :meth:`flush` per batch."""

    def __init__(self, g: Graph, log: Log, directory: Path, *, batch_events: int) -> None:
        if batch_events < 1:
            raise FlowError(f"batch_events must be at least 1, got {batch_events}")
        self.graph = g
        self.log = log
        self.directory = directory
        self.batch_events = batch_events
        self.schema = arrow_schema(g, log)
        self.entries: dict[str, EventSpace] = {}
        for p in log.points:
            space = g.event_space(p)
            self.entries[p] = space
            if p.endswith(".pub"):
                self.entries.setdefault(p[: -len(".pub")], space)
        self.seq = 0
        self.files = 0
        self._rows: list[dict[str, Any]] = []
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FlowError(f"cannot create {str(directory)!r}: {exc.strerror or exc}") from None
        self.files = len(list(directory.glob("part-*.parquet")))

    def publish(self, space: str, event: Mapping[str, Any]) -> None:
        """Check ``event`` against the schema of publication point ``space`` and append it."""
        target = self.entries.get(space)
        if target is None:
            points = ", ".join(self.log.points)
            raise FlowError(f"{space!r} is not a publication point (publication points: {points})")
        try:
            ev = target.schema.validate(event)
        except FlowbusError as exc:
            raise FlowError(f"event published to {space!r}: {exc}") from None
        self._rows.append(
            {"_point": target.name, "_order": order_key(self.seq), self.log.column(target.name): ev}
        )
        self.seq += 1
        if len(self._rows) >= self.batch_events:
            self.flush()

    def publish_all(self, events: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        n = 0
        for space, event in events:
            self.publish(space, event)
            n += 1
        self.flush()
        return n

    def flush(self) -> Path | None:
        """Write the buffered events as the next file (None when there are none)."""
        if not self._rows:
            return None
        table = pa.Table.from_pylist(self._rows, schema=self.schema)
        path = self.directory / f"part-{self.files:06d}.parquet"
        tmp = self.directory / f".part-{self.files:06d}.parquet.tmp"
        pq.write_table(table, tmp, row_group_size=ROW_GROUP)
        # one second apart: a file source orders files by modification time
        stamp = 1_000_000_000 + self.files
        os.utime(tmp, (stamp, stamp))
        tmp.replace(path)
        self.files += 1
        self._rows = []
        return path


def read_source_dir(directory: Path, done: set[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name, event) for the events of the ``.jsonl``/``.json``/``.parquet`` files in ``directory``.

    Files are read in name order; names in ``done`` are skipped (and added once read).
    """
    if not directory.is_dir():
        raise FlowError(f"source directory {str(directory)!r} does not exist")
    for path in sorted(directory.iterdir()):
        if path.name.startswith((".", "_")) or (done is not None and path.name in done):
            continue
        if path.suffix in (".jsonl", ".json"):
            with path.open(encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        ev = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise FlowError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
                    if not isinstance(ev, dict):
                        raise FlowError(f"{path}:{lineno}: an event is a JSON object")
                    yield path.name, {k: v for k, v in ev.items() if v is not None}
        elif path.suffix == ".parquet":
            for row in pq.read_table(path).to_pylist():
                yield path.name, {k: v for k, v in row.items() if v is not None}
        else:
            continue
        if done is not None:
            done.add(path.name)
