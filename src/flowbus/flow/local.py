"""The reference interpreter: a graph (original or rewritten) over an in-memory event stream.

How it works (000 document, sections 2 and 3): an event published at a
publication point is checked against its schema and pushed depth first through
the graph. Arriving at an event space, it is first recorded if the space is a
subscription point, then handed to the space's out-arcs in order -- collapse
arcs first (a subscription point is reached before what lies beyond it, as the
rewrite's paths are), then selects, transforms and routes. Fan-out replicates,
fan-in merges: each arc simply forwards what it produces.

* A select forwards the event itself when its compiled filter holds; a
  transform forwards a new event, or nothing when an output is undefined.
* The routes of a rewritten graph that leave one space are compiled together,
  so a subexpression they share (``NYS(issue)``, ``price*vol``) is computed once
  per event (:mod:`flowbus.filters.compile`).
* A route into a space that is no subscription point and has only collapse arcs
  out (how a rewritten graph feeds a collapse: one [S; T] path straight from a
  publication point) is fused with those collapses: its output goes directly
  into the folds, without arriving at the space, and collapses keyed by the
  same plain fields compute the key once.
* A collapse folds the event into its state (:mod:`flowbus.flow.collapse`). On
  each change of a row, every expand arc out of the state sends its subscriber
  the shortest sequence from the row it last delivered to the new one
  (:mod:`flowbus.flow.expand`) -- the event that caused the change when the
  expand replays its collapse (the same rules over the same fields), else the
  one event its first rule makes (validation accepts no other expand). A
  disconnected expand delivers nothing but keeps, per key, what it would have
  delivered -- its backlog, an equivalent sequence by construction. On
  reconnect it sends, per changed key, the shortest sequence to the current row
  that :func:`~flowbus.flow.expand.shorten` finds with the help of that backlog:
  never longer than the backlog, and never an error.

Outputs are per subscription point, named as the rewrite names them (a
``subscribe`` space that has stateless out-arcs is ``NAME.sub``), so the outputs
of a graph and of its rewrite compare directly. This is the oracle other
engines are tested against.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flowbus.errors import FlowbusError, FlowError, Undefined
from flowbus.filters.ast import Field
from flowbus.filters.compile import ALWAYS, Compiler, expressions_of, shared_subexpressions
from flowbus.flow.collapse import BoundRules, Key, Row
from flowbus.flow.expand import Expansion, KeyExpansion, analyse, expand_key, shorten
from flowbus.flow.graph import Collapse, EventSpace, Expand, Graph, Route, Select, StateSpace, Transform
from flowbus.flow.rewrite import exit_name, route_shared
from flowbus.flow.validate import bind_rules, replays_collapse

__all__ = ["Deliverer", "LocalRun", "run_graph", "write_outputs"]

Event = Mapping[str, Any]
Handler = Callable[[Event], None]


class Deliverer:
    """What one expand arc sends its subscriber when a row of its state changes (any engine).

    :meth:`events` takes the row the subscriber last had, the row before and
    after the change, and the event that caused it: when the expand replays its
    collapse, the cause itself is the one-event answer if the subscriber had the
    row from before it (else it is checked to still be one); otherwise the A*
    search finds the shortest sequence. :meth:`catch_up` shortens a backlog.
    """

    def __init__(self, graph: Graph, arc: Expand, collapse: Collapse) -> None:
        self.arc = arc
        self.bound = bind_rules(graph, arc)
        state = graph.state_space(arc.source)
        self.index = [state.components.index(c) for c in self.bound.components]
        self.whole = self.index == list(range(len(state.components)))
        self.fields = tuple(self.bound.event)
        self._field_set = frozenset(self.fields)
        self.shortcut = replays_collapse(graph, collapse, arc)
        self.searches = 0
        self.states_expanded = 0

    def project(self, row: Row) -> Row:
        return row if self.whole else tuple(row[i] for i in self.index)

    def events(self, key: Key, last: Row, old: Row, row: Row, cause: Event) -> tuple[Row, tuple[Event, ...]]:
        """The subscriber's new row and the events taking it there from ``last`` (none: no change)."""
        new = self.project(row)
        if new == last:
            return new, ()
        if self.shortcut and self._field_set <= cause.keys():
            candidate = cause if len(cause) == len(self.fields) else {f: cause[f] for f in self.fields}
            if last == self.project(old) or self.bound.step(key, last, candidate) == new:
                return new, (candidate,)
        return new, self.search(key, last, new).events

    def search(self, key: Key, start: Row, goal: Row) -> KeyExpansion:
        try:
            result = expand_key(self.bound, key, start, goal)
        except FlowbusError as exc:
            raise FlowError(f"while running: {exc}") from None
        return self._count(result)

    def catch_up(self, key: Key, start: Row, goal: Row, backlog: Sequence[Event]) -> KeyExpansion:
        """The shortest sequence :func:`shorten` finds from ``start`` to ``goal``, given ``backlog`` (what
        :meth:`events` gave for each change since ``start``): never longer than it, never an error."""
        return self._count(shorten(self.bound, key, start, goal, backlog))

    def _count(self, result: KeyExpansion) -> KeyExpansion:
        self.searches += 1
        self.states_expanded += result.states_expanded
        return result


class _Subscriber:
    """The consumer end of one expand arc: the rows it last delivered, per key; while it is away, per key,
    the row its backlog reaches and the backlog (what it would have been sent)."""

    def __init__(self, run: LocalRun, arc: Expand, collapse: Collapse) -> None:
        self.run = run
        self.arc = arc
        self.deliverer = Deliverer(run.graph, arc, collapse)
        self.bound = self.deliverer.bound
        self.table = run.states[arc.source]
        self.last: dict[Key, Row] = {}
        self.reached: dict[Key, Row] = {}
        self.backlog: dict[Key, list[Event]] = {}
        self.connected = True

    def changed(self, key: Key, old: Row, row: Row, cause: Event) -> None:
        if not self.connected:
            had = self.reached.get(key, self.last.get(key, self.bound.initial))
            self.reached[key], events = self.deliverer.events(key, had, old, row, cause)
            self.backlog.setdefault(key, []).extend(events)
            return
        new, events = self.deliverer.events(key, self.last.get(key, self.bound.initial), old, row, cause)
        if not events:
            return
        self.last[key] = new
        for ev in events:
            self.run._arrive(self.arc.target, ev)

    def reconnect(self) -> Expansion:
        t0 = time.perf_counter()
        self.connected = True
        results = []
        for key, row in list(self.table.items()):
            backlog = self.backlog.get(key)
            new = self.deliverer.project(row)
            last = self.last.get(key, self.bound.initial)
            if backlog is not None and new != last:
                results.append(self.deliverer.catch_up(key, last, new, backlog))
                self.last[key] = new
        self.reached.clear()
        self.backlog.clear()
        elapsed = time.perf_counter() - t0
        events = tuple(ev for r in results for ev in r.events)
        for ev in events:
            self.run._arrive(self.arc.target, ev)
        return Expansion(events, tuple(results), analyse(self.bound), elapsed)


class _Fold:
    """One collapse arc: its bound rules, its state table, the subscribers of its state, its handler."""

    def __init__(
        self, bound: BoundRules, table: dict[Key, Row], subscribers: list[_Subscriber], handler: Handler
    ) -> None:
        self.bound = bound
        self.table = table
        self.subscribers = subscribers
        self.handler = handler


def _fused(folds: list[_Fold]) -> Handler:
    """The collapses of one space as one handler, the key computed once when they share plain-field keys.

    Each fold is exactly :meth:`BoundRules.collapse` followed by the subscribers'
    notifications, in arc order; a key that is a tuple of field reads is the same
    tuple for every collapse keying on the same fields (an absent field: no fold).
    """
    fields: tuple[str, ...] | None = None
    for fold in folds:
        exprs = dict(fold.bound.ruleset.key)
        these = [exprs[n] for n in fold.bound.key_names]
        if not all(isinstance(e, Field) for e in these):
            break
        names = tuple(e.name for e in these if isinstance(e, Field))
        if fields is not None and names != fields:
            break
        fields = names
    else:
        if fields is not None:
            return _fused_keyed(folds, fields)
    handlers = [fold.handler for fold in folds]
    if len(handlers) == 1:
        return handlers[0]

    def fold_all(ev: Event) -> None:
        for handler in handlers:
            handler(ev)

    return fold_all


def _fused_keyed(folds: list[_Fold], fields: tuple[str, ...]) -> Handler:
    parts = [(f.table, f.bound.initial, f.bound.step, f.subscribers) for f in folds]
    single = fields[0] if len(fields) == 1 else None

    def fold_all(ev: Event) -> None:
        try:
            key = (ev[single],) if single is not None else tuple([ev[f] for f in fields])
        except KeyError:
            return
        for table, initial, step, subscribers in parts:
            old = table.get(key, initial)
            new = step(key, old, ev)
            if new is None or new == old:
                continue
            table[key] = new
            for sub in subscribers:
                sub.changed(key, old, new, ev)

    return fold_all


class LocalRun:
    """One run of ``graph``: :meth:`publish` events, read :attr:`outputs` and :attr:`states`."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.functions = graph.all_functions
        self.outputs: dict[str, list[Event]] = {}
        self.states: dict[str, dict[Key, Row]] = {
            s.name: {} for s in graph.spaces if isinstance(s, StateSpace)
        }
        self.published = 0
        self._record: dict[str, list[Event]] = {}
        self._entries: dict[str, EventSpace] = {}
        self._handlers: dict[str, list[Handler]] = {}
        self._expands: dict[str, list[_Subscriber]] = {name: [] for name in self.states}
        self._subscribers: dict[str, _Subscriber] = {}
        self._folds: dict[str, list[_Fold]] = {}
        for space in graph.spaces:  # the collapses first: a route may fuse with those of its target
            if isinstance(space, EventSpace):
                folds = [self._collapse(a) for a in graph.out_arcs(space.name) if isinstance(a, Collapse)]
                if folds:
                    self._folds[space.name] = folds
        for space in graph.spaces:
            if isinstance(space, EventSpace) and space.is_subscription:
                self._record[space.name] = self.outputs.setdefault(exit_name(graph, space.name), [])
        for space in graph.spaces:
            if isinstance(space, EventSpace):
                self._setup_space(space)

    # -------------------------------------------------------------- building

    def _setup_space(self, space: EventSpace) -> None:
        g = self.graph
        if space.is_publication:
            self._entries[space.name] = space
            self._entries.setdefault(f"{space.name}.pub", space)
            if space.name.endswith(".pub"):
                self._entries.setdefault(space.name[: -len(".pub")], space)
        arcs = g.out_arcs(space.name)
        handlers: list[Handler] = [fold.handler for fold in self._folds.get(space.name, ())]
        routes = [a for a in arcs if isinstance(a, Route)]
        if routes:
            handlers.append(self._router(space, routes))
        for arc in arcs:
            if isinstance(arc, Select):
                handlers.append(self._select(arc))
            elif isinstance(arc, Transform):
                handlers.append(self._transform(arc))
        self._handlers[space.name] = handlers

    def _select(self, arc: Select) -> Handler:
        c = Compiler(self.functions, shared_subexpressions(expressions_of(arc.filter)))
        test, new_memo, target, arrive = c.filter(arc.filter), c.memo_factory(), arc.target, self._arrive

        def select(ev: Event) -> None:
            if test(ev, new_memo()):
                arrive(target, ev)

        return select

    def _transform(self, arc: Transform) -> Handler:
        c = Compiler(self.functions, shared_subexpressions(e for _, e in arc.outputs))
        fields = list(self.graph.space(arc.source).schema)
        fn, target, arrive = c.transform(arc.outputs, inputs=fields), arc.target, self._arrive
        new_memo = c.memo_factory()

        def transform(ev: Event) -> None:
            try:
                out = fn(ev, new_memo())
            except Undefined:
                return
            arrive(target, out)

        return transform

    def _router(self, space: EventSpace, routes: list[Route]) -> Handler:
        c = Compiler(self.functions, route_shared(routes))
        fields = list(space.schema)
        compiled = [
            (
                r.target,
                self._fused(r.target),
                c.filter(r.select),
                c.transform(r.outputs, r.requires, inputs=fields),
            )
            for r in routes
        ]
        new_memo, arrive = c.memo_factory(), self._arrive

        def route(ev: Event) -> None:
            memo = new_memo()
            for target, fused, test, transform in compiled:
                if test is ALWAYS or test(ev, memo):
                    try:
                        out = transform(ev, memo)
                    except Undefined:
                        continue
                    if fused is None:
                        arrive(target, out)
                    else:
                        fused(out)

        return route

    def _collapse(self, arc: Collapse) -> _Fold:
        bound: BoundRules = bind_rules(self.graph, arc)
        table = self.states[arc.target]
        subscribers = self._expands[arc.target]
        for expand in self.graph.out_arcs(arc.target):
            assert isinstance(expand, Expand)
            sub = _Subscriber(self, expand, arc)
            subscribers.append(sub)
            self._subscribers[expand.name] = sub
        collapse = bound.collapse

        def fold(ev: Event) -> None:
            change = collapse(table, ev)
            if change is not None:
                key, old, new = change
                for sub in subscribers:
                    sub.changed(key, old, new, ev)

        return _Fold(bound, table, subscribers, fold)

    def _fused(self, target: str) -> Handler | None:
        """The target's collapses fused into one handler a route calls directly (None: arrive as usual).

        In a rewritten graph the space a route feeds a collapse through is no
        subscription point and has nothing but collapse arcs out: the route's
        output goes straight into the folds (no arrival, no handler loop), and
        collapses keyed by the same plain fields compute the key once.
        """
        arcs = self.graph.out_arcs(target)
        if target in self._record or not arcs or not all(isinstance(a, Collapse) for a in arcs):
            return None
        return _fused(self._folds[target])

    # --------------------------------------------------------------- running

    def _arrive(self, space: str, ev: Event) -> None:
        record = self._record.get(space)
        if record is not None:
            record.append(ev)
        for handler in self._handlers[space]:
            handler(ev)

    def publish(self, space: str, event: Mapping[str, Any]) -> None:
        """Publish ``event`` at the publication point ``space`` (checked against its schema)."""
        target = self._entries.get(space)
        if target is None:
            points = ", ".join(n for n, s in self._entries.items() if n == s.name)
            raise FlowError(f"{space!r} is not a publication point (publication points: {points})")
        try:
            ev = target.schema.validate(event)
        except FlowbusError as exc:
            raise FlowError(f"event published to {space!r}: {exc}") from None
        self.published += 1
        self._arrive(target.name, ev)

    def run(self, events: Iterable[tuple[str, Mapping[str, Any]]]) -> LocalRun:
        for space, event in events:
            self.publish(space, event)
        return self

    def _subscriber(self, name: str) -> _Subscriber:
        for sub in self._subscribers.values():
            if name in (sub.arc.name, sub.arc.target):
                return sub
        raise FlowError(
            f"no expand arc named {name!r} (expand arcs: {', '.join(self._subscribers) or 'none'})"
        )

    def disconnect(self, expand: str) -> None:
        """The subscriber of expand arc ``expand`` (or its target space) stops receiving."""
        self._subscriber(expand).connected = False

    def reconnect(self, expand: str) -> Expansion:
        """The subscriber comes back: it receives, per changed key, the shortest equivalent sequence."""
        return self._subscriber(expand).reconnect()

    def state_rows(self, name: str) -> list[dict[str, Any]]:
        """The rows of state ``name`` as dicts, in key order."""
        space = self.graph.state_space(name)
        rows = []
        for key, row in sorted(self.states[name].items(), key=lambda kv: repr(kv[0])):
            rows.append(
                {**dict(zip(space.key, key, strict=True)), **dict(zip(space.components, row, strict=True))}
            )
        return rows


def run_graph(graph: Graph, events: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, list[Event]]:
    """The outputs, per subscription point, of ``graph`` on ``events``."""
    return LocalRun(graph).run(events).outputs


def _normalise(ev: Event, floats: frozenset[str]) -> dict[str, Any]:
    return {k: float(v) if k in floats and type(v) is int else v for k, v in ev.items()}


def write_outputs(run: LocalRun, directory: str | Path) -> dict[str, Path]:
    """One JSONL file per subscription point in ``directory`` (values as their schema types)."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FlowError(f"cannot create {str(out)!r}: {exc.strerror or exc}") from None
    files: dict[str, Path] = {}
    for name, events in run.outputs.items():
        space = run.graph.space(name) if run.graph.has_space(name) else run.graph.space(name[: -len(".sub")])
        floats = frozenset(n for n, t in space.schema.fields.items() if t is float)
        path = out / f"{name}.jsonl"
        try:
            with path.open("w", encoding="utf-8") as fh:
                for ev in events:
                    fh.write(json.dumps(_normalise(ev, floats)) + "\n")
        except OSError as exc:
            raise FlowError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
        files[name] = path
    return files
