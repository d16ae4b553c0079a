"""The per-key fold of a stateful group, and the ``transformWithState`` processor that runs it.

How it works: :class:`GroupFolder` folds a key's events, in ``_order``, into the
rows of the group's collapses and, on every change, asks each expand arc's
:class:`~flowbus.flow.local.Deliverer` what to send its subscriber -- the
reference interpreter's own code, so the Spark engine delivers what it does.
:class:`StateProcessor` keeps a key's rows (and the rows its expand arcs last
delivered) in one ``ValueState`` and emits the derived events as rows of the
group's event log. This module is what a ``transformWithState`` worker
imports, so it imports little: a Python worker that starts slowly on a busy
machine misses the JVM's connect-back deadline.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StructField, StructType

from flowbus.filters.ast import Undefined
from flowbus.flow.collapse import BoundRules, Key
from flowbus.flow.collapse import Row as StateRow
from flowbus.flow.graph import Collapse, Expand, Graph
from flowbus.flow.local import Deliverer
from flowbus.flow.plan import Log, StatefulGroup
from flowbus.flow.validate import bind_rules

__all__ = ["Fold", "GroupFolder", "StateProcessor"]


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
    """The per-key fold of a stateful group: what ``transformWithState`` runs for each key.

    :meth:`fold` takes the key's stored state (the rows of its collapses, the
    rows its expand arcs last delivered), the key's new events and returns the
    new state and the derived events, each ``(target index, _order, event)``.
    Pure Python: the state processor wraps it, and tests call it directly.
    """

    def __init__(self, g: Graph, group: StatefulGroup) -> None:
        self.fields = list(g.event_space(group.space).schema.fields)
        self.folds = [Fold(g, arc, group.targets) for arc in group.collapses]

    def fold(
        self,
        stored: tuple[dict[str, StateRow], dict[str, StateRow]] | None,
        events: Iterable[tuple[list[int], dict[str, Any]]],
    ) -> tuple[tuple[dict[str, StateRow], dict[str, StateRow]], list[tuple[int, list[int], dict[str, Any]]]]:
        rows, last = stored if stored is not None else ({}, {})
        out: list[tuple[int, list[int], dict[str, Any]]] = []
        for order, ev in sorted(events, key=lambda oe: oe[0]):
            for position, fold in enumerate(self.folds):
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
                        out.append((target, [*order, position, k], fixed))
                        k += 1
        return (rows, last), out


class StateProcessor(StatefulProcessor):
    """``transformWithState`` over one stateful group (its folder is built on the executor)."""

    def __init__(self, graph: Graph, group: StatefulGroup, log: Log) -> None:
        self.graph = graph
        self.group = group
        self.log = log

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("fold", StructType([StructField("data", BinaryType())]))
        self.folder = GroupFolder(self.graph, self.group)
        self.columns = [self.log.column(t) for t in self.group.targets]

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        fields = self.folder.fields
        events = [(list(r["_order"]), {f: r[f] for f in fields if r[f] is not None}) for r in rows]
        got = self.state.get()
        stored = pickle.loads(got[0]) if got is not None else None
        state, out = self.folder.fold(stored, events)
        self.state.update((pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL),))
        results = []
        for target, order, ev in out:
            cols: dict[str, Any] = dict.fromkeys(self.columns)
            cols[self.columns[target]] = Row(**ev)
            results.append(Row(_point=self.group.targets[target], _order=order, **cols))
        return iter(results)

    def close(self) -> None:
        pass
