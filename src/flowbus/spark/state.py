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
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from flowbus.filters.ast import Undefined
from flowbus.flow.collapse import BoundRules, Key
from flowbus.flow.collapse import Row as StateRow
from flowbus.flow.eventlog import order_key
from flowbus.flow.graph import Collapse, Expand, Graph
from flowbus.flow.local import Deliverer
from flowbus.flow.plan import Log, StatefulGroup
from flowbus.flow.validate import bind_rules
from flowbus.spark.columnfold import ColumnFold
from flowbus.spark.vectorfold import VectorFold

__all__ = ["ArrowFold", "Fold", "GroupFolder"]


class Fold:
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
        self.folds = [Fold(g, arc, group.targets) for arc in group.collapses]
        self.vectors = [VectorFold.of(f.name, f.bound, f.deliverers, i) for i, f in enumerate(self.folds)]

    def fold(
        self,
        stored: tuple[dict[str, StateRow], dict[str, StateRow]] | None,
        events: Iterable[tuple[bytes, dict[str, Any]]],
    ) -> tuple[tuple[dict[str, StateRow], dict[str, StateRow]], list[tuple[int, bytes, dict[str, Any]]]]:
        rows, last = stored if stored is not None else ({}, {})
        ordered = sorted(events, key=lambda oe: oe[0])
        outs: list[list[tuple[int, bytes, dict[str, Any]]]] = []
        one_by_one: list[tuple[int, Fold]] = []
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
        folds: list[tuple[int, Fold]],
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
        if self._folder is None:  # built once per Python worker
            self._folder = GroupFolder(self.graph, self.group)
            self._columns = ColumnFold.of(self.graph, self.group, self.log, self._folder.folds, self.out)
        folder = self._folder
        values = [k.as_py() for k in key]
        blob = stored.column("_state")[0].as_py() if stored.num_rows else None
        if not events.num_rows:  # no new event: the key's state stays as it was
            return self._rows([], values, blob)
        if self._columns is not None:
            got = self._columns.fold(pickle.loads(blob) if blob is not None else None, events)
            if got is not None:
                state, derived = got
                tail = self._rows([], values, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
                return tail if derived is None else pa.concat_tables([derived, tail])
        fields = folder.fields
        columns = [events.column(f).to_pylist() for f in fields]
        batch = [
            (order, {f: v for f, v in zip(fields, row, strict=True) if v is not None})
            for order, *row in zip(events.column("_order").to_pylist(), *columns, strict=True)
        ]
        state, derived = folder.fold(pickle.loads(blob) if blob is not None else None, batch)
        return self._rows(derived, values, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))

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
