"""Rewriting a graph so that every path is one [select; transform] pair (000 document, section 4.1).

How it works:

* The rewrite rules. A select after a transform is pushed ahead of it by
  substituting the transform's expressions into the predicate
  (:func:`push_select`: ``TA; SA`` becomes ``SB; TA``); consecutive selects
  merge into their conjunction and consecutive transforms into one by
  substitution (:func:`merge_transforms`). A path ``ts1; ...; tsk`` folds left
  into one :class:`Step` ``[S; T]`` (:func:`reduce_path`): ``[T T S T S T]``
  becomes ``[S S T T T]`` and then ``[S T]``. A transform drops an event on which
  any of its outputs is undefined (a lookup miss, a division by zero), so the
  composed transform *requires* the intermediate expressions that its outputs no
  longer read -- an expression that is a subexpression of an output needs no
  requirement, since the output cannot be defined without it.
* Externalizing. Publication points are sources, ``publish`` spaces and the
  targets of expand arcs; subscription points are sinks, ``subscribe`` spaces
  and the sources of collapse arcs. An internal space that is a publication
  point and also has stateless in-arcs gets an entry node ``NAME.pub``; one that
  is a subscription point with stateless out-arcs gets an exit node
  ``NAME.sub`` (the paper's Figure 2b). Other spaces keep their names.
* The whole graph. For every publication point ``p`` and every path of selects
  and transforms from it to a subscription point ``q`` (depth first, arcs in
  their declared order: the order the interpreter delivers in), one
  :class:`~flowbus.flow.graph.Route` ``p -> q`` labelled ``[S; T]``; collapse
  and expand arcs are kept, re-attached to the exit and entry nodes; internal
  spaces disappear. Fan-out then fan-in gives two routes between the same pair:
  the event is delivered twice, as in the original.
* Tagged transforms (:func:`tag`). All routes then share one select stage: one
  core space into which every publication point publishes its events tagged
  with their source, one subscription per subscription point (the disjunction,
  over its routes, of ``source = p & S``), and a table keyed by
  ``(source, subscription point)`` holding the transforms applied at delivery.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus.errors import FlowError, Undefined
from flowbus.filters.ast import BinOp, Call, Conjunction, Const, Expr, Field, Filter, Op, Predicate
from flowbus.filters.compile import Compiler, expressions_of, shared_subexpressions, subexpressions
from flowbus.filters.substitute import never_defined, substitute_expr, substitute_filter
from flowbus.flow.graph import (
    STATELESS,
    Arc,
    Collapse,
    EventSpace,
    Expand,
    Graph,
    Outputs,
    Route,
    Select,
    Space,
    Transform,
)

__all__ = [
    "RoutePath",
    "Step",
    "TaggedPlan",
    "entry_name",
    "exit_name",
    "find_paths",
    "merge_transforms",
    "push_select",
    "reduce_path",
    "rewrite",
    "tag",
]

MAX_PATHS = 10_000


# ------------------------------------------------------------------ the rules


@dataclass(frozen=True, slots=True)
class Step:
    """``[S; T]`` over the fields ``inputs``: ``select``, then ``outputs`` (with ``requires`` defined)."""

    inputs: tuple[str, ...]
    select: Filter
    outputs: Outputs
    requires: tuple[Expr, ...] = ()

    @classmethod
    def identity(cls, inputs: Sequence[str]) -> Step:
        return cls(tuple(inputs), Filter.true(), tuple((n, Field(n)) for n in inputs))


def push_select(outputs: Outputs, f: Filter) -> Filter:
    """``T; S`` -> ``S'; T``: the select ``f`` over T's outputs, as a select over T's inputs."""
    return substitute_filter(f, dict(outputs))


def merge_transforms(first: Outputs, second: Outputs) -> Outputs:
    """``T1; T2`` -> ``T``: T2's expressions with T1's substituted for the fields they read."""
    mapping = dict(first)
    return tuple((name, substitute_expr(e, mapping)) for name, e in second)


def _prune(requires: Sequence[Expr], outputs: Outputs) -> tuple[Expr, ...]:
    """Drop requirements implied by the outputs or by other requirements (fields are always present)."""
    implied = {s for _, e in outputs for s in subexpressions(e)}
    kept: dict[Expr, None] = {}
    for r in requires:
        if isinstance(r, (Field, Const)) or r in implied or r in kept:
            continue
        kept[r] = None
    inner = {s for r in kept for s in subexpressions(r) if s != r}
    return tuple(r for r in kept if r not in inner)


def then_select(step: Step, f: Filter) -> Step:
    """``[S; T]; F`` -> ``[S & F'; T]`` (F pushed ahead of T)."""
    return Step(step.inputs, step.select & push_select(step.outputs, f), step.outputs, step.requires)


def then_transform(step: Step, outputs: Outputs, requires: Sequence[Expr] = ()) -> Step:
    """``[S; T1]; T2`` -> ``[S; T1T2]``, requiring what T1 computed that T2 no longer reads."""
    merged = merge_transforms(step.outputs, outputs)
    mapping = dict(step.outputs)
    needed = [*step.requires, *(e for _, e in step.outputs), *(substitute_expr(r, mapping) for r in requires)]
    return Step(step.inputs, step.select, merged, _prune(needed, merged))


def reduce_path(inputs: Sequence[str], arcs: Sequence[Arc]) -> Step:
    """The one ``[S; T]`` equivalent to the selects, transforms and routes of ``arcs``, in order.

    A transform output (or requirement) that is undefined on every event means the path never
    delivers: its select is then ``false``.
    """
    step = _reduce(inputs, arcs)
    if any(never_defined(e) for e in (*(e for _, e in step.outputs), *step.requires)):
        return Step(step.inputs, Filter.false(), step.outputs, step.requires)
    return step


def _reduce(inputs: Sequence[str], arcs: Sequence[Arc]) -> Step:
    step = Step.identity(inputs)
    for arc in arcs:
        if isinstance(arc, Select):
            step = then_select(step, arc.filter)
        elif isinstance(arc, Transform):
            step = then_transform(step, arc.outputs)
        elif isinstance(arc, Route):
            step = then_transform(then_select(step, arc.select), arc.outputs, arc.requires)
        else:
            raise FlowError(f"arc {arc.name!r} ({arc.kind}) is not a select or a transform")
    return step


# --------------------------------------------------------------- terminals


def _stateless(arcs: Sequence[Arc]) -> bool:
    return any(isinstance(a, STATELESS) for a in arcs)


def is_entry(g: Graph, space: EventSpace) -> bool:
    return space.is_publication or any(isinstance(a, Expand) for a in g.in_arcs(space.name))


def is_exit(g: Graph, space: EventSpace) -> bool:
    return space.is_subscription or any(isinstance(a, Collapse) for a in g.out_arcs(space.name))


def entry_name(g: Graph, name: str) -> str:
    """The node events enter ``name`` through once rewritten (``name`` or ``name.pub``)."""
    return f"{name}.pub" if _stateless(g.in_arcs(name)) else name


def exit_name(g: Graph, name: str) -> str:
    """The node ``name``'s subscribers read once rewritten (``name`` or ``name.sub``)."""
    return f"{name}.sub" if _stateless(g.out_arcs(name)) else name


# ------------------------------------------------------------------- paths


@dataclass(frozen=True, slots=True)
class RoutePath:
    """One publication point -> subscription point path and its ``[S; T]``."""

    source: str
    sink: str
    via: tuple[str, ...]
    step: Step

    @property
    def shared(self) -> list[Expr]:
        """Subexpressions of both the select and the transform (computed once per event)."""
        in_select = {s for e in expressions_of(self.step.select) for s in subexpressions(e)}
        in_transform = {s for _, e in self.step.outputs for s in subexpressions(e)}
        common = [e for e in in_select & in_transform if isinstance(e, (BinOp, Call))]
        outer = {s for e in common for s in subexpressions(e) if s != e}
        return sorted((e for e in common if e not in outer), key=repr)


def _walk(g: Graph, name: str, arcs: tuple[Arc, ...]) -> Iterator[tuple[str, tuple[Arc, ...]]]:
    space = g.event_space(name)
    if is_exit(g, space):
        yield name, arcs
    for arc in g.out_arcs(name):
        if isinstance(arc, STATELESS):
            yield from _walk(g, arc.target, (*arcs, arc))


def find_paths(g: Graph) -> list[RoutePath]:
    """Every publication point -> subscription point path of selects and transforms, reduced."""
    out: list[RoutePath] = []
    for space in g.spaces:
        if not isinstance(space, EventSpace) or not is_entry(g, space):
            continue
        for sink, arcs in _walk(g, space.name, ()):
            if len(out) >= MAX_PATHS:
                raise FlowError(
                    f"more than {MAX_PATHS} publication-to-subscription paths: too many to rewrite"
                )
            src, dst = entry_name(g, space.name), exit_name(g, sink)
            if not arcs and src == dst:
                continue
            step = reduce_path(list(space.schema), arcs)
            out.append(RoutePath(src, dst, tuple(a.name for a in arcs), step))
    return out


# ----------------------------------------------------------------- rewrite


def _event_nodes(g: Graph, s: EventSpace) -> list[EventSpace]:
    """The nodes an internal event space becomes: itself, ``NAME.pub`` and/or ``NAME.sub``, or none."""
    entry, exit_ = is_entry(g, s), is_exit(g, s)
    pub = entry_name(g, s.name) if entry else None
    sub = exit_name(g, s.name) if exit_ else None
    out: list[EventSpace] = []
    if s.name in (pub, sub):
        publish, subscribe = s.publish and pub == s.name, s.subscribe and sub == s.name
        out.append(EventSpace(s.name, s.schema, "events", publish=publish, subscribe=subscribe))
    if pub is not None and pub != s.name:
        fed = any(isinstance(a, Expand) for a in g.in_arcs(s.name))
        out.append(EventSpace(pub, s.schema, "events" if fed else "source", publish=s.publish and fed))
    if sub is not None and sub != s.name:
        feeds = any(isinstance(a, Collapse) for a in g.out_arcs(s.name))
        out.append(EventSpace(sub, s.schema, "events" if feeds else "sink", subscribe=s.subscribe and feeds))
    return out


def _source_nodes(g: Graph, s: EventSpace) -> list[EventSpace]:
    """A source space, and its exit ``NAME.sub`` if it feeds a collapse and stateless arcs too."""
    if not is_exit(g, s) or exit_name(g, s.name) == s.name:
        return [s]
    return [s, EventSpace(exit_name(g, s.name), s.schema, "events")]


def _nodes(g: Graph) -> list[Space]:
    nodes: dict[str, Space] = {}
    for s in g.spaces:
        if isinstance(s, EventSpace) and s.kind == "events":
            made: list[Space] = list(_event_nodes(g, s))
        elif isinstance(s, EventSpace) and s.kind == "source":
            made = list(_source_nodes(g, s))
        else:
            made = [s]
        for node in made:
            if node.name in nodes:
                raise FlowError(f"space name {node.name!r} clashes with a node the rewrite adds: rename it")
            nodes[node.name] = node
    return list(nodes.values())


def rewrite(g: Graph) -> Graph:
    """The equivalent graph in which every path is one ``[S; T]`` route (stateful arcs kept)."""
    routes: list[Arc] = []
    seen: dict[str, int] = {}
    for path in find_paths(g):
        if not path.step.select.disjuncts:
            continue  # a select that is always false: the path never delivers
        base = f"{path.source}->{path.sink}"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}#{seen[base]}"
        s = path.step
        routes.append(Route(name, path.source, path.sink, s.select, s.outputs, s.requires, path.via))
    stateful: list[Arc] = []
    for arc in g.arcs:
        if isinstance(arc, Collapse):
            stateful.append(Collapse(arc.name, exit_name(g, arc.source), arc.target, arc.rules))
        elif isinstance(arc, Expand):
            stateful.append(Expand(arc.name, arc.source, entry_name(g, arc.target), arc.rules))
    return Graph(
        spaces=tuple(_nodes(g)),
        arcs=(*routes, *stateful),
        functions=g.functions,
        name=g.name,
        input=g.input,
    )


# -------------------------------------------------------- tagged transforms


@dataclass(frozen=True, slots=True)
class TaggedPlan:
    """One select stage over a core space, and the per-(source, subscription point) transforms."""

    source_field: str
    subscriptions: tuple[tuple[str, Filter], ...]
    table: tuple[tuple[tuple[str, str], tuple[Step, ...]], ...]
    functions: Mapping[str, Any]

    def deliver(self, source: str, event: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """What the subscription points receive when ``source`` publishes ``event``."""
        tagged = {**event, self.source_field: source}
        table = dict(self.table)
        out: list[tuple[str, dict[str, Any]]] = []
        for sink, f in self.subscriptions:
            if not f.matches(tagged, functions=self.functions):
                continue
            steps = table.get((source, sink), ())
            for step in steps:
                if len(steps) > 1 and not step.select.matches(event, functions=self.functions):
                    continue
                result = _apply_step(step, event, self.functions)
                if result is not None:
                    out.append((sink, result))
        return out


def _apply_step(step: Step, event: Mapping[str, Any], functions: Mapping[str, Any]) -> dict[str, Any] | None:
    c = Compiler(functions)
    try:
        return dict(c.transform(step.outputs, step.requires)(event, c.new_memo()))
    except Undefined:
        return None


def _free_field(g: Graph) -> str:
    used = {n for s in g.spaces for n in s.schema}
    name = "_source"
    while name in used:
        name = "_" + name
    return name


def tag(g: Graph) -> TaggedPlan:
    """The tagged-transform form of the rewritten ``g`` (pass a graph made by :func:`rewrite`)."""
    field = _free_field(g)
    subs: dict[str, Filter] = {}
    table: dict[tuple[str, str], list[Step]] = {}
    for arc in g.arcs:
        if not isinstance(arc, Route):
            continue
        inputs = tuple(g.space(arc.source).schema)
        step = Step(inputs, arc.select, arc.outputs, arc.requires)
        from_source = Filter((Conjunction((Predicate(field, Op.EQ, arc.source),)),))
        subs[arc.target] = subs.get(arc.target, Filter.false()) | (from_source & arc.select)
        table.setdefault((arc.source, arc.target), []).append(step)
    return TaggedPlan(
        source_field=field,
        subscriptions=tuple(subs.items()),
        table=tuple((k, tuple(v)) for k, v in table.items()),
        functions=g.all_functions,
    )


def route_shared(routes: Sequence[Route]) -> list[Expr]:
    """The subexpressions one per-source router computes once for several uses."""
    exprs: list[Expr] = []
    for r in routes:
        exprs += expressions_of(r.select) + [e for _, e in r.outputs] + list(r.requires)
    return shared_subexpressions(exprs)
