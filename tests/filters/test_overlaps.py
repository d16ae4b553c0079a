"""overlaps(f, g): never False when some event matches both (sound), and exact for filters of
simple predicates, checked against brute force over a small grid of values."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.filters import parse
from flowbus.filters.ast import Conjunction, Filter, Predicate
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

OVERLAP = [
    ("x > 1", "x < 3"),
    ("x >= 2", "x <= 2"),
    ("x > 1 & x < 2", "x > 1.5"),
    ('s = "a"', 'y = "b"'),
    ('s prefix "ab"', 's > "abc"'),
    ("x != 1", "x = 2"),
    ("x not in {1, 2}", "x in {2, 3}"),
    ("!(x < 5)", "not exists x"),
    ("x = 1 | y = 2", "x = 3 & y = 2"),
    ("true", "x = 1"),
    ('s contains "b"', 's prefix "a"'),
    ("x + 1 > y", "x = 1"),  # expression predicates are not looked into
]

DISJOINT = [
    ("x > 3", "x < 3"),
    ("x > 3", "x <= 3"),
    ("x >= 1 & x <= 2", "x in {0, 3}"),
    ('s = "a"', 's = "b"'),
    ('s prefix "ab"', 's prefix "ac"'),
    ('s prefix "ab"', 's < "ab"'),
    ("x = 1", "x != 1"),
    ("x = 1", "not exists x"),
    ("exists x", "!(exists x)"),
    ("x = 1", 'x = "1"'),
    ("x = 1 | y = 2", "x = 2 & y = 3"),
    ("false", "true"),
    ('s in {"ab", "cd"}', 's contains "x"'),  # string tests decided on finite sets
    ("x + 1 > y", "!(x + 1 > y)"),
]


@pytest.mark.parametrize(("f", "g"), OVERLAP)
def test_overlaps(f: str, g: str) -> None:
    assert overlaps(parse(f), parse(g))
    assert overlaps(parse(g), parse(f))


@pytest.mark.parametrize(("f", "g"), DISJOINT)
def test_disjoint(f: str, g: str) -> None:
    assert not overlaps(parse(f), parse(g))
    assert not overlaps(parse(g), parse(f))


def test_covering_implies_overlap_for_satisfiable_filters() -> None:
    rng = random.Random(5)
    texts = [
        "x > {a}",
        "x < {a}",
        "x >= {a} & x <= {b}",
        'y = "{c}"',
        'x > {a} & y = "{c}"',
        'x = {a} | y = "{c}"',
    ]
    fs = [
        parse(rng.choice(texts).format(a=rng.randrange(10), b=rng.randrange(10, 20), c=rng.choice("abc")))
        for _ in range(60)
    ]
    for f, g in itertools.product(fs, repeat=2):
        if covers(f, g):
            assert overlaps(f, g)


# --------------------------------------------------------------- soundness

any_filters = st.one_of(filters(), canonical_filters(), conjunction_filters(simple_only=False))


@settings(max_examples=300, deadline=None)
@given(f=any_filters, g=any_filters, evs=st.lists(events(), min_size=20, max_size=40))
def test_overlaps_is_sound(f: Filter, g: Filter, evs: list[dict[str, Any]]) -> None:
    if not overlaps(f, g):
        for e in evs:
            assert not (f.matches(e, functions=FUNCTIONS) and g.matches(e, functions=FUNCTIONS)), (
                str(f),
                str(g),
                e,
            )


# ------------------------------------------------- brute force on a small grid


def _candidates(*fs: Filter) -> list[Any]:
    """One value in each region the constants cut the value domain into, and the attribute missing."""
    out: list[Any] = ["", "zz", True, False, math.nan, MISSING]
    for f in fs:
        for conj in f.disjuncts:
            for lit in conj.simple:
                for v in lit.value if isinstance(lit.value, tuple) else (lit.value,):
                    if type(v) in (int, float):
                        out += [v, v - 0.5, v + 0.5]
                    elif type(v) is str:
                        out += [v, v + "\0", v + "a", "x" + v, "a" + v]
                        nxt = increment(v)
                        out += [nxt, nxt + "\0"] if nxt is not None else []
    return out


def _witness(f: Filter, g: Filter) -> dict[str, Any] | None:
    """An event both match, among the candidate values."""
    values = _candidates(f, g)
    for combo in itertools.product(values, repeat=len(ATTRS)):
        e = {k: v for k, v in zip(ATTRS, combo, strict=True) if v is not MISSING}
        if f.matches(e) and g.matches(e):
            return e
    return None


@st.composite
def simple_filters(draw: st.DrawFn, ops: tuple[Any, ...] = SIMPLE_OPS) -> Filter:
    """1-2 conjunctions of up to 3 simple literals (negated at random) on two attributes."""
    preds = st.lists(simple_predicates(ops, ATTRS, NUMS, STRS, negated=True), max_size=3)
    conjs = draw(st.lists(preds, min_size=1, max_size=2))
    return Filter(tuple(Conjunction(tuple(c)) for c in conjs))


@settings(max_examples=400, deadline=None)
@given(f=simple_filters(), g=simple_filters())
def test_overlaps_is_exact_for_simple_predicates(f: Filter, g: Filter) -> None:
    witness = _witness(f, g)
    assert overlaps(f, g) == (witness is not None), (str(f), str(g), witness)
    assert overlaps(g, f) == overlaps(f, g)


@settings(max_examples=200, deadline=None)
@given(f=simple_filters(ALL_OPS), g=simple_filters(ALL_OPS))
def test_string_tests_are_sound_on_the_grid(f: Filter, g: Filter) -> None:
    if _witness(f, g) is not None:
        assert overlaps(f, g), (str(f), str(g))


def test_seeded_brute_force_over_a_tiny_domain() -> None:
    """Every event over a tiny domain: two random filters overlap iff one of them matches both."""
    rng = random.Random(11)
    domain = [MISSING, -1, 0, 0.5, 1, 1.5, 2, 2.5, 3, "", "a", "a0", "b", "c", True]
    ops = ["=", "!=", "<", ">=", "in", "not in"]
    evs = [
        {k: v for k, v in zip(ATTRS, combo, strict=True) if v is not MISSING}
        for combo in itertools.product(domain, repeat=2)
    ]

    def rand() -> Filter:
        conjs = []
        for _ in range(rng.randint(1, 2)):
            lits = []
            for _ in range(rng.randint(1, 3)):
                a, op = rng.choice(ATTRS), rng.choice(ops)
                if op in ("in", "not in"):
                    lits.append(Predicate(a, op, tuple(rng.sample([0, 1, 2, "a"], 2))))  # type: ignore[arg-type]
                elif op in ("<", ">="):
                    lits.append(Predicate(a, op, rng.choice([0, 1, 2])))  # type: ignore[arg-type]
                else:
                    lits.append(Predicate(a, op, rng.choice([0, 1, 2, "a", "b"])))  # type: ignore[arg-type]
            conjs.append(Conjunction(tuple(lits)))
        return Filter(tuple(conjs))

    agree = 0
    for _ in range(500):
        f, g = rand(), rand()
        both = any(f.matches(e) and g.matches(e) for e in evs)
        if both:
            assert overlaps(f, g), (str(f), str(g))
        # the domain holds a witness for every overlap these operators allow (a value
        # strictly between and beyond the constants, of each kind, and the attribute missing)
        assert overlaps(f, g) == both, (str(f), str(g))
        agree += 1
    assert agree == 500
