"""One value semantics at the edges, in the plain evaluator and the compiled closures: ints past
2**53 and huge ints compare exactly, numpy scalars and decimals are numbers, None is a missing
attribute, and a function that raises makes its predicate undefined."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.filters import parse
from flowbus.filters.ast import Conjunction, Filter, Op, Predicate
from flowbus.filters.compile import Compiler
from strategies import reference_compare

T0 = 1_700_000_000_000_000_000
EDGE_INTS = (
    0,
    3,
    2**53 - 1,
    2**53,
    2**53 + 1,
    2**53 + 2,
    T0,
    T0 + 1,
    2**63 - 1,
    2**63,
    2**63 + 1,
    -(2**63),
    -(2**63) - 1,
    2**64 + 1,
    10**400,
    -(10**400),
)
EDGE_FLOATS = (0.5, float(2**53), 2.0**53 + 2, float(T0), 2.0**63, -(2.0**63), 1e300, math.inf, -math.inf)
CONSTANTS = EDGE_INTS + EDGE_FLOATS[:-2]
OPS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)


def evaluators(f: Filter, functions: Mapping[str, Any] | None = None) -> list[Callable[[Any], bool]]:
    """The plain evaluator and the compiled closure of ``f``."""
    c = Compiler(functions or {})
    fn = c.filter(f)
    return [lambda e: f.matches(e, functions=functions), lambda e: fn(e, c.new_memo())]


def answers(text: str, event: Mapping[str, Any], functions: Mapping[str, Any] | None = None) -> set[bool]:
    return {ev(event) for ev in evaluators(parse(text), functions)}


# ------------------------------------------------------------------ item 1: ints past 2**53


def test_ints_past_2_53_compare_exactly() -> None:
    assert answers(f"ts > {T0}", {"ts": T0 + 1}) == {True}
    assert answers(f"ts >= {T0 + 1}", {"ts": T0}) == {False}
    assert answers("x = 9007199254740993", {"x": 9007199254740992.0}) == {False}
    assert answers("x < 9007199254740993", {"x": 9007199254740992.0}) == {True}
    assert answers("x > 9007199254740992", {"x": 9007199254740993}) == {True}
    assert answers("x != 9007199254740992", {"x": 9007199254740993}) == {True}
    assert answers(f"a * b > {2**106}", {"a": 2**53 + 1, "b": 2**53}) == {True}


@pytest.mark.parametrize("op", OPS)
def test_every_int_and_float_pair_compares_as_python_does(op: Op) -> None:
    for c in CONSTANTS:
        f = Filter((Conjunction((Predicate("x", op, c),)),))
        plain, compiled = evaluators(f)
        for v in EDGE_INTS + EDGE_FLOATS + (math.nan,):
            want = reference_compare(v, op.value, c)
            assert plain({"x": v}) == want and compiled({"x": v}) == want, (v, op, c)


# ------------------------------------------------------------------ item 3: foreign number types


FOREIGN = [
    (np.int64(5), 5),
    (np.int8(-3), -3),
    (np.uint64(2**64 - 1), 2**64 - 1),
    (np.int64(T0 + 1), T0 + 1),
    (np.float64(2.5), 2.5),
    (np.float32(0.5), 0.5),
    (Decimal(5), 5),
    (Decimal("5.000"), 5),
    (Decimal("0.1"), 0.1),
    (Decimal(T0 + 1), T0 + 1),
    (Decimal("NaN"), math.nan),
    (Decimal("-Infinity"), -math.inf),
    (Fraction(7, 2), 3.5),
    (np.bool_(True), True),
    (np.str_("IBM"), "IBM"),
]


@pytest.mark.parametrize(("foreign", "python"), FOREIGN, ids=[repr(f) for f, _ in FOREIGN])
def test_numpy_scalars_and_decimals_are_the_python_value(foreign: Any, python: Any) -> None:
    got = _python(foreign)
    assert type(got) is type(python) and (got == python or (math.isnan(got) and math.isnan(python)))
    texts = ["x = 5", "x != 5", "x > 3", "x < 3.5", f"x >= {T0 + 1}", "x = true", 'x = "IBM"', "x * 2 > 6"]
    for text in texts:
        assert answers(text, {"x": foreign}) == answers(text, {"x": python}), text


def test_the_issue_s_numpy_example() -> None:
    assert answers("x = 5", {"x": np.int64(5)}) == {True}
    assert answers("x != 5", {"x": np.int64(5)}) == {False}
    assert answers("x > 3", {"x": np.int64(5)}) == {True}
    assert answers("x > 3", {"x": Decimal("3.5")}) == {True}


# ------------------------------------------------------------------ item 4: huge ints


def test_huge_ints_are_ints() -> None:
    assert answers("x > 5", {"x": 10**400}) == {True}
    assert answers("x < 1e300", {"x": 10**400}) == {False}
    assert answers("x > " + "9" * 400, {"x": 10**400}) == {True}
    assert answers("x > " + "9" * 400, {"x": math.inf}) == {True}
    assert answers("x = " + "9" * 400, {"x": 10**400 - 1}) == {True}
    assert answers("x * x > 5", {"x": 10**400}) == {True}
    assert answers("x / 3 > 5", {"x": 10**400}) == {False}  # the quotient overflows: undefined
    assert answers("!(x / 3 > 5)", {"x": 10**400}) == {True}


def test_canonical_values_and_the_doubles_around_a_number() -> None:
    from flowbus.filters.values import canonical, ceil_double, floor_double

    for foreign, _ in FOREIGN:
        got, want = canonical(foreign), _python(foreign)
        assert type(got) is type(want) and (got == want or got != got), foreign
    assert floor_double(2**53 + 1) == 2.0**53 and ceil_double(2**53 + 1) == 2.0**53 + 2
    assert floor_double(10**400) == 1.7976931348623157e308 and ceil_double(10**400) == math.inf
    assert floor_double(-(10**400)) == -math.inf and ceil_double(-(10**400)) == -1.7976931348623157e308
    assert floor_double(2**63) == ceil_double(2**63) == 2.0**63
    assert floor_double(0.1) == ceil_double(0.1) == 0.1


# ------------------------------------------------------------------ item 5: functions that raise


def _first(s: str) -> str:
    return s[0]


class _Picky(dict[Any, Any]):
    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError(f"no {key!r} here")


@pytest.mark.parametrize(
    ("functions", "text", "event"),
    [
        ({"first": _first}, 'first(issue) = "I"', {"issue": ""}),
        ({"first": _first}, 'first(issue) = "I"', {"issue": 5}),
        ({"boom": lambda x: 1 / 0 if x else _raise(OSError("disk"))}, "boom(x) = 1", {"x": 0}),
        ({"table": _Picky()}, "table(x) = 1", {"x": 1}),
    ],
)
def test_a_function_that_raises_makes_its_predicate_undefined(
    functions: Mapping[str, Any], text: str, event: dict[str, Any]
) -> None:
    assert answers(text, event, functions) == {False}
    assert answers(f"!({text})", event, functions) == {True}


def _raise(exc: Exception) -> Any:
    raise exc


def test_a_function_returning_a_numpy_scalar_returns_the_number() -> None:
    functions = {"half": lambda x: np.float64(x) / 2, "none": lambda x: None}
    assert answers("half(x) = 2.5", {"x": 5}, functions) == {True}
    assert answers("none(x) = 1", {"x": 5}, functions) == {False}
    assert answers("!(none(x) = 1)", {"x": 5}, functions) == {True}


# ------------------------------------------------------------------ item 6: None is missing


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("x != 5", False),
        ("x not in {1, 2}", False),
        ("exists x", False),
        ("not exists x", True),
        ("!(x = 5)", True),
        ("x + 1 > 0", False),
        ("!(x + 1 > 0)", True),
        ('x < "a"', False),
    ],
)
def test_none_is_a_missing_attribute(text: str, want: bool) -> None:
    assert answers(text, {"x": None}) == {want}
    assert answers(text, {}) == {want}


# ------------------------------------------------------------------ the property


edge_values = st.sampled_from((*EDGE_INTS, *EDGE_FLOATS, math.nan, None, "a", True, *(f for f, _ in FOREIGN)))


@st.composite
def edge_filters(draw: st.DrawFn) -> Filter:
    lits = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from((*OPS, Op.IN, Op.NOT_IN, Op.EXISTS)))
        value: Any = draw(st.sampled_from(CONSTANTS))
        if op in (Op.IN, Op.NOT_IN):
            value = tuple(draw(st.lists(st.sampled_from(CONSTANTS), min_size=1, max_size=3)))
        elif op is Op.EXISTS:
            value = None
        lits.append(Predicate(draw(st.sampled_from("xy")), op, value, draw(st.booleans())))
    return Filter((Conjunction(tuple(lits)),))


def _python(v: Any) -> Any:
    """The Python value ``v`` stands for, per the docs (written apart from flowbus)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (Decimal, Fraction)):
        if isinstance(v, Decimal) and not v.is_finite():
            return math.nan if v.is_nan() else float(v)
        return int(v) if v == int(v) else float(v)
    return v


def _reference(f: Filter, event: Mapping[str, Any]) -> bool:
    """``f`` on ``event`` from the documented rules, with Python's own comparisons."""
    plain = {k: _python(v) for k, v in event.items() if v is not None}

    def literal(p: Predicate) -> bool:
        if p.attr not in plain:
            holds = False
        elif p.op is Op.EXISTS:
            holds = True
        elif p.op in (Op.IN, Op.NOT_IN):
            member = any(reference_compare(plain[p.attr], "=", m) for m in p.value)  # type: ignore[union-attr]
            holds = member if p.op is Op.IN else not member
        else:
            holds = reference_compare(plain[p.attr], p.op.value, p.value)
        return holds != p.negated

    return any(all(literal(p) for p in c.simple) for c in f.disjuncts)


@settings(max_examples=300, deadline=None)
@given(f=edge_filters(), events=st.lists(st.dictionaries(st.sampled_from("xy"), edge_values), max_size=8))
def test_plain_and_compiled_agree_with_the_rules_on_edge_values(
    f: Filter, events: list[dict[str, Any]]
) -> None:
    plain, compiled = evaluators(f)
    for event in events:
        want = _reference(f, event)
        assert plain(event) == want and compiled(event) == want, (f.to_text(), event)
