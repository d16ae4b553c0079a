"""Property: on random graphs of selects and transforms, the rewritten graph (and its tagged-transform
form) delivers exactly the same events to every subscription point as the original."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowbus.filters.ast import (
    COMPARISON_OPS,
    SET_OPS,
    STRING_OPS,
    BinOp,
    Call,
    Conjunction,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Op,
    Predicate,
)
from flowbus.filters.substitute import substitute_expr
from flowbus.flow import FlowBuilder, Graph, LocalRun, rewrite, tag
from flowbus.flow.rewrite import entry_name
from strategies import FUNCTIONS

NUMERIC = ("a", "b", "c")
NUMBERS = (-2, -1, 0, 1, 2, 3, 0.5, 1.5, 1e16)
TEXTS = ("a", "b", "IBM", "")


@st.composite
def numeric_exprs(draw: st.DrawFn, fields: list[str], depth: int = 2) -> Expr:
    """A number-valued expression over the numeric ``fields`` (and ``code(s)`` when ``s`` is one of them)."""
    nums = [f for f in fields if f in NUMERIC]
    kind = draw(st.integers(0, 5 if depth > 0 else 1))
    if kind == 0 and nums:
        return Field(draw(st.sampled_from(nums)))
    if kind <= 1:
        return Const(draw(st.sampled_from(NUMBERS)))
    if kind == 2 and "s" in fields:
        return Call("code", (Field("s"),))
    if kind == 3:
        return Call("half", (draw(numeric_exprs(fields, depth - 1)),))
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    return BinOp(op, draw(numeric_exprs(fields, depth - 1)), draw(numeric_exprs(fields, depth - 1)))


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, str]:
    names = draw(st.lists(st.sampled_from([*NUMERIC, "s"]), min_size=1, max_size=4, unique=True))
    return {n: "str" if n == "s" else "float" for n in sorted(names)}


@st.composite
def literals_over(draw: st.DrawFn, fields: list[str]) -> Predicate | ExprPredicate:
    """A literal comparing numbers with numbers or strings with strings (a flow refuses other selects)."""
    nums = [f for f in fields if f in NUMERIC]
    if nums and draw(st.booleans()):  # two numeric expressions, neither a constant (canonical form)
        op = draw(st.sampled_from(sorted(COMPARISON_OPS)))
        left, right = (draw(numeric_exprs(fields).filter(lambda e: not isinstance(e, Const))) for _ in "lr")
        return ExprPredicate(left, op, right, draw(st.booleans()))
    attr = draw(st.sampled_from(fields))
    values = TEXTS if attr == "s" else NUMBERS
    op = draw(st.sampled_from([op for op in Op if attr == "s" or op not in STRING_OPS]))
    value: Any = None
    if op in SET_OPS:
        value = tuple(draw(st.lists(st.sampled_from(values), max_size=3)))
    elif op is not Op.EXISTS:
        value = draw(st.sampled_from(values))
    return Predicate(attr, op, value, draw(st.booleans()))


@st.composite
def filters_over(draw: st.DrawFn, fields: list[str]) -> Filter:
    lits = literals_over(fields)
    conjs = draw(st.lists(st.lists(lits, max_size=2), min_size=1, max_size=2))
    return Filter(tuple(Conjunction(tuple(c)) for c in conjs))


@st.composite
def transforms(draw: st.DrawFn, source: dict[str, str], target: dict[str, str]) -> dict[str, Expr]:
    out: dict[str, Expr] = {}
    for name, kind in target.items():
        if kind == "str":
            out[name] = (
                Field("s") if "s" in source and draw(st.booleans()) else Const(draw(st.sampled_from(TEXTS)))
            )
        else:
            out[name] = draw(numeric_exprs(list(source)))
    return out


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    """Sources, then internal spaces, then sinks, each fed by one to three earlier spaces."""
    n_src, n_mid, n_sink = draw(st.integers(1, 2)), draw(st.integers(0, 4)), draw(st.integers(1, 3))
    b = FlowBuilder("random")
    for name, fn in FUNCTIONS.items():
        b.lookup(name, fn) if isinstance(fn, dict) else b.function(name, fn)
    spaces: list[tuple[str, dict[str, str]]] = []
    for i in range(n_src):
        spaces.append((f"src{i}", draw(schemas())))
        b.source(*spaces[-1])
    arc = 0
    for i in range(n_mid + n_sink):
        name = f"mid{i}" if i < n_mid else f"sink{i - n_mid}"
        parents = draw(st.lists(st.integers(0, len(spaces) - 1), min_size=1, max_size=3))
        schema = dict(spaces[parents[0]][1]) if draw(st.booleans()) else draw(schemas())
        if i < n_mid:
            b.events(name, schema, publish=draw(st.booleans()), subscribe=draw(st.booleans()))
        else:
            b.sink(name, schema)
        for p in parents:
            src, src_schema = spaces[p]
            arc += 1
            if src_schema == schema and draw(st.booleans()):
                b.select(f"s{arc}", src, name, draw(filters_over(list(schema))))
            else:
                outputs = draw(transforms(src_schema, schema))
                b.transform(f"t{arc}", src, name, outputs)  # type: ignore[arg-type]
        if i < n_mid:
            spaces.append((name, schema))
    return b.build()


def _value(kind: str) -> st.SearchStrategy[Any]:
    return st.sampled_from(TEXTS) if kind == "str" else st.sampled_from(NUMBERS)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Graph, list[tuple[str, dict[str, Any]]]]:
    g = draw(graphs())
    points = [s for s in g.spaces if getattr(s, "is_publication", False)]
    events = []
    for _ in range(draw(st.integers(1, 12))):
        space = draw(st.sampled_from(points))
        events.append((space.name, {n: draw(_value(t.__name__)) for n, t in space.schema.fields.items()}))
    return g, events


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_rewritten_graph_delivers_the_same_events(
    case: tuple[Graph, list[tuple[str, dict[str, Any]]]],
) -> None:
    g, events = case
    r = rewrite(g)
    original = LocalRun(g).run(events).outputs
    assert LocalRun(r).run(events).outputs == original
    assert set(original) == {s.name for s in r.spaces if getattr(s, "is_subscription", False)}
    plan = tag(r)
    for space, event in events:
        one = LocalRun(r)
        one.publish(space, event)
        got: dict[str, list[Any]] = {}
        validated = g.event_space(space).schema.validate(event)
        for sink, out in plan.deliver(entry_name(g, space), validated):
            got.setdefault(sink, []).append(out)
        assert got == {k: v for k, v in one.outputs.items() if v}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_substituted_expression_evaluates_as_the_composition(data: st.DataObject) -> None:
    inner = {n: data.draw(numeric_exprs(["a", "b", "s"])) for n in NUMERIC}
    outer = data.draw(numeric_exprs(list(NUMERIC)))
    event = {"a": data.draw(_value("float")), "b": data.draw(_value("float")), "s": data.draw(_value("str"))}
    try:
        middle = {n: e.evaluate(event, FUNCTIONS) for n, e in inner.items()}
        expected = outer.evaluate(middle, FUNCTIONS)
    except Exception:
        return  # undefined somewhere: the composition only promises equality where all is defined
    assert substitute_expr(outer, inner).evaluate(event, FUNCTIONS) == expected
