"""A flow deployed on the broker network: its spaces on the bus, the content filter and edge
transforms of a subscription to any of them, and its stateful groups as partitions.

How it works (000 document, section 4: "all selects move toward the publishers and become
content-based routing inside the network, all transforms move to the edge"):

* **The document.** A deployment is made from a spec file (:meth:`Deployment.from_file`):
  its lookup tables are read and inlined, so the deployment is one self-contained YAML text
  that travels between brokers and into their stores. Its ``version`` is the first 16 hex
  digits of the text's SHA-256: two brokers holding the same version hold the same flow.
* **Spaces on the bus.** Every event space of the flow is a space of the bus, under its own
  name (an event carries it in ``__space``, :data:`SPACE`). Clients publish into the
  *publishable* spaces (sources and ``publish: true`` spaces); the owners of the flow's state
  publish into the *derived* spaces (the targets of expand arcs); every event space can be
  subscribed to. A state space is not: one subscribes to what lies downstream of it.
* **A subscription** to space ``P`` with filter ``F`` over ``P``'s schema
  (:meth:`Deployment.subscription`) takes every path into ``P`` from the rewrite
  (:func:`~flowbus.flow.rewrite.rewrite` of the graph with ``P`` made a subscription point):
  each path is a bus space ``p`` it starts at and its ``[S; T]``. The network routes
  ``OR over paths (__space = p & S & F[T])``, ``F`` pulled back through ``T``
  (:func:`~flowbus.filters.substitute.substitute_filter`): ``cap >= 5000000`` on
  ``big_trades`` reaches the publishers' brokers as ``price * vol >= 5000000``. Every
  expression other than a field read that a path from a source selects on or outputs
  (``price * vol``, ``NYS(issue)``) is a *derived attribute* of the source
  (:attr:`Deployment.derived`): the broker that takes a publish computes them once and stamps
  them into hidden fields, and the routed filter compares the field, ``__x.stocks.NYSE.1 >=
  5000000``: a plain predicate the matchers index, exact even over a lookup. A literal over
  another expression that calls a function is left out of the routed filter (the brokers'
  matchers know no flow's functions): the routed filter is then weaker, never stronger. At
  the edge, :meth:`FlowSubscription.deliver` applies, per path from the event's space, ``S``,
  then ``T``, then ``F``: every path that holds delivers (fan-out, as the interpreter does).
  Where the event's space has one path in and its routed filter left nothing out, the network
  has decided ``S & F[T]`` already: the edge only transforms (unless the event reached it
  unrouted, a late subscriber's snapshot: :data:`UNROUTED`).
* **Stateful groups** (:func:`flowbus.flow.plan.plan`: the collapses reading one space with
  one key) are partitioned over the brokers by a 32-bit hash of the key
  (:func:`hash32`). The broker that takes a publish stamps the event, for each feed of a group
  reading the event's space whose ``S`` holds and ``T`` is defined, with the hash of the key
  in a hidden field (:meth:`Deployment.stamp`); the owner of a hash range subscribes to its
  range of that field like any subscriber, and folds what it receives
  (:meth:`flowbus.routing.flows.Flows.fold`). Each change of a row gives, per expand arc out of the state, the
  shortest sequence from the old row to the new one (:class:`~flowbus.flow.local.Deliverer`),
  which the owner publishes into the expand's target.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from flowbus.errors import FlowbusError, FlowError, SchemaError, Undefined, UserError
from flowbus.filters import Filter, parse
from flowbus.filters.ast import BinOp, Call, Conjunction, Const, Expr, ExprPredicate, Field, Op, Predicate
from flowbus.filters.compile import ALWAYS, Compiler, shared_subexpressions
from flowbus.filters.substitute import substitute_filter
from flowbus.flow.collapse import Key
from flowbus.flow.generators import generate
from flowbus.flow.graph import Expand, Graph, Route, StateSpace
from flowbus.flow.owners import BusFeed, Fold, Group, Output
from flowbus.flow.plan import StatefulGroup, plan
from flowbus.flow.rewrite import exit_name, rewrite, route_shared
from flowbus.flow.rulecode import key_function, step_function
from flowbus.flow.spec import graph_from_spec, lookup_table, read_spec
from flowbus.flow.validate import bind_rules
from flowbus.meta import DERIVED, HASH_FIELD, SPACE, UNROUTED, is_hidden, strip
from flowbus.model import Schema

__all__ = [
    "HASH_SPACE",
    "Deployment",
    "FlowSubscription",
    "Group",
    "Reader",
    "SpaceInfo",
    "bus_name",
    "hash32",
]

Event = Mapping[str, Any]
TestFn = Callable[[Event, Any], bool]
TransformFn = Callable[[Event, Any], Mapping[str, Any]]


HASH_SPACE = 1 << 32
"""The range of a key's hash: ``0 <= hash32(key) < HASH_SPACE``."""


def hash32(key: Key) -> int:
    """A stable 32-bit hash of a state key (the same in every process)."""
    return zlib.crc32(repr(key).encode())


def bus_name(node: str) -> str:
    """The bus space of a node of the rewritten graph (``combined.pub`` -> ``combined``)."""
    for suffix in (".pub", ".sub"):
        if node.endswith(suffix):
            return node[: -len(suffix)]
    return node


@dataclass(frozen=True, slots=True)
class SpaceInfo:
    """A space of a deployed flow as the bus sees it."""

    name: str
    kind: str  # source, events, sink or state
    schema: Schema
    publishable: bool  # clients may publish into it
    derived: bool  # the owners of a state publish into it (an expand's target)
    subscribable: bool


@dataclass(frozen=True, slots=True)
class _Path:
    """One path into a subscribed space: from bus space ``source``, ``[S; T]`` compiled."""

    source: str
    select: TestFn
    transform: TransformFn
    new_memo: Callable[[], Any]
    arcs: tuple[str, ...] = ()  # its route's name, then the arcs of the graph it stands for
    hidden: bool = False  # whether the transform outputs a field named like a hidden one

    def run(self, event: Event) -> dict[str, Any] | None:
        """The event this path delivers for ``event`` (its hidden fields left out), or None."""
        m = self.new_memo()
        if self.select is not ALWAYS and not self.select(event, m):
            return None
        try:
            out = self.transform(event, m)
        except Undefined:
            return None
        if out is event or self.hidden or type(out) is not dict:
            return strip(out)
        return out  # (a new dict of the route's outputs: nothing to leave out)


_COUNTED = ("arcs counted",)  # (a key no space name or path id can be)


def count_arcs(counts: dict[str, int], arcs: tuple[str, ...], results: dict[Any, Any] | None) -> None:
    """One event passed a route (``arcs[0]``) and the arcs of the graph it stands for
    (``arcs[1:]``): count each of those once per event (``results``: the event's, shared by
    what this broker does with it; it notes the arcs counted already)."""
    if not arcs:
        return
    counts[arcs[0]] = counts.get(arcs[0], 0) + 1
    done = results.setdefault(_COUNTED, set()) if results is not None else set()
    for arc in arcs[1:]:
        if arc not in done:
            done.add(arc)
            counts[arc] = counts.get(arc, 0) + 1


class FlowSubscription:
    """A subscription to a space of a flow: the filter the network routes, and what the edge
    applies before delivery (see the module note)."""

    def __init__(
        self,
        flow: str,
        space: str,
        filt: Filter,
        routing: Filter,
        paths: Sequence[_Path],
        check: TestFn,
        exact: frozenset[str] = frozenset(),
        counts: dict[str, int] | None = None,
    ) -> None:
        self.flow = flow
        self.space = space
        self.filter = filt
        self.routing = routing
        self._by_source: dict[str, list[_Path]] = {}
        for path in paths:
            self._by_source.setdefault(path.source, []).append(path)
        self._check = check
        self._memo = Compiler({}).new_memo()
        self.sources = frozenset(self._by_source)
        self.routed = frozenset(s for s in exact if len(self._by_source.get(s, ())) == 1)
        """The spaces whose events the network routed over this subscription's one exact path
        (see :meth:`shares`)."""
        self.counts = counts

    def shares(self, event: Event) -> bool:
        """Whether what this subscription receives of ``event`` is what every subscription to
        its space receives: the network routed the event over the one exact path from its space."""
        return event.get(SPACE, "") in self.routed and UNROUTED not in event

    def deliver(self, event: Event, results: dict[Any, Any] | None = None) -> list[dict[str, Any]]:
        """What the subscriber receives for ``event`` (a bus event: its space in ``__space``).
        ``results`` keeps, for this event, each path's result (None: dropped), shared by the
        subscriptions to the space (their paths are the same objects): the transforms run once
        per event, the subscriptions' own filters once each. The dicts returned are shared
        too: read only."""
        out: list[dict[str, Any]] = []
        check, memo = self._check, self._memo
        if self.shares(event):
            check = ALWAYS  # (the network matched S & F[T] of the one path from the space)
        for path in self._by_source.get(event.get(SPACE, ""), ()):
            key = id(path)
            if results is not None and key in results:
                result = results[key]
            else:
                result = path.run(event)
                if results is not None:
                    results[key] = result
                if result is not None and self.counts is not None:
                    count_arcs(self.counts, path.arcs, results)
            if result is not None and (check is ALWAYS or check(result, memo)):
                out.append(result)
        return out


@dataclass(frozen=True, slots=True)
class Reader:
    """What reads a derived space: a path from it into a space one can subscribe to, or a
    group's feed. ``routed``: the space's events it takes, as the network routes them;
    ``exact``: every event ``routed`` matches passes ``test`` (nothing was left out of it)."""

    routed: Filter
    exact: bool
    test: TestFn
    new_memo: Callable[[], Any]


@dataclass(frozen=True)
class Deployment:
    """A flow as the network deploys it (see the module note): build with :meth:`from_file`
    or :meth:`from_text`."""

    name: str
    version: str
    text: str  # the canonical YAML document (lookups inlined)
    graph: Graph
    counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Events through each route and arc of the flow here (see :func:`count_arcs`): the console's."""
    _subs: dict[tuple[str, str], FlowSubscription] = field(default_factory=dict, compare=False, repr=False)
    _paths: dict[str, list[tuple[tuple[str, Route | None], _Path]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    # -- making one

    @classmethod
    def from_file(cls, path: str | Path) -> Deployment:
        """The deployment of a spec file (its lookup files inlined); a :class:`FlowError`
        naming the file and what is wrong if it is not a valid flow."""
        p = Path(path)
        data = read_spec(p)
        try:
            doc = _inlined(data, p.parent)
            return cls.from_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        except FlowbusError as exc:
            raise FlowError(f"{p}: {exc}") from None

    @classmethod
    def from_text(cls, text: str) -> Deployment:
        """The deployment of a canonical document (what :attr:`text` holds)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise FlowError(f"a flow document is YAML: {exc}") from None
        graph = graph_from_spec(data)
        version = hashlib.sha256(text.encode()).hexdigest()[:16]
        deployment = cls(graph.name, version, text, graph)
        deployment.groups  # (built and checked now: an invalid flow is refused whole)  # noqa: B018
        deployment.derived  # noqa: B018
        return deployment

    @classmethod
    def from_spec(cls, data: Mapping[str, Any]) -> Deployment:
        """The deployment of a spec already parsed (its lookups given as tables)."""
        return cls.from_text(yaml.safe_dump(_inlined(data, Path(".")), sort_keys=False, allow_unicode=True))

    # -- the flow's spaces

    @cached_property
    def rewritten(self) -> Graph:
        return rewrite(self.graph)

    @cached_property
    def spaces(self) -> dict[str, SpaceInfo]:
        g = self.graph
        derived = {a.target for a in g.arcs if isinstance(a, Expand)}
        out: dict[str, SpaceInfo] = {}
        for s in g.spaces:
            if isinstance(s, StateSpace):
                out[s.name] = SpaceInfo(s.name, "state", s.schema, False, False, False)
            else:
                out[s.name] = SpaceInfo(s.name, s.kind, s.schema, s.is_publication, s.name in derived, True)
        return out

    @property
    def functions(self) -> Mapping[str, Any]:
        return self.graph.all_functions

    def space(self, name: str) -> SpaceInfo:
        info = self.spaces.get(name)
        if info is None:
            known = ", ".join(self.spaces)
            raise UserError(f"flow {self.name!r} has no space {name!r} (spaces: {known})")
        return info

    def expand_into(self, space: str) -> Expand | None:
        """The expand arc that publishes into ``space`` (None: none, or several)."""
        arcs = [a for a in self.graph.arcs if isinstance(a, Expand) and a.target == space]
        return arcs[0] if len(arcs) == 1 else None

    def check_event(self, space: str, event: Any) -> dict[str, Any]:
        """``event`` published by a client into ``space``, checked (a :class:`UserError` if not)."""
        info = self.space(space)
        if not info.publishable:
            why = "its state's owners publish into it" if info.derived else "it is computed from others"
            raise UserError(
                f"space {space!r} of flow {self.name!r} is not publishable: {why} "
                f"(publishable: {', '.join(s.name for s in self.spaces.values() if s.publishable)})"
            )
        if not isinstance(event, Mapping) or not all(isinstance(k, str) for k in event):
            raise UserError(f"an event is a map of field names to values, got {type(event).__name__}")
        try:
            return info.schema.validate(event)
        except SchemaError as exc:
            raise UserError(f"space {space!r}: {exc}") from None

    def generate(
        self, *, events: int | None = None, seed: int | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The flow's generated input, in the interpreter's order: ``(space, event)`` pairs."""
        return generate(self.graph, events=events, seed=seed)

    # -- subscriptions

    def subscription(self, space: str, filter_text: str = "") -> FlowSubscription:
        """A subscription to ``space`` with ``filter_text`` over its schema (empty: all
        events): a :class:`UserError` naming the space or the field if it cannot be."""
        key = (space, filter_text)
        sub = self._subs.get(key)
        if sub is None:
            sub = self._subs[key] = self._subscription(space, filter_text)
        return sub

    def _subscription(self, space: str, filter_text: str) -> FlowSubscription:
        info = self.space(space)
        if info.kind == "state":
            below = [a.target for a in self.graph.out_arcs(space)]
            raise UserError(
                f"space {space!r} of flow {self.name!r} is a state: subscribe to what lies "
                f"downstream of it ({', '.join(below) or 'nothing does'})"
            )
        filt = parse(filter_text) if filter_text.strip() else Filter.true()
        unknown = sorted(f for f in filt.fields() if f not in info.schema)
        if unknown:
            raise UserError(
                f"filter: unknown field {unknown[0]!r} in space {space!r} (fields: {', '.join(info.schema)})"
            )
        check: TestFn = Compiler(self.functions).filter(filt) if filt != Filter.true() else ALWAYS
        routing = Filter.false()
        loose: set[str] = set()  # sources a path from which is routed by a weaker filter
        for (source, route), _ in self._compiled_paths(space):
            step = filt if route is None else route.select & substitute_filter(filt, dict(route.outputs))
            routed, exact = self._routable(source, step)
            routing = routing | routed
            if not exact:
                loose.add(source)
        paths = [path for _, path in self._compiled_paths(space)]
        exact_sources = frozenset(p.source for p in paths) - loose
        return FlowSubscription(self.name, space, filt, routing, paths, check, exact_sources, self.counts)

    def _compiled_paths(self, space: str) -> list[tuple[tuple[str, Route | None], _Path]]:
        """The paths into ``space``, each with its ``[S; T]`` compiled once (the subscriptions
        to the space share them, and the edge computes each once per event)."""
        made = self._paths.get(space)
        if made is None:
            made = self._paths[space] = [(p, self._compile_path(space, *p)) for p in self._paths_into(space)]
        return made

    def _compile_path(self, space: str, source: str, route: Route | None) -> _Path:
        # (never the identity transform: a new dict of the space's fields, made by one generated
        # dict display, costs less than the input event copied without its hidden fields)
        if route is None:
            schema = list(self.spaces[space].schema)
            c = Compiler(self.functions)
            return _Path(source, ALWAYS, c.transform([(n, Field(n)) for n in schema]), c.memo_factory())
        c = Compiler(self.functions, route_shared([route]))
        select = ALWAYS if route.select == Filter.true() else c.filter(route.select)
        return _Path(
            source,
            select,
            c.transform(route.outputs, route.requires),
            c.memo_factory(),
            (route.name, *route.via),
            any(is_hidden(name) for name, _ in route.outputs),
        )

    def _paths_into(self, space: str) -> list[tuple[str, Route | None]]:
        """Every path into ``space``: (the bus space it starts at, its route; None: the space itself)."""
        g, info = self.graph, self.spaces[space]
        sp = g.event_space(space)
        if sp.kind == "events" and not sp.subscribe:
            g = Graph(
                spaces=tuple(replace(sp, subscribe=True) if s is sp else s for s in g.spaces),
                arcs=g.arcs,
                functions=g.functions,
                name=g.name,
            )
            rw = rewrite(g)
        else:
            rw = self.rewritten
        exit_node = exit_name(g, space)
        routes = [a for a in rw.arcs if isinstance(a, Route) and a.target == exit_node]
        out: list[tuple[str, Route | None]] = [(bus_name(r.source), r) for r in routes]
        if (info.publishable or info.derived) and not any(
            bus_name(r.source) == space and not r.via for r in routes
        ):
            out.insert(0, (space, None))
        return out

    # -- state

    @cached_property
    def groups(self) -> tuple[Group, ...]:
        rw = self.rewritten
        try:
            flow_plan = plan(rw)
        except FlowError as exc:
            raise FlowError(f"flow {self.name!r} cannot run on the network: {exc}") from None
        return tuple(self._group(rw, g) for g in flow_plan.groups)

    def _group(self, rw: Graph, g: StatefulGroup) -> Group:
        fns = self.functions
        feeds = []
        for i, feed in enumerate(g.feeds):
            route = feed.route
            field_name = f"{HASH_FIELD}.{self.name}.{g.name}.{i}"
            if route is None:
                schema = rw.space(feed.point).schema
                c = Compiler(fns)
                feeds.append(
                    BusFeed(i, bus_name(feed.point), field_name, ALWAYS,
                         c.transform([(n, Field(n)) for n in schema], inputs=list(schema)), c.memo_factory())
                )  # fmt: skip
            else:
                c = Compiler(fns, route_shared([route]))
                select = ALWAYS if route.select == Filter.true() else c.filter(route.select)
                transform = c.transform(
                    route.outputs, route.requires, inputs=list(rw.space(route.source).schema)
                )
                feeds.append(
                    BusFeed(i, bus_name(feed.point), field_name, select, transform, c.memo_factory(),
                         (route.name, *route.via))
                )  # fmt: skip
        folds = []
        for collapse in g.collapses:
            outputs = tuple(
                Output.of(rw, e, collapse, bus_name(e.target))
                for e in rw.out_arcs(collapse.target)
                if isinstance(e, Expand)
            )
            bound = bind_rules(rw, collapse)
            folds.append(Fold(collapse.name, collapse.target, bound, outputs, step_function(bound)))
        key_fn = key_function(folds[0].bound) if folds else None
        return Group(g.name, self.name, tuple(feeds), tuple(folds), self.counts, key_fn)

    @cached_property
    def group_of_state(self) -> dict[str, str]:
        """State space -> the name of the group that folds into it."""
        return {f.state: g.name for g in self.groups for f in g.folds}

    @cached_property
    def stamps(self) -> dict[str, list[tuple[Group, BusFeed]]]:
        """Bus space -> the (group, feed) pairs reading it."""
        out: dict[str, list[tuple[Group, BusFeed]]] = {}
        for g in self.groups:
            for f in g.feeds:
                out.setdefault(f.space, []).append((g, f))
        return out

    @cached_property
    def readers(self) -> dict[str, tuple[Reader, ...]]:
        """Derived space -> what reads it: each path from it into a space one can subscribe
        to, each feed of a group (see :class:`Reader`)."""
        out: dict[str, list[Reader]] = {}
        derived = {name for name, info in self.spaces.items() if info.derived}
        for name, info in self.spaces.items():
            if info.subscribable:
                for (source, route), path in self._compiled_paths(name):
                    if source in derived:
                        select = Filter.true() if route is None else route.select
                        routed, exact = self._routable(source, select)
                        out.setdefault(source, []).append(Reader(routed, exact, path.select, path.new_memo))
        for space, pairs in self.stamps.items():
            if space in derived:
                for _, feed in pairs:
                    taken = Conjunction((
                        Predicate(SPACE, Op.EQ, space),
                        Predicate(feed.field, Op.GT, -1),
                        Predicate(feed.field, Op.LE, HASH_SPACE - 1),
                    ))  # fmt: skip
                    out.setdefault(space, []).append(
                        Reader(Filter((taken,)), True, feed.select, feed.new_memo)
                    )
        return {space: tuple(readers) for space, readers in out.items()}

    def wanted(self, space: str, event: Event, readers: Sequence[Reader] | None = None) -> bool:
        """Whether an owner's ``event`` of derived ``space`` can reach anyone: some path from
        the space or some group's feed selects it (the pulled-back selects of the 000
        document's rewrite, applied where the event is made). An event nothing selects is
        not published: ``drops`` carries the stock flow's every fall, ``alarms`` the few over 20.
        ``readers``: only these of the space's readers (those some subscription needs now)."""
        if readers is None:
            readers = self.readers.get(space, ())
        return any(r.test is ALWAYS or r.test(event, r.new_memo()) for r in readers)

    @cached_property
    def derived(self) -> dict[str, tuple[dict[Expr, str], Callable[[Event], dict[str, Any]]]]:
        """Bus space -> its derived attributes (expression -> hidden field) and the function
        computing them for an event of it: every expression other than a field read that the
        paths starting at the space select on or output (see the module note)."""
        found: dict[str, set[Expr]] = {}
        for name, info in self.spaces.items():
            if not info.subscribable:
                continue
            for source, route in self._paths_into(name):
                if route is None:
                    continue
                exprs = found.setdefault(source, set())
                exprs.update(e for _, e in route.outputs if not isinstance(e, Field))
                for c in route.select.disjuncts:
                    exprs.update(
                        lit.left
                        for lit in c.literals
                        if isinstance(lit, ExprPredicate) and not isinstance(lit.left, Field)
                    )
        out: dict[str, tuple[dict[Expr, str], Callable[[Event], dict[str, Any]]]] = {}
        for source, exprs in sorted(found.items()):
            if not exprs:
                continue
            ordered = sorted(exprs, key=repr)
            fields = {e: f"{DERIVED}.{self.name}.{source}.{i}" for i, e in enumerate(ordered)}
            out[source] = (fields, _evaluator(self.functions, fields))
        return out

    def _routable(self, source: str, f: Filter) -> tuple[Filter, bool]:
        """``__space = source & f`` as the network routes it: an expression the source's
        derived attributes hold is read from its hidden field (an indexable predicate when it
        is compared with a constant); a literal that still calls a function is left out.
        And whether nothing was left out (the routed filter is then exactly ``f``)."""
        fields = self.derived.get(source, ({}, None))[0]
        in_space = Predicate(SPACE, Op.EQ, source)
        conj = []
        exact = True
        for c in f.disjuncts:
            kept: list[Predicate | ExprPredicate] = []
            for lit in c.literals:
                if isinstance(lit, ExprPredicate):
                    lit = _read_derived(lit, fields)
                if isinstance(lit, ExprPredicate) and lit.calls():
                    exact = False
                else:
                    kept.append(lit)
            conj.append(Conjunction((in_space, *kept)))
        return Filter(tuple(conj)), exact

    def stamp(self, event: dict[str, Any]) -> None:
        """Add to ``event`` (a bus event) its derived attributes, and the hash of its key
        for each group it feeds."""
        derived = self.derived.get(event.get(SPACE, ""))
        if derived is not None:
            event.update(derived[1](event))
        for group, feed in self.stamps.get(event.get(SPACE, ""), ()):
            src = feed.input(event)
            if src is None:
                continue
            key = group.key_of(src)
            if key is not None:
                event[feed.field] = hash32(key)

    def partition_filter(self, group: Group, ranges: Sequence[tuple[int, int]]) -> Filter:
        """The events of ``group`` whose key hash lies in one of ``ranges`` (``lo < h <= hi``)."""
        conj = []
        for feed in group.feeds:
            for lo, hi in ranges:
                conj.append(
                    Conjunction((
                        Predicate(SPACE, Op.EQ, feed.space),
                        Predicate(feed.field, Op.GT, lo),
                        Predicate(feed.field, Op.LE, hi),
                    ))
                )  # fmt: skip
        return Filter(tuple(conj))


def _read_derived(lit: ExprPredicate, fields: Mapping[Expr, str]) -> Predicate | ExprPredicate:
    """``lit`` with its derived expressions read from their hidden fields: a plain predicate
    when one side is such an expression and the other a constant."""
    left, right = _substituted(lit.left, fields), _substituted(lit.right, fields)
    if isinstance(left, Field) and left.name in fields.values() and isinstance(right, Const):
        return Predicate(left.name, lit.op, right.value, lit.negated)
    return ExprPredicate(left, lit.op, right, lit.negated)


def _substituted(e: Expr, fields: Mapping[Expr, str]) -> Expr:
    name = fields.get(e)
    if name is not None:
        return Field(name)
    if isinstance(e, BinOp):
        return BinOp(e.op, _substituted(e.left, fields), _substituted(e.right, fields))
    if isinstance(e, Call):
        return Call(e.name, tuple(_substituted(a, fields) for a in e.args))
    return e


def _evaluator(functions: Mapping[str, Any], fields: Mapping[Expr, str]) -> Callable[[Event], dict[str, Any]]:
    """The function giving an event's derived attributes (those defined), computed together
    (a subexpression they share, once)."""
    c = Compiler(functions, shared_subexpressions(fields))
    parts = [(name, c.expr(e)) for e, name in fields.items()]
    new_memo = c.memo_factory()

    def evaluate(event: Event) -> dict[str, Any]:
        memo = new_memo()
        out = {}
        for name, fn in parts:
            try:
                out[name] = fn(event, memo)
            except Undefined:
                continue
        return out

    return evaluate


def _inlined(data: Any, base: Path) -> dict[str, Any]:
    """A parsed spec with its lookup tables read from their files."""
    if not isinstance(data, Mapping):
        raise FlowError(f"a spec is a mapping with spaces and arcs, got {type(data).__name__}")
    doc = dict(data)
    lookups = doc.get("lookups")
    if isinstance(lookups, Mapping):
        doc["lookups"] = {
            str(name): dict(lookup_table(table, f"lookup {name!r}", base)) for name, table in lookups.items()
        }
    return doc
