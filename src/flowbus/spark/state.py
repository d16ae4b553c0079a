"""The per-key fold of a stateful group, and the Arrow function that runs it on Spark's workers.

How it works: :class:`GroupFolder` folds a key's events, in ``_order``, into the
rows of the group's collapses and, on every change, asks each expand arc's
:class:`~flowbus.flow.local.Deliverer` what to send its subscriber -- the
reference interpreter's own code, so the Spark engine delivers what it does.
:class:`ArrowFold` is what ``groupBy(key).cogroup(state.groupBy(key)).applyInArrow``
calls once per key and micro-batch: the key's new events and its stored state
(one pickled row: the rows of the group's collapses and the rows its expand
arcs last delivered) come in as Arrow tables, the derived events and the new
state go out as one. Arrow in and out, no Row objects and no state-store round
trips per key (:mod:`flowbus.spark.groups` keeps the state table). This module
is what a Python worker imports, so it imports little: a worker that starts
slowly on a busy machine misses the JVM's connect-back deadline.
"""

from __future__ import annotations

import heapq
import os
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowbus.errors import Undefined
from flowbus.flow.collapse import BoundRules, Key
from flowbus.flow.collapse import Row as StateRow
from flowbus.flow.eventlog import order_key
from flowbus.flow.graph import Collapse, Expand, Graph
from flowbus.flow.local import Deliverer
from flowbus.flow.plan import Log, StatefulGroup
from flowbus.flow.validate import bind_rules
from flowbus.spark.columnfold import ColumnFold
from flowbus.spark.vectorfold import VectorFold

__all__ = ["ArrowFold", "GroupFolder", "PartitionFold", "SparkFold"]


class SparkFold:
    """One collapse arc of a group, bound, with the deliverers of the expand arcs out of its state."""

    def __init__(self, g: Graph, arc: Collapse, targets: Sequence[str]) -> None:
        self.name = arc.name
        self.bound: BoundRules = bind_rules(g, arc)
        self.deliverers: list[tuple[Deliverer, int, list[str], list[type]]] = []
        for e in g.out_arcs(arc.target):
            assert isinstance(e, Expand)
            schema = g.event_space(e.target).schema
            self.deliverers.append(
                (
                    Deliverer(g, e, arc),
                    targets.index(e.target),
                    list(schema.fields),
                    list(schema.fields.values()),
                )
            )


class GroupFolder:
    """The per-key fold of a stateful group: what :class:`ArrowFold` runs for each key.

    :meth:`fold` takes the key's stored state (the rows of its collapses, the
    rows its expand arcs last delivered), the key's new events and returns the
    new state and the derived events, each ``(target index, _order, event)``,
    in ``_order``. A collapse of plain aggregates is folded over all the events
    at once (:class:`~flowbus.spark.vectorfold.VectorFold`), the others event by
    event. Pure Python and numpy: :class:`ArrowFold` wraps it, tests call it directly.
    """

    def __init__(self, g: Graph, group: StatefulGroup) -> None:
        self.fields = list(g.event_space(group.space).schema.fields)
        self.folds = [SparkFold(g, arc, group.targets) for arc in group.collapses]
        self.vectors = [VectorFold.of(f.name, f.bound, f.deliverers, i) for i, f in enumerate(self.folds)]

    def fold(
        self,
        stored: tuple[dict[str, StateRow], dict[str, StateRow]] | None,
        events: Iterable[tuple[bytes, dict[str, Any]]],
    ) -> tuple[tuple[dict[str, StateRow], dict[str, StateRow]], list[tuple[int, bytes, dict[str, Any]]]]:
        rows, last = stored if stored is not None else ({}, {})
        ordered = sorted(events, key=lambda oe: oe[0])
        outs: list[list[tuple[int, bytes, dict[str, Any]]]] = []
        one_by_one: list[tuple[int, SparkFold]] = []
        for position, (fold, vector) in enumerate(zip(self.folds, self.vectors, strict=True)):
            got = vector.run(fold.bound.key_of, rows, last, ordered, fold.bound.initial) if vector else None
            if got is None:
                one_by_one.append((position, fold))
            else:
                outs.append(got)
        if one_by_one:
            outs.append(self._one_by_one(one_by_one, rows, last, ordered))
        out = outs[0] if len(outs) == 1 else list(heapq.merge(*outs, key=lambda d: d[1]))
        return (rows, last), out

    @staticmethod
    def _one_by_one(
        folds: list[tuple[int, SparkFold]],
        rows: dict[str, StateRow],
        last: dict[str, StateRow],
        events: list[tuple[bytes, dict[str, Any]]],
    ) -> list[tuple[int, bytes, dict[str, Any]]]:
        out: list[tuple[int, bytes, dict[str, Any]]] = []
        for order, ev in events:
            for position, fold in folds:
                bound = fold.bound
                try:
                    key: Key = bound.key_of(ev)
                except Undefined:
                    continue
                old = rows.get(fold.name, bound.initial)
                new = bound.step(key, old, ev)
                if new is None or new == old:
                    continue
                rows[fold.name] = new
                k = 0
                for deliverer, target, names, kinds in fold.deliverers:
                    name = deliverer.arc.name
                    had = last.get(name, deliverer.bound.initial)
                    now, events_out = deliverer.events(key, had, old, new, ev)
                    if not events_out:
                        continue
                    last[name] = now
                    for e in events_out:
                        fixed = {
                            n: float(e[n]) if t is float else e[n] for n, t in zip(names, kinds, strict=True)
                        }
                        out.append((target, order + order_key(position, k), fixed))
                        k += 1
        return out


class ArrowFold:
    """One micro-batch of a stateful group, per key: what ``groupBy(...).cogroup(...).applyInArrow`` runs.

    Called with a key's new events (``_order`` and the space's fields) and its
    stored state (at most one row: the pickled rows of the group's collapses and
    the rows its expand arcs last delivered), it folds the events with
    :class:`GroupFolder` and returns one table of the derived events (the group's
    log columns) and the key's new state (a row whose ``_point`` is null).
    """

    def __init__(
        self, graph: Graph, group: StatefulGroup, log: Log, out: pa.Schema, keys: Sequence[str]
    ) -> None:
        self.graph = graph
        self.group = group
        self.log = log
        self.out = out
        self.keys = list(keys)
        self._folder: GroupFolder | None = None
        self._columns: ColumnFold | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_folder", "_columns")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._folder = None
        self._columns = None

    def __call__(self, key: tuple[pa.Scalar, ...], events: pa.Table, stored: pa.Table) -> pa.Table:
        values = [k.as_py() for k in key]
        blob = stored.column("_state")[0].as_py() if stored.num_rows else None
        derived, state = self.fold_key(values, events, blob)
        tail = self._rows([], values, state)
        return tail if derived is None else pa.concat_tables([derived, tail])

    def fold_key(
        self, key: Sequence[Any], events: pa.Table, blob: bytes | None
    ) -> tuple[pa.Table | None, bytes | None]:
        """Key ``key``'s derived events (rows of ``out``, None when there are none) and new pickled
        state, from its stored state ``blob`` (None: none yet) over ``events``."""
        if self._folder is None:  # built once per Python worker
            self._folder = GroupFolder(self.graph, self.group)
            self._columns = ColumnFold.of(self.graph, self.group, self.log, self._folder.folds, self.out)
        folder = self._folder
        if not events.num_rows:  # no new event: the key's state stays as it was
            return None, blob
        if self._columns is not None:
            got = self._columns.fold(pickle.loads(blob) if blob is not None else None, events)
            if got is not None:
                state, derived = got
                return derived, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        fields = folder.fields
        columns = [events.column(f).to_pylist() for f in fields]
        batch = [
            (order, {f: v for f, v in zip(fields, row, strict=True) if v is not None})
            for order, *row in zip(events.column("_order").to_pylist(), *columns, strict=True)
        ]
        state, out = folder.fold(pickle.loads(blob) if blob is not None else None, batch)
        rows = self._rows(out, list(key), None) if out else None
        return rows, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def _rows(
        self, derived: list[tuple[int, bytes, dict[str, Any]]], key: list[Any], blob: bytes | None
    ) -> pa.Table:
        """The derived events, then the key's state row (none if the key has no state)."""
        n, tail = len(derived), [None] * (blob is not None)
        targets = self.group.targets
        columns: dict[str, list[Any]] = {
            "_point": [targets[t] for t, _, _ in derived] + tail,
            "_order": [o for _, o, _ in derived] + tail,
            "_state": [None] * n + ([blob] if blob is not None else []),
        }
        for point in self.log.points:
            t = targets.index(point)
            columns[self.log.column(point)] = [e if to == t else None for to, _, e in derived] + tail
        for k, v in zip(self.keys, key, strict=True):
            columns[k] = [None] * n + ([v] if blob is not None else [])
        return pa.Table.from_arrays([pa.array(columns[f.name], f.type) for f in self.out], schema=self.out)


class PartitionFold:
    """One partition of a group's micro-batch, folded and written where it is: what ``mapInArrow`` runs.

    Its rows are the micro-batch's events and the group's stored state (rows
    whose ``_state`` is set), repartitioned by key, so each key's events and
    state are in one partition. The events are grouped by key with numpy, each
    key folded by :class:`ArrowFold`; the derived events are written as
    ``log_dir/part-<partition>.parquet`` (schema ``log_schema``, row groups of
    ``row_group`` rows) and every key's new state (the stored one for a key
    without events) as ``state_dir/part-<partition>.parquet``, each under a
    hidden temporary name first and renamed. A task run again writes the same
    rows to the same names. It returns one small row: the partition, the
    derived events and the keys it wrote.
    """

    SUMMARY = pa.schema([("partition", pa.int64()), ("derived", pa.int64()), ("keys", pa.int64())])

    def __init__(
        self, fold: ArrowFold, log_dir: str, state_dir: str, log_schema: pa.Schema, row_group: int
    ) -> None:
        self.fold = fold
        self.log_dir = log_dir
        self.state_dir = state_dir
        self.log_schema = log_schema
        self.row_group = row_group

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        task = TaskContext.get()
        partition, attempt = (task.partitionId(), task.taskAttemptId()) if task is not None else (0, 0)
        yield self.run(list(batches), partition, attempt)

    def run(self, batches: list[pa.RecordBatch], partition: int, attempt: int) -> pa.RecordBatch:
        """Fold and write ``batches`` (partition ``partition``); the summary row."""
        derived, keys = 0, 0
        if batches:
            table = pa.Table.from_batches(batches)
            has_state = pc.is_valid(table.column("_state"))
            tables, state = self._fold(table.filter(pc.invert(has_state)), table.filter(has_state))
            if tables:
                out = pa.concat_tables(tables).select(self.log_schema.names).cast(self.log_schema)
                derived = out.num_rows
                self._write(out, self.log_dir, partition, attempt)
            keys = state.num_rows
            if keys:
                self._write(state, self.state_dir, partition, attempt)
        return pa.RecordBatch.from_pylist(
            [{"partition": partition, "derived": derived, "keys": keys}], schema=self.SUMMARY
        )

    def _fold(self, events: pa.Table, stored: pa.Table) -> tuple[list[pa.Table], pa.Table]:
        """The derived events of each key of ``events``, and the table of every key's state."""
        names = self.fold.keys
        blobs = stored.column("_state").to_pylist()
        keys = zip(*(stored.column(k).to_pylist() for k in names), strict=True)
        state = dict(zip(keys, blobs, strict=True))
        tables: list[pa.Table] = []
        if events.num_rows:
            codes = _key_codes([events.column(k) for k in names])
            ordered = events.take(pa.array(np.argsort(codes, kind="stable")))
            counts = np.bincount(codes)
            starts = np.cumsum(counts) - counts
            for start, n in zip(starts.tolist(), counts.tolist(), strict=True):
                if not n:
                    continue
                rows = ordered.slice(start, n)
                key = tuple(rows.column(k)[0].as_py() for k in names)
                got, state[key] = self.fold.fold_key(key, rows, state.get(key))
                if got is not None:
                    tables.append(got)
        kept = [(key, blob) for key, blob in state.items() if blob is not None]
        arrays = [
            pa.array([key[i] for key, _ in kept], stored.schema.field(k).type) for i, k in enumerate(names)
        ]
        arrays.append(pa.array([blob for _, blob in kept], pa.binary()))
        return tables, pa.Table.from_arrays(arrays, names=[*names, "_state"])

    def _write(self, table: pa.Table, directory: str, partition: int, attempt: int) -> None:
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".part-{partition:05d}-{attempt}.tmp")
        pq.write_table(table, tmp, row_group_size=self.row_group)
        os.replace(tmp, os.path.join(directory, f"part-{partition:05d}.parquet"))


def _key_codes(columns: Sequence[pa.ChunkedArray]) -> np.ndarray:
    """One number per row, equal where the rows' key values are (null included), from 0 up."""
    codes: np.ndarray | None = None
    for column in columns:
        encoded = pc.dictionary_encode(column.combine_chunks())
        # (a null value has a null index: code 0, the others 1 up)
        c = np.asarray(pc.fill_null(pc.add(encoded.indices.cast(pa.int64()), 1), 0))
        if codes is None:
            codes = c
        else:
            codes = np.unique(codes * (int(c.max()) + 1) + c, return_inverse=True)[1].astype(np.int64)
    assert codes is not None
    return codes
