"""Both matching strategies equal brute-force ``Filter.matches``, through adds, removals and re-adds,
on small values and on the edges (ints past 2**53 and int64, huge ints, numpy scalars, decimals,
None)."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowbus.filters.ast import (
    BinOp,
    Conjunction,
    Const,
    ExprPredicate,
    Field,
    Filter,
    Op,
    Predicate,
)
from flowbus.matching import Matcher, intervals, kernels

ATTRS = ("a", "b", "c", "d")
NUMS: tuple[Any, ...] = (-2, 0, 1, 1.5, 2, 3, 7, 10)
EDGE: tuple[Any, ...] = (2**53, 2**53 + 1, 2.0**53 + 2, 2**63 - 1, -(2**63), 2**64 + 1, 10**400, 1e300)
"""Numbers past the doubles' integers and int64 (a constant, or a value, or both)."""
FOREIGN: tuple[Any, ...] = (np.int64(3), np.float32(1.5), Decimal("2.0"), Decimal("0.1"), np.bool_(True))
"""Values of types that stand for flowbus values (events only)."""
STRS = ("", "x", "xy", "xyz", "y", "yb")
VALUES: tuple[Any, ...] = (*NUMS, *STRS, True, False)

attr = st.sampled_from(ATTRS)
number = st.one_of(st.sampled_from(NUMS), st.sampled_from(EDGE))
string = st.sampled_from(STRS)
value = st.one_of(st.sampled_from(VALUES), st.sampled_from(EDGE))
event_value = st.one_of(value, st.sampled_from((*FOREIGN, None, math.nan, math.inf, -math.inf)))


@st.composite
def predicates(draw: st.DrawFn) -> Predicate | ExprPredicate:
    kind = draw(st.integers(0, 9))
    a = draw(attr)
    neg = draw(st.integers(0, 5)) == 0
    if kind <= 2:
        return Predicate(a, draw(st.sampled_from([Op.LT, Op.LE, Op.GT, Op.GE])), draw(number), neg)
    if kind == 3:
        return Predicate(
            a, draw(st.sampled_from([Op.LT, Op.GE, Op.PREFIX, Op.SUFFIX, Op.CONTAINS])), draw(string), neg
        )
    if kind in (4, 5):
        return Predicate(a, draw(st.sampled_from([Op.EQ, Op.NE])), draw(value), neg)
    if kind == 6:
        op = draw(st.sampled_from([Op.IN, Op.NOT_IN]))
        return Predicate(a, op, tuple(draw(st.lists(value, min_size=1, max_size=3))), neg)
    if kind == 7:
        return Predicate(a, Op.EXISTS, None, neg)
    if kind == 8:
        b = draw(attr)
        expr = BinOp(draw(st.sampled_from(["+", "*"])), Field(a), Field(b))
        return ExprPredicate(expr, draw(st.sampled_from([Op.GT, Op.LE, Op.EQ])), Const(draw(number)), neg)
    return Predicate(a, Op.EQ, draw(string), neg)


@st.composite
def filters(draw: st.DrawFn) -> Filter:
    n = draw(st.integers(1, 2)) if draw(st.integers(0, 4)) == 0 else 1
    conjs = [Conjunction(tuple(draw(st.lists(predicates(), min_size=0, max_size=4)))) for _ in range(n)]
    return Filter(tuple(conjs))


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(attr, unique=True, max_size=len(ATTRS)))
    return {k: draw(event_value) for k in keys}


def brute(subs: dict[int, Filter], event: dict[str, Any]) -> list[int]:
    return sorted(i for i, f in subs.items() if f.matches(event))


def check(m: Matcher, subs: dict[int, Filter], evs: list[dict[str, Any]]) -> None:
    got = m.match_batch(evs)
    for e, ids in zip(evs, got, strict=True):
        assert ids.tolist() == brute(subs, e), e
    assert [m.match(e) for e in evs[:3]] == [brute(subs, e) for e in evs[:3]]


@pytest.fixture(params=["scan", "dense-exact", "dense-quantile"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The interval layouts: a scan, buckets at every end point, and few buckets with partial lists."""
    if request.param == "scan":
        monkeypatch.setattr(intervals, "DENSE_MIN", 10**9)
    else:
        monkeypatch.setattr(intervals, "DENSE_MIN", 1)
        monkeypatch.setattr(intervals, "DENSE_BYTES_PER_INTERVAL", 10**9)
    if request.param == "dense-quantile":
        monkeypatch.setattr(intervals, "EXACT_BUCKETS", 2)
        monkeypatch.setattr(intervals, "QUANTILE_BUCKETS", 3)
    return str(request.param)


@pytest.mark.parametrize("strategy", ["counting", "clustering"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fs=st.lists(filters(), min_size=1, max_size=25),
    evs=st.lists(events(), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_equals_brute_force_through_changes(
    strategy: str, layout: str, fs: list[Filter], evs: list[dict[str, Any]], seed: int
) -> None:
    rng = random.Random(seed)
    m = Matcher(strategy=strategy)  # type: ignore[arg-type]
    subs = dict(enumerate(fs))
    m.add_many(subs.items())
    check(m, subs, evs)
    removed = rng.sample(sorted(subs), k=len(subs) // 2)
    for i in removed:
        m.remove(i)
        del subs[i]
    check(m, subs, evs)
    for i in removed[::2]:
        subs[i] = fs[i]
        m.add(i, fs[i])
    check(m, subs, evs)


@pytest.mark.parametrize("strategy", ["counting", "clustering"])
def test_arrow_batches_equal_mappings(strategy: str) -> None:
    rng = random.Random(7)
    m = Matcher(strategy=strategy)  # type: ignore[arg-type]
    for i in range(300):
        a, b = rng.sample(["s0", "s1", "s2"], 2)
        m.add(
            i,
            Filter(
                (
                    Conjunction(
                        (
                            Predicate(a, Op.EQ, f"v{rng.randrange(4)}"),
                            Predicate("n", Op.GE, rng.randrange(50)),
                            Predicate(b, Op.NE, f"v{rng.randrange(4)}"),
                        )
                    ),
                )
            ),
        )
    rows = [
        {
            "s0": f"v{rng.randrange(5)}",
            "s1": f"v{rng.randrange(5)}",
            "s2": f"v{rng.randrange(5)}",
            "n": rng.randrange(60),
        }
        for _ in range(200)
    ]
    rows[3]["s1"] = None
    table = pa.Table.from_pylist(rows)
    clean = [{k: v for k, v in r.items() if v is not None} for r in rows]
    from_arrow = m.match_batch(table)
    from_dicts = m.match_batch(clean)
    assert [x.tolist() for x in from_arrow] == [x.tolist() for x in from_dicts]
    assert sum(len(x) for x in from_dicts) > 0


def test_string_ids_and_multi_conjunction_dedup() -> None:
    m = Matcher()
    either = Filter((Conjunction((Predicate("x", Op.GT, 1),)), Conjunction((Predicate("y", Op.EQ, "a"),))))
    m.add("both", either)
    m.add("alpha", Filter((Conjunction((Predicate("y", Op.EXISTS),)),)))
    assert m.match({"x": 2, "y": "a"}) == ["alpha", "both"]
    got = m.match_batch([{"x": 2, "y": "a"}, {}])
    assert got[0].tolist() == ["alpha", "both"] and got[1].size == 0
    assert np.asarray(got[0]).dtype == object


def _random_setup(seed: int, n_subs: int, n_events: int) -> tuple[dict[int, Filter], list[dict[str, Any]]]:
    rng = random.Random(seed)
    subs: dict[int, Filter] = {}
    for i in range(n_subs):
        lits: list[Predicate] = [Predicate(a, Op.EQ, rng.choice(STRS)) for a in rng.sample(ATTRS, 2)]
        if rng.random() < 0.3:
            lits.append(Predicate(rng.choice(ATTRS), Op.EQ, rng.choice(STRS), negated=True))
        if rng.random() < 0.3:
            lits.append(Predicate("n", Op.LE, rng.randrange(10)))
        subs[i] = Filter((Conjunction(tuple(lits)),))
    evs = [{a: rng.choice(STRS) for a in ATTRS} | {"n": rng.randrange(12)} for _ in range(n_events)]
    return subs, evs


@pytest.mark.parametrize("strategy", ["counting", "clustering"])
def test_threads_give_the_same_answers(strategy: str) -> None:
    subs, evs = _random_setup(3, 400, 5000)
    one = Matcher(strategy=strategy, workers=1)  # type: ignore[arg-type]
    two = Matcher(strategy=strategy, workers=2)  # type: ignore[arg-type]
    one.add_many(subs.items())
    two.add_many(subs.items())
    a = [x.tolist() for x in one.match_batch(evs)]
    b = [x.tolist() for x in two.match_batch(evs)]
    assert a == b
    assert a[:50] == [brute(subs, e) for e in evs[:50]]
    assert sum(map(len, a)) > 100


def test_epoch_tags_wrap_safely() -> None:
    """Counting words carry a 16-bit epoch tag: crossing and skipping whole periods stays exact."""
    subs, evs = _random_setup(5, 300, 40)
    m = Matcher(workers=1)
    m.add_many(subs.items())
    expected = [brute(subs, e) for e in evs]
    m._epoch = kernels.EPOCH_PERIOD - 7  # the next batch crosses a wrap
    assert [x.tolist() for x in m.match_batch(evs)] == expected
    m._epoch += kernels.EPOCH_PERIOD - 20  # as if threads had used up most of a period
    assert [x.tolist() for x in m.match_batch(evs)] == expected
    m._epoch += 3 * kernels.EPOCH_PERIOD
    assert [x.tolist() for x in m.match_batch(evs)] == expected
