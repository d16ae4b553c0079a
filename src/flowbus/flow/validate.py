"""Validating an information flow graph (000 document, section 2, "Dataflows").

How it works: :func:`validate_graph` runs when a :class:`~flowbus.flow.graph.Graph`
is built and raises :class:`FlowError` at the first problem, naming the arc or
space. It checks, in order:

1. every arc joins two existing spaces of the right kinds -- select, transform
   and route: event history to event history; collapse: event history to state;
   expand: state to event history;
2. sources have only out-arcs, sinks only in-arcs, a state exactly one in-arc
   (a collapse); the graph is acyclic (a cycle is printed space by space);
3. a select keeps the schema and its filter reads only the space's fields;
4. a transform's outputs are exactly the target schema's fields, each an
   expression over the source's fields whose type can fit the target field;
5. collapse and expand rule sets fit their event schema and state (the key, the
   components they set, every name they read, every function they call); an
   expand must be able to build whole events: its key expressions are plain
   fields and every other event field is read by some rule;
6. an expand can make every row its state's collapse makes (000 document,
   section 2: "we restrict the language to avoid the case in which there is no
   possible event sequence"). Reachability of rows under arbitrary rules is not
   decidable in general, so two forms are accepted, each with its proof:

   * **replay**: the expand has the collapse's rule set, and each field of its
     events is a field of the collapse's events of the same type (an int may
     feed a float): the events the collapse folded are themselves an expansion;
   * **any row in one event**: the expand's first rule has no ``when`` (so every
     event fires it; later rules never fire) and sets every component the arc
     tracks from an event field of its own, not the key, of the component's
     type: one event takes any row to any row.

   Anything else is refused, naming the expand and the collapse and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowbus.errors import FlowError
from flowbus.filters.ast import Field, Filter
from flowbus.filters.text import expr_to_text
from flowbus.flow.collapse import BoundRules
from flowbus.flow.expand import expander
from flowbus.flow.infer import article, check_assign, check_expr, check_filter, hint
from flowbus.model import Value

if TYPE_CHECKING:
    from flowbus.flow.graph import Arc, Collapse, Expand, Graph, Outputs, Space, StateSpace

__all__ = ["bind_rules", "replays_collapse", "validate_graph"]


def validate_graph(g: Graph) -> None:
    for arc in g.arcs:
        _check_endpoints(g, arc)
    _check_degrees(g)
    _check_acyclic(g)
    for arc in g.arcs:
        _check_arc(g, arc)


def _describe(arc: Arc) -> str:
    return f"{arc.kind} arc {arc.name!r}"


def _check_endpoints(g: Graph, arc: Arc) -> None:
    from flowbus.flow.graph import Collapse, EventSpace, Expand, StateSpace

    where = _describe(arc)
    names = [s.name for s in g.spaces]
    for end, name in (("from", arc.source), ("to", arc.target)):
        if not g.has_space(name):
            raise FlowError(
                f"{where}: {end} unknown space {name!r}{hint(name, names)} (spaces: {', '.join(names)})"
            )
    source, target = g.space(arc.source), g.space(arc.target)
    want_source = StateSpace if isinstance(arc, Expand) else EventSpace
    want_target = StateSpace if isinstance(arc, Collapse) else EventSpace
    for end, space, want in (("from", source, want_source), ("to", target, want_target)):
        if not isinstance(space, want):
            what = "a state" if want is StateSpace else "an event history"
            raise FlowError(f"{where}: {end} space {space.name!r} must be {what}")


def _check_degrees(g: Graph) -> None:
    from flowbus.flow.graph import Collapse, EventSpace

    for s in g.spaces:
        ins, outs = g.in_arcs(s.name), g.out_arcs(s.name)
        if isinstance(s, EventSpace):
            if s.kind == "source" and ins:
                raise FlowError(
                    f"source {s.name!r} has an in-arc ({ins[0].name}): sources have only out-arcs"
                )
            if s.kind == "sink" and outs:
                raise FlowError(f"sink {s.name!r} has an out-arc ({outs[0].name}): sinks have only in-arcs")
            continue
        if len(ins) != 1:
            got = ", ".join(a.name for a in ins) or "none"
            raise FlowError(f"state {s.name!r} must have exactly one in-arc, a collapse (has: {got})")
        if not isinstance(ins[0], Collapse):
            raise FlowError(f"state {s.name!r}: its in-arc {ins[0].name!r} is not a collapse")


def _check_acyclic(g: Graph) -> None:
    color: dict[str, int] = {}
    stack: list[tuple[str, str]] = []  # (space, arc taken out of it)

    def visit(name: str) -> None:
        color[name] = 1
        for arc in g.out_arcs(name):
            stack.append((name, arc.name))
            if color.get(arc.target) == 1:
                start = next(i for i, (s, _) in enumerate(stack) if s == arc.target)
                loop = " -> ".join(f"{s} ({a})" for s, a in stack[start:])
                raise FlowError(f"the graph has a cycle: {loop} -> {arc.target}")
            if arc.target not in color:
                visit(arc.target)
            stack.pop()
        color[name] = 2

    for s in g.spaces:
        if s.name not in color:
            visit(s.name)


def _check_arc(g: Graph, arc: Arc) -> None:
    from flowbus.flow.graph import Collapse, Expand, Route, Select, Transform

    where = _describe(arc)
    functions = g.all_functions
    if isinstance(arc, Collapse):
        bind_rules(g, arc)
        return
    if isinstance(arc, Expand):
        _check_reach(g, arc, bind_rules(g, arc))
        return
    source, target = g.event_space(arc.source), g.event_space(arc.target)
    types = dict(source.schema.fields)
    if isinstance(arc, Select):
        if dict(source.schema.fields) != dict(target.schema.fields):
            raise FlowError(
                f"{where}: a select keeps the schema, but {source.name!r} is {_schema(source)} "
                f"and {target.name!r} is {_schema(target)}"
            )
        check_filter(arc.filter, types, functions, where)
        return
    if isinstance(arc, Route):
        check_filter(arc.select, types, functions, f"{where} (select)")
        for e in arc.requires:
            check_expr(e, types, functions, f"{where} (requires)")
    assert isinstance(arc, (Transform, Route))
    _check_outputs(g, where, arc.outputs, source, target)


def _schema(space: Space) -> str:
    return "[" + ", ".join(f"{n}: {t.__name__}" for n, t in space.schema.fields.items()) + "]"


def _check_outputs(g: Graph, where: str, outputs: Outputs, source: Space, target: Space) -> None:
    names = [n for n, _ in outputs]
    missing = [n for n in target.schema if n not in names]
    extra = [n for n in names if n not in target.schema]
    if extra:
        raise FlowError(
            f"{where}: output {extra[0]!r} is not a field of {target.name!r}{hint(extra[0], target.schema)} "
            f"{_schema(target)}"
        )
    if missing:
        raise FlowError(f"{where}: no output for {', '.join(missing)} of {target.name!r} {_schema(target)}")
    if len(set(names)) != len(names):
        raise FlowError(f"{where}: an output is given twice")
    types = dict(source.schema.fields)
    for name, e in outputs:
        kinds = check_expr(e, types, g.all_functions, f"{where}: output {name!r}")
        check_assign(kinds, target.schema.type_of(name), f"{where}: output {name!r}", e)


def bind_rules(g: Graph, arc: Arc) -> BoundRules:
    """The rule set of a collapse or expand arc, bound to its event schema and state layout."""
    from flowbus.flow.graph import Collapse, Expand

    assert isinstance(arc, (Collapse, Expand))
    where = _describe(arc)
    if isinstance(arc, Collapse):
        events, state = g.event_space(arc.source), g.state_space(arc.target)
        components = state.components
    else:
        events, state = g.event_space(arc.target), g.state_space(arc.source)
        sets = arc.rules.sets()
        components = tuple(c for c in state.components if c in sets)
    bound = BoundRules(
        arc.rules,
        event=events.schema,
        state=state.schema,
        key_names=state.key,
        components=components,
        initial=_project(state, components),
        functions=g.functions,
        where=where,
    )
    if isinstance(arc, Expand):
        _check_expandable(bound, where)
    return bound


def _project(state: StateSpace, components: tuple[str, ...]) -> tuple[Value, ...]:
    initial = dict(state.initial)
    return tuple(initial[c] for c in components)


def _check_expandable(bound: BoundRules, where: str) -> None:
    """An expand builds whole events: key fields from the key, every other field read by a rule."""
    keyed = set()
    for name, e in bound.ruleset.key:
        if not isinstance(e, Field):
            raise FlowError(
                f"{where}: key {name!r} is computed from the event; an expand needs a plain field"
            )
        keyed.add(e.name)
    reads = frozenset().union(*(r.reads() for r in bound.ruleset.rules))
    read = {n[6:] if n.startswith("event.") else n for n in reads}
    for name in bound.event:
        if name not in keyed and name not in read:
            raise FlowError(
                f"{where}: event field {name!r} is read by no rule, so expand cannot choose its value"
            )


def _collapse_of(g: Graph, arc: Expand) -> Collapse:
    from flowbus.flow.graph import Collapse

    collapse = g.in_arcs(arc.source)[0]
    assert isinstance(collapse, Collapse)  # checked with the degrees
    return collapse


def replays_collapse(g: Graph, collapse: Collapse, arc: Expand) -> bool:
    """Are the events ``collapse`` folds, as they are, events of expand ``arc`` with the same effect?"""
    return _why_not_replay(g, collapse, arc) is None


def _why_not_replay(g: Graph, collapse: Collapse, arc: Expand) -> str | None:
    if (arc.rules.key, arc.rules.rules) != (collapse.rules.key, collapse.rules.rules):  # names aside
        return "its rules are not the collapse's"
    folded, made = g.event_space(collapse.source).schema, g.event_space(arc.target).schema
    for name, kind in made.fields.items():
        had = folded.type_of(name) if name in folded else None
        if had is not kind and not (had is int and kind is float):
            was = "not in" if had is None else f"{article(frozenset({had}))} in"
            return f"{name!r} is {was} the collapse's events, {article(frozenset({kind}))} in the expand's"
    return None


def _why_not_any_row(g: Graph, arc: Expand, bound: BoundRules) -> str | None:
    """Why the first rule of ``bound`` cannot take any row to any row in one event (None: it can)."""
    rule = bound.ruleset.rules[0]
    if rule.when != Filter.true():
        return "its first rule has a `when`"
    state = g.state_space(arc.source).schema
    sets = dict(rule.sets)
    x = expander(bound)
    used: dict[str, str] = {}
    for column in bound.components:
        if column not in sets:
            return f"its first rule does not set {column!r}"
        e = sets[column]
        field = x.event_field(e)
        if field is None:
            return f"its first rule sets {column!r} to `{expr_to_text(e)}`, not to a field of the event"
        if field in x.keyed:
            return f"its first rule sets {column!r} from {field!r}, the key"
        if field in used:
            return f"its first rule sets {used[field]!r} and {column!r} from one field, {field!r}"
        used[field] = column
        kind, given = state.type_of(column), bound.event.type_of(field)
        if given is not kind:
            kinds = article(frozenset({kind})), article(frozenset({given}))
            return f"its first rule sets {column!r} ({kinds[0]}) from {field!r}, {kinds[1]}"
    return None


def _check_reach(g: Graph, arc: Expand, bound: BoundRules) -> None:
    """The expand can make every row its collapse makes (see the module notes, 6), else FlowError."""
    collapse = _collapse_of(g, arc)
    replay = _why_not_replay(g, collapse, arc)
    if replay is None:
        return
    any_row = _why_not_any_row(g, arc, bound)
    if any_row is None:
        return
    raise FlowError(
        f"{_describe(arc)} cannot be shown to make every row {_describe(collapse)} makes in state "
        f"{arc.source!r}: {replay}, and {any_row}. An expand is accepted when it has the collapse's rule "
        "set over events of the same field types, or when its first rule has no `when` and sets every "
        "component it tracks from an event field of its own (not the key) of the component's type"
    )
