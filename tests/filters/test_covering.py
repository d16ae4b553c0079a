"""covers(f, g): sound always, complete for conjunctions of simple predicates; with overlaps, sound
past 2**53 and near 2**63 too (numbers compare exactly everywhere)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError
from flowbus.filters import parse
from flowbus.filters.ast import Conjunction, Filter, Op, Predicate
from flowbus.filters.covering import covers, overlaps
from strategies import (
    ALL_OPS,
    FUNCTIONS,
    SIMPLE_OPS,
    canonical_filters,
    conjunction_filters,
    events,
    filters,
    simple_predicates,
)

from .grid import ATTRS, MISSING, NUMS, STRS, increment

COVERS = [
    ("x > 1", "x > 2"),
    ("x >= 1 & x <= 5", "x in {1, 2, 5}"),
    ("x >= 1 & x <= 5", "x between 2 and 3"),
    ("x != 3", "x > 3"),
    ("x != 3", "x = true"),
    ("x != 3", 'x prefix "a"'),
    ("x not in {1, 2}", "x != 1 & x != 2"),
    ("x != 1 & x != 2", "x not in {1, 2}"),
    ("x > 1 & x < 3 & x != 2", "x in {1.5, 2.5}"),
    ('x prefix "ab"', 'x = "abc"'),
    ('x prefix "ab"', 'x prefix "abc"'),
    ('x prefix "ab"', 'x >= "ab" & x < "ac"'),
    ('x prefix "a"', 'x > "a" & x < "b"'),
    ('x < "b"', 'x prefix "a"'),
    ('x prefix "a\U0010ffff"', 'x >= "a\U0010ffff" & x < "b"'),
    ('x = "a"', 'x >= "a" & x < "a\\u0000"'),
    ('x in {"a", "a\\u0000"}', 'x >= "a" & x <= "a\\u0000"'),
    ("x = 1", 'x > "a" & x < "a\\u0000"'),
    ("x = 1", "x > 2 & x < 1"),
    ("x = 1", "x in {}"),
    ("exists x", "x = 1"),
    ("exists x", "x != 1"),
    ("x = 1 | y = 2", "x = 1 & z = 3"),
    ("!(x < 5)", "not exists x"),
    ("!(x < 5)", 'x = "a"'),
    ("!(x < 5)", "x >= 5"),
    ("!(x = 1)", "x != 1"),
    ("!(x = 1)", "x = 2 | not exists x"),
    ("x != 1", "!(x = 1) & exists x"),
    ('x contains "b"', 'x prefix "ab"'),
    ('x contains "b"', 'x suffix "abc"'),
    ('x suffix "c"', 'x suffix "bc"'),
    ('x suffix "c"', 'x in {"abc", "c"}'),
    ('x suffix ""', 'x > "q"'),
    ('!(x contains "ab")', '!(x contains "b")'),
    ('!(x suffix "abc")', '!(x suffix "bc")'),
    ('!(x suffix "abc")', '!(x contains "b")'),
    ('x suffix "c" & x prefix "a"', 'x = "abc"'),
    ("a * b > 3", "a * b > 3 & x = 1"),
    ("!(a * b > 3)", "!(a * b > 3) & x = 1"),
    ("true", "x = 1"),
    ("x = 1", "false"),
    ("false", "false"),
    ("true", "true"),
]

NOT_COVERS = [
    ("x > 2", "x > 1"),
    ("x > 1", "x >= 1"),
    ("x = 1", "exists x"),
    ("x < 10", "x != 1"),  # NaN, strings, booleans
    ("x < 10", "x < 5 | x = true"),
    ("x != 1", "y = 2"),
    ("x != 1", "x in {1, 2}"),
    ('x prefix "ab"', 'x >= "ab" & x <= "ac"'),
    ('x prefix "ab"', 'x prefix "a"'),
    ('x < "b"', 'x <= "b"'),
    ("x > 1", 'x > "a"'),
    ("exists x", "!(x = 1)"),
    ("!(x < 5)", "x > 4"),
    ('x suffix "c"', 'x in {"abc", "cd"}'),
    ('x contains "b"', 'x prefix "a"'),
    ("a * b > 3", "a * b > 4"),
    ("x = 1", "true"),
    ("false", "x = 1"),
]


@pytest.mark.parametrize(("f", "g"), COVERS)
def test_covers(f: str, g: str) -> None:
    assert covers(parse(f), parse(g))
    assert parse(f).covers(parse(g))


@pytest.mark.parametrize(("f", "g"), NOT_COVERS)
def test_does_not_cover(f: str, g: str) -> None:
    assert not covers(parse(f), parse(g))


def test_several_disjuncts_in_f_are_sound_but_not_complete() -> None:
    # x in {1, 2} is covered by the union, not by either conjunction: documented as not found.
    assert not covers(parse("x = 1 | x = 2"), parse("x in {1, 2}"))


# --------------------------------------------------------------- soundness


def _safe_and(f: Filter, g: Filter) -> Filter | None:
    try:
        return f & g
    except FilterError:  # the product grew past MAX_CONJUNCTIONS
        return None


any_filters = st.one_of(filters(), canonical_filters(), conjunction_filters(simple_only=False))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[Filter, Filter, bool]:
    """(f, g, known): ``known`` when f covers g by construction."""
    kind = draw(st.integers(0, 3))
    f = draw(any_filters)
    if kind == 0:
        g = _safe_and(f, draw(any_filters))
        return (f, g, True) if g is not None else (f, draw(any_filters), False)
    if kind == 1:
        return f | draw(any_filters), f, True
    if kind == 2 and f.disjuncts:
        lits = f.disjuncts[0].literals
        keep = draw(st.lists(st.sampled_from(lits), unique=True)) if lits else []
        return Filter((Conjunction(tuple(keep)),)), Filter((f.disjuncts[0],)), True
    return f, draw(any_filters), False


@settings(max_examples=300, deadline=None)
@given(pair=pairs(), evs=st.lists(events(), min_size=20, max_size=40))
def test_covering_is_sound(pair: tuple[Filter, Filter, bool], evs: list[dict[str, Any]]) -> None:
    f, g, known = pair
    result = covers(f, g)
    if known:
        assert result, (str(f), str(g))
    if result:
        for e in evs:
            if g.matches(e, functions=FUNCTIONS):
                assert f.matches(e, functions=FUNCTIONS), (str(f), str(g), e)


# ------------------------------------------------------------ completeness


def _constants(*fs: Filter) -> list[Any]:
    """The constants of ``fs`` (a list: a set would merge ``1`` and ``true``)."""
    out: list[Any] = []
    for f in fs:
        for conj in f.disjuncts:
            for lit in conj.simple:
                out.extend(lit.value if isinstance(lit.value, tuple) else (lit.value,))
    return [v for v in out if v is not None]


def _candidates(*fs: Filter) -> list[Any]:
    """One value in each region the constants cut the value domain into, and the attribute missing."""
    out: list[Any] = ["", True, False, math.nan, MISSING]
    for v in _constants(*fs):
        if type(v) in (int, float):
            out += [v, v - 0.5, v + 0.5]
        elif type(v) is str:
            out += [v, v + "\0", v + "a"]
            nxt = increment(v)
            out += [nxt, nxt + "\0"] if nxt is not None else []
    return out


def _witness(f: Filter, g: Filter) -> dict[str, Any] | None:
    """An event g matches and f does not, among the candidate values."""
    values = _candidates(f, g)
    for combo in itertools.product(values, repeat=len(ATTRS)):
        e = {k: v for k, v in zip(ATTRS, combo, strict=True) if v is not MISSING}
        if g.matches(e) and not f.matches(e):
            return e
    return None


simple = conjunction_filters(max_preds=3, simple_only=True, attrs=ATTRS, nums=NUMS, strs=STRS)


@settings(max_examples=300, deadline=None)
@given(f=simple, g=simple)
def test_covering_is_complete_for_simple_conjunctions(f: Filter, g: Filter) -> None:
    witness = _witness(f, g)
    assert covers(f, g) == (witness is None), (str(f), str(g), witness)


@st.composite
def negated_conjunctions(draw: st.DrawFn) -> Filter:
    preds = st.lists(simple_predicates(SIMPLE_OPS, ATTRS, NUMS, STRS, negated=True), max_size=3)
    return Filter((Conjunction(tuple(draw(preds))),))


@settings(max_examples=200, deadline=None)
@given(f=negated_conjunctions(), g=negated_conjunctions())
def test_covering_is_complete_with_negated_simple_predicates(f: Filter, g: Filter) -> None:
    witness = _witness(f, g)
    assert covers(f, g) == (witness is None), (str(f), str(g), witness)


@settings(max_examples=200, deadline=None)
@given(
    f=st.lists(simple_predicates(ALL_OPS, ATTRS, NUMS, STRS, negated=True), max_size=3),
    g=st.lists(simple_predicates(ALL_OPS, ATTRS, NUMS, STRS, negated=True), max_size=3),
)
def test_string_tests_are_sound_on_the_candidate_grid(f: list[Predicate], g: list[Predicate]) -> None:
    ff, gg = Filter((Conjunction(tuple(f)),)), Filter((Conjunction(tuple(g)),))
    if covers(ff, gg):
        assert _witness(ff, gg) is None, (str(ff), str(gg))


def test_false_covers_an_unsatisfiable_conjunction() -> None:
    from flowbus.filters import Filter, parse

    assert Filter.false().covers(parse("a = 0 & a = 1"))
    assert not Filter.false().covers(parse("a = 0"))


# ------------------------------------------------- past 2**53 and near 2**63

BIG = (2**53 - 1, 2**53, 2**53 + 1, 2**53 + 2, 2**53 + 3, 2**63 - 1, 2**63, 2**63 + 1, 2**64 + 1)
BIG_FLOATS = (2.0**53, 2.0**53 + 2, 2.0**53 + 4, 2.0**63, math.nextafter(2.0**63, math.inf), 2.0**64)


def _near(constants: list[Any]) -> list[Any]:
    """Values around each number: its neighbouring ints, and the doubles on either side of it."""
    out: list[Any] = [math.nan, "a", MISSING]
    for c in constants:
        if type(c) in (int, float):
            n = int(c)
            d = float(c)
            out += [n - 1, n, n + 1, d, math.nextafter(d, math.inf), math.nextafter(d, -math.inf)]
    return out


@st.composite
def big_conjunctions(draw: st.DrawFn) -> Filter:
    nums = st.sampled_from(BIG + BIG_FLOATS)
    lits = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(SIMPLE_OPS[:-1]))
        value: Any = None if op is Op.EXISTS else draw(nums)
        if op in (Op.IN, Op.NOT_IN):
            value = tuple(draw(st.lists(nums, min_size=1, max_size=3)))
        lits.append(Predicate("x", op, value, draw(st.integers(0, 3)) == 0))
    return Filter((Conjunction(tuple(lits)),))


@pytest.mark.parametrize(
    ("f", "g"),
    [("x > 9007199254740992", "x = 9007199254740993"), ("x <= 9007199254740992", "x = 9007199254740993")],
)
def test_the_issue_s_examples_hold_under_exact_numbers(f: str, g: str) -> None:
    event = {"x": 9007199254740993}
    assert covers(parse(f), parse(g)) == parse(f).matches(event)
    assert overlaps(parse(f), parse(g)) == (parse(f).matches(event) and parse(g).matches(event))


@settings(max_examples=400, deadline=None)
@given(f=big_conjunctions(), g=big_conjunctions())
def test_covering_and_overlap_are_sound_near_2_53_and_2_63(f: Filter, g: Filter) -> None:
    """If f covers g, every event g matches f matches; if they do not overlap, no event matches both
    (the plain evaluator decides, on the ints and doubles around every constant)."""
    does_cover, does_overlap = covers(f, g), overlaps(f, g)
    for v in _near(_constants(f, g)):
        e = {} if v is MISSING else {"x": v}
        in_f, in_g = f.matches(e), g.matches(e)
        assert not (does_cover and in_g and not in_f), (str(f), str(g), e)
        assert does_overlap or not (in_f and in_g), (str(f), str(g), e)
