"""A key's micro-batch of a stateful group folded over its Arrow columns: rule kernels, answers from arrays.

How it works: :class:`ColumnFold` serves a group whose every collapse compiles
to a :class:`~flowbus.spark.kernel.RuleKernel` and whose every expand arc is
answered from the rows alone, as :class:`~flowbus.flow.local.Deliverer` answers:

* an expand that *replays* its collapse (the same rules) sends, on every change
  of the components it tracks, the cause itself -- the event's own fields --
  provided the subscriber had the row from before the batch (else the key is
  folded by the interpreter's code);
* an expand whose first rule has no ``when`` and sets every component it tracks
  from an event field of its own (the stock example's ``drop_events``) sends the
  one event read off the goal row: the key's fields and the new components, which
  is what the expand search (:func:`~flowbus.flow.expand.expand_key`) finds first
  and returns -- here without the search.

The key's events are sorted by ``_order`` (byte strings of one length, read as
rows of big-endian numbers), each collapse's kernel gives the row after every event, and the
derived events are numbered as :class:`~flowbus.spark.state.GroupFolder` numbers
them (``[*order, collapse position, k]``, ``k`` counting the collapse's events
for one cause over its expand arcs). :meth:`ColumnFold.fold` returns None --
fold the key with the interpreter's code, nothing changed -- on a null in a
column it needs, ``_order`` keys of several lengths, or whatever a kernel
declines (a NaN, an int past 2**53).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from flowbus.filters.ast import Field, Filter
from flowbus.flow.collapse import BoundRules, Key
from flowbus.flow.collapse import Row as StateRow
from flowbus.flow.expand import expander
from flowbus.flow.graph import Graph
from flowbus.flow.local import Deliverer
from flowbus.flow.plan import Log, StatefulGroup
from flowbus.spark.kernel import RuleKernel


class FoldPlan(Protocol):
    """What a column fold reads of one collapse arc's fold (:class:`~flowbus.spark.state.SparkFold`):
    its name, its bound rules, and the deliverers of the expand arcs out of its state."""

    @property
    def name(self) -> str: ...
    @property
    def bound(self) -> BoundRules: ...
    @property
    def deliverers(self) -> Sequence[tuple[Deliverer, int, list[str], list[type]]]: ...


__all__ = ["ColumnFold"]

State = tuple[dict[str, StateRow], dict[str, StateRow]]


@dataclass(frozen=True, slots=True)
class _Piece:
    """The events one expand arc sends: after the key's events ``rows`` (positions in ``_order``), each
    numbered ``[*order, position, k]``, with their fields."""

    point: str
    rows: np.ndarray
    position: int
    k: np.ndarray
    fields: dict[str, pa.Array]


class _Sender:
    """One expand arc answered from arrays: the cause's fields (``replay``) or the goal's (``direct``)."""

    def __init__(self, deliverer: Deliverer, point: str) -> None:
        self.deliverer = deliverer
        self.point = point
        self.replay = deliverer.shortcut
        x = expander(deliverer.bound)
        self.keyed = {name: pos for name, _kind, pos in x.key_fields}
        self.params = {field: col for col, field, _kind in x.shapes[0].params}

    @staticmethod
    def of(g: Graph, deliverer: Deliverer, point: str) -> _Sender | None:
        """The sender of ``deliverer`` (its subscriber at ``point``), or None when it needs the search."""
        if deliverer.shortcut:
            return _Sender(deliverer, point)
        bound = deliverer.bound
        x = expander(bound)
        shape = x.shapes[0]
        if bound.ruleset.rules[0].when != Filter.true() or shape.other or shape.consts or shape.keyed:
            return None
        fields = [f for _, f, _ in shape.params]
        whole = (1 << len(bound.components)) - 1
        if shape.mask != whole or len(set(fields)) != len(fields):
            return None
        if len(x.key_fields) + len(fields) != len(bound.event):
            return None
        state = g.state_space(deliverer.arc.source).schema
        if any(state.type_of(bound.components[col]) is not kind for col, _, kind in shape.params):
            return None
        return _Sender(deliverer, point)

    def sends(self, projected: np.ndarray, changed: np.ndarray, had: np.ndarray) -> np.ndarray:
        """Where the subscriber is sent an event: a change of the row moving what it tracks (``projected``,
        after each event) away from what it last had (``had`` up to the first change)."""
        before = np.vstack([had[None, :], projected[:-1]])
        first = np.flatnonzero(changed)
        if first.size:
            before[: first[0] + 1] = had
        sent: np.ndarray = changed & (projected != before).any(axis=1)
        return sent

    def fields(
        self, rows: np.ndarray, goal: np.ndarray, key: Key, events: pa.Table, struct: pa.StructType
    ) -> dict[str, pa.Array]:
        """The sent events' fields, after the events at ``rows`` whose projected rows are ``goal``."""
        out: dict[str, pa.Array] = {}
        take = pa.array(rows)
        for f in struct:
            if self.replay:
                out[f.name] = events.column(f.name).take(take).combine_chunks().cast(f.type)
            elif f.name in self.keyed:
                out[f.name] = pa.array([key[self.keyed[f.name]]] * len(rows)).cast(f.type)
            else:
                out[f.name] = pa.array(goal[:, self.params[f.name]]).cast(f.type)
        return out


@dataclass(frozen=True, slots=True)
class _Collapse:
    """One collapse of the group: its name, initial row, kernel and the senders of its expand arcs."""

    name: str
    initial: StateRow
    kernel: RuleKernel
    senders: list[_Sender]
    position: int


class ColumnFold:
    """A group's per-key fold over Arrow columns, rows of schema ``out`` (see the module notes)."""

    def __init__(self, log: Log, collapses: list[_Collapse], keys: list[str], out: pa.Schema) -> None:
        self.log = log
        self.collapses = collapses
        self.key_fields = keys
        self.out = out
        needed = {f for c in collapses for f in c.kernel.reads} | set(keys)
        needed |= {f.name for c in collapses for s in c.senders if s.replay for f in self._struct(s.point)}
        self.needed = sorted(needed)

    @staticmethod
    def of(
        g: Graph, group: StatefulGroup, log: Log, folds: Sequence[FoldPlan], out: pa.Schema
    ) -> ColumnFold | None:
        """The column fold of ``group`` (its collapses ``folds``), or None when one is not served so."""
        space = g.event_space(group.space).schema
        keys = [e.name for _, e in group.key if isinstance(e, Field)]
        if len(keys) != len(group.key) or any(space.type_of(k) not in (str, int, bool) for k in keys):
            return None
        collapses = []
        for position, (arc, fold) in enumerate(zip(group.collapses, folds, strict=True)):
            kernel = RuleKernel.of(fold.bound, g.state_space(arc.target).schema)
            if kernel is None or [e for _, e in fold.bound.ruleset.key] != [e for _, e in group.key]:
                return None
            senders = [_Sender.of(g, d, group.targets[t]) for d, t, _, _ in fold.deliverers]
            if any(s is None for s in senders):
                return None
            ok = [s for s in senders if s is not None]
            collapses.append(_Collapse(fold.name, fold.bound.initial, kernel, ok, position))
        return ColumnFold(log, collapses, keys, out)

    def _struct(self, point: str) -> pa.StructType:
        struct: pa.StructType = self.out.field(self.log.column(point)).type
        return struct

    def fold(self, stored: State | None, events: pa.Table) -> tuple[State, pa.Table | None] | None:
        """The key's new state and derived events (rows of ``out``, None when there are none) from
        ``stored`` over ``events`` (``_order`` and the space's fields); None: fold them with the
        interpreter's code (nothing changed)."""
        if any(events.column(f).null_count for f in self.needed):
            return None
        orders = _orders(events.column("_order"))
        if orders is None:
            return None
        perm = np.lexsort(orders.T[::-1])
        events = events.take(pa.array(perm))
        orders = orders[perm]
        key: Key = tuple(events.column(f)[0].as_py() for f in self.key_fields)
        rows, last = (dict(stored[0]), dict(stored[1])) if stored is not None else ({}, {})
        pieces: list[_Piece] = []
        for c in self.collapses:
            got = self._collapse(c, rows, last, key, events)
            if got is None:
                return None
            pieces += got
        return (rows, last), self._table(pieces, orders)

    def _collapse(
        self, c: _Collapse, rows: dict[str, StateRow], last: dict[str, StateRow], key: Key, events: pa.Table
    ) -> list[_Piece] | None:
        start = rows.get(c.name, c.initial)
        got = c.kernel.run({f: events.column(f).to_numpy() for f in c.kernel.reads}, events.num_rows, start)
        if got is None:
            return None
        after, changed, ints = got
        if not changed.any():
            return []
        rows[c.name] = c.kernel.row(after[-1], ints)
        sends = []
        for s in c.senders:
            d = s.deliverer
            had = last.get(d.arc.name, d.bound.initial)
            if s.replay and had != d.project(start):
                return None  # the cause is the answer only from the row before it
            sent = s.sends(after[:, d.index], changed, np.asarray(had, dtype=np.float64))
            if sent.any():
                last[d.arc.name] = d.project(rows[c.name])
            sends.append(sent)
        numbers = np.cumsum(np.vstack(sends), axis=0) - 1
        pieces = []
        for s, sent, k in zip(c.senders, sends, numbers, strict=True):
            at = np.flatnonzero(sent)
            if at.size:
                fields = s.fields(at, after[at][:, s.deliverer.index], key, events, self._struct(s.point))
                pieces.append(_Piece(s.point, at, c.position, k[at], fields))
        return pieces

    def _table(self, pieces: Sequence[_Piece], orders: np.ndarray) -> pa.Table | None:
        if not pieces:
            return None
        tables = [self._piece(p, orders) for p in pieces]
        rows = np.concatenate([p.rows for p in pieces])
        position = np.concatenate([np.full(len(p.rows), p.position) for p in pieces])
        k = np.concatenate([p.k for p in pieces])
        return pa.concat_tables(tables).take(pa.array(np.lexsort((k, position, rows))))

    def _piece(self, p: _Piece, orders: np.ndarray) -> pa.Table:
        n, width = len(p.rows), (orders.shape[1] + 2) * 8
        numbers = np.column_stack([orders[p.rows], np.full(n, p.position), p.k]).astype(">u8")
        offsets = pa.py_buffer(np.arange(0, n * width + 1, width, dtype=np.int32).tobytes())
        columns: dict[str, pa.Array] = {
            "_point": pa.array([p.point] * n, pa.string()),
            "_order": pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(numbers.tobytes())]),
        }
        struct = self._struct(p.point)
        columns[self.log.column(p.point)] = pa.StructArray.from_arrays(
            [p.fields[f.name] for f in struct], fields=list(struct)
        )
        arrays = [
            columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in self.out
        ]
        return pa.Table.from_arrays(arrays, schema=self.out)


def _orders(column: pa.ChunkedArray) -> np.ndarray | None:
    """The ``_order`` keys as the rows of one matrix of numbers (None when their lengths differ)."""
    keys = column.combine_chunks()
    if keys.type != pa.binary():
        return None
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)[keys.offset : keys.offset + len(keys) + 1]
    lengths = np.diff(offsets)
    width = int(lengths[0]) if lengths.size else 0
    if (lengths != width).any() or width % 8:
        return None
    data = np.frombuffer(keys.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return data.view(">u8").astype(np.uint64).reshape(len(keys), width // 8)
