"""The predicate indexes: range literals become exact closed intervals, merged per conjunction and
attribute in one place, whichever way subscriptions are added."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from flowbus.filters.ast import Conjunction, Filter, Op, Predicate
from flowbus.matching import Matcher
from flowbus.matching.indexes import PredicateIndexes
from flowbus.matching.numbers import is_range, range_bounds, split

INF = math.inf


E53 = 2.0**53
MAX = 1.7976931348623157e308


@pytest.mark.parametrize(
    ("op", "value", "bounds"),
    [
        (Op.GE, 2, (2.0, 0, INF, 0)),
        (Op.GT, 2, (math.nextafter(2.0, INF), 0, INF, 0)),
        (Op.LE, 2.5, (-INF, 0, 2.5, 0)),
        (Op.LT, 2.5, (-INF, 0, math.nextafter(2.5, -INF), 0)),
        # past 2**53: the ints in the gap beside a bound are residuals
        (Op.GT, 2**53, (E53 + 2, 1, INF, 0)),  # from 2**53 + 1
        (Op.GE, 2**53 + 1, (E53 + 2, 1, INF, 0)),
        (Op.GT, 2**53 + 1, (E53 + 2, 0, INF, 0)),
        (Op.LE, 2**53 + 1, (-INF, 0, E53, 1)),
        (Op.LT, 2**53 + 2, (-INF, 0, E53, 1)),
        (Op.LT, 2**53 + 1, (-INF, 0, E53, 0)),
        (Op.LT, 2.0**62, (-INF, 0, math.nextafter(2.0**62, -INF), 511)),
        (Op.LT, 2.0**63, (-INF, 0, 2.0**63 - 1024, 1023)),
        # beyond int64 a gap is one class, "just above its lower double"
        (Op.GT, 2.0**70, (math.nextafter(2.0**70, INF), 1, INF, 0)),
        (Op.GT, int(MAX), (INF, 1, INF, 0)),
        (Op.LT, 2**70, (-INF, 0, math.nextafter(2.0**70, -INF), 1)),
    ],
)
def test_range_bounds_are_exact_closed_intervals(
    op: Op, value: Any, bounds: tuple[float, int, float, int]
) -> None:
    p = Predicate("x", op, value)
    assert is_range(p) and range_bounds(p) == bounds


def test_numbers_split_into_a_double_and_a_residual() -> None:
    assert split(3) == (3.0, 0) and split(0.5) == (0.5, 0) and split("a")[0] != split("a")[0]
    assert split(2**53 + 1) == (E53, 1) and split(2**63 - 1) == (2.0**63 - 1024, 1023)
    assert split(2**64 + 1) == (2.0**64, 1) and split(10**400) == (MAX, 1) and split(-(10**400)) == (-INF, 1)


@pytest.mark.parametrize(
    "p",
    [
        Predicate("x", Op.GT, 1, negated=True),  # its negation is not an interval
        Predicate("x", Op.GT, "b"),  # string order
        Predicate("x", Op.EQ, 1),
        Predicate("x", Op.EXISTS),
        Predicate("x", Op.GT, 2**64 + 1),  # no double nor int64: tested in Python
        Predicate("x", Op.LE, 10**400),
    ],
)
def test_other_literals_are_not_ranges(p: Predicate) -> None:
    assert not is_range(p)


def _alive(idx: PredicateIndexes, slots: list[int], events: list[dict[str, Any]]) -> list[list[int]]:
    """Per event, which of ``slots`` (all live) the intervals leave alive."""
    active = np.zeros(1, np.uint64)
    for s in slots:
        active[0] |= np.uint64(1) << np.uint64(s)
    _, vals, res = idx.encode(events, arrow=False)
    alive = idx.alive(active, vals, res)
    assert alive is not None
    return [[s for s in slots if int(row[0]) >> s & 1] for row in alive]


def test_add_ranges_merges_a_conjunctions_literals_per_attribute() -> None:
    idx = PredicateIndexes()
    idx.resize(64)
    literals = [
        Predicate("x", Op.GE, 1),
        Predicate("x", Op.LT, 5),
        Predicate("y", Op.LE, 2),
        Predicate("x", Op.GT, 2),
    ]
    g_slot, g_names = idx.add_ranges(np.array([3, 3, 3, 7]), np.arange(4), literals)
    assert list(zip(g_slot.tolist(), g_names, strict=True)) == [(3, "x"), (7, "x"), (3, "y")]
    events = [{"x": 4.0, "y": 1}, {"x": 5, "y": 1}, {"x": 2, "y": 2}, {"x": 3}, {"x": 1, "y": 2.5}]
    assert _alive(idx, [3, 7], events) == [[3, 7], [7], [3], [7], []]


def test_add_ranges_shares_literals_and_sorts_intervals_by_attribute() -> None:
    idx = PredicateIndexes()
    idx.resize(64)
    shared = [Predicate("y", Op.GT, 0), Predicate("x", Op.LE, 9)]
    g_slot, g_names = idx.add_ranges(np.array([1, 2, 5]), np.array([0, 1, 1]), shared)
    assert list(zip(g_slot.tolist(), g_names, strict=True)) == [(2, "x"), (5, "x"), (1, "y")]
    assert _alive(idx, [1, 2, 5], [{"x": 9, "y": 1}, {"x": 10, "y": 0}]) == [[1, 2, 5], []]
    idx.remove_ranges(2, ["x"])
    assert _alive(idx, [1, 5], [{"x": 10, "y": 1}]) == [[1]]


def test_no_intervals_no_alive_bitsets() -> None:
    idx = PredicateIndexes()
    idx.resize(64)
    idx.add(0, Predicate("x", Op.EQ, 1))
    _, vals, res = idx.encode([{"x": 1}], arrow=False)
    assert not idx.has_intervals() and idx.alive(np.ones(1, np.uint64), vals, res) is None


@pytest.mark.parametrize("strategy", ["counting", "clustering"])
def test_add_and_add_conjunctions_merge_ranges_alike(strategy: str) -> None:
    """The edges of merged intervals, ``>`` and ``<`` included, answer the same on both paths."""
    predicates = [
        Predicate("x", Op.GT, 1),
        Predicate("x", Op.LT, 3),
        Predicate("x", Op.GE, 2),
        Predicate("y", Op.LE, 0.5),
        Predicate("k", Op.EQ, "a"),
    ]
    rows = [[0, 1], [0, 2, 1], [3, 4, 0], [2], [4, 1, 3]]
    slow, fast = Matcher(strategy=strategy), Matcher(strategy=strategy)  # type: ignore[arg-type]
    slow.add_many((i, Filter((Conjunction(tuple(predicates[k] for k in r)),))) for i, r in enumerate(rows))
    offsets = np.cumsum([0, *map(len, rows)])
    fast.add_conjunctions(list(range(len(rows))), offsets, np.concatenate(rows), predicates)
    up, down = math.nextafter(1.0, INF), math.nextafter(3.0, -INF)
    events = [{"x": x, "y": y, "k": "a"} for x in (1, up, 2, down, 3) for y in (0.5, 0.75)] + [{}]
    want = [slow.match(e) for e in events]
    assert [fast.match(e) for e in events] == want
    assert want[2] == [0, 2, 4] and want[3] == [0]  # x = nextafter(1), y = 0.5, then y = 0.75
