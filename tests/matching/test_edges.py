"""The matcher gives the plain evaluator's answer at the edges, on dicts and on Arrow: int64
past 2**53, foreign number types, huge ints, functions that raise, None and null."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowbus.filters import parse
from flowbus.filters.ast import Conjunction, Filter, Op, Predicate
from flowbus.matching import Matcher, intervals

STRATEGIES = ("counting", "clustering")
T0 = 1_700_000_000_000_000_000
INT64_MAX = 2**63 - 1


def answers(m: Matcher, events: Any) -> list[list[Any]]:
    return [x.tolist() for x in m.match_batch(events)]


def brute(subs: dict[Any, Filter], rows: list[dict[str, Any]], functions: Any = None) -> list[list[Any]]:
    return [sorted(s for s, f in subs.items() if f.matches(r, functions=functions)) for r in rows]


def matcher(strategy: str, subs: dict[Any, str], functions: Any = None) -> Matcher:
    m = Matcher(strategy=strategy, functions=functions)  # type: ignore[arg-type]
    m.add_many(subs.items())
    return m


# ------------------------------------------------------------------ item 1: int64 past 2**53


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_int64_past_2_53_compares_exactly_on_arrow_and_dicts(strategy: str) -> None:
    m = matcher(strategy, {"r": f"ts > {T0}"})
    table = pa.table({"ts": pa.array([T0 + 1, T0, T0 - 1, None], pa.int64())})
    assert answers(m, table) == [["r"], [], [], []]
    assert m.match({"ts": T0 + 1}) == ["r"]
    assert m.match({"ts": T0}) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_int64_ranges_equalities_and_sets_near_2_53_and_2_63(strategy: str) -> None:
    subs = {
        "gt53": "x > 9007199254740992",
        "ge53+1": "x >= 9007199254740993",
        "lt53+1": "x < 9007199254740993",
        "between": "x between 9007199254740993 and 9007199254740995",
        "eq53+1": "x = 9007199254740993",
        "in": "x in {9007199254740993, 9223372036854775807}",
        "ne": "x != 9223372036854775807",
        "top": "x >= 9223372036854775807",
        "gt-float": "x > 9223372036854775807.0",
        "ge-float": "x >= 1.7e18 & x < 1.7000000000000003e18",
        "lt-neg": f"x < {-(2**63) + 1}",
    }
    values = [2**53 - 1, 2**53, 2**53 + 1, 2**53 + 2, 2**53 + 3, 2**53 + 5, T0, T0 + 1, INT64_MAX - 1]
    values += [INT64_MAX, -(2**63), -(2**63) + 1]
    subs_f = {s: parse(t) for s, t in subs.items()}
    want = brute(subs_f, [{"x": v} for v in values])
    m = matcher(strategy, subs)
    assert answers(m, pa.table({"x": pa.array(values, pa.int64())})) == want
    assert answers(m, [{"x": v} for v in values]) == want
    assert want[2] == sorted(["between", "gt53", "ge53+1", "eq53+1", "in", "ne"])  # the rule itself, once


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_many_intervals_over_int64_timestamps_in_the_dense_layout(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intervals, "DENSE_MIN", 1)
    monkeypatch.setattr(intervals, "DENSE_BYTES_PER_INTERVAL", 10**9)
    rng = np.random.default_rng(5)
    starts = T0 + rng.integers(0, 5000, 300)
    subs = {
        i: f"ts >= {int(s)} & ts < {int(s) + int(w)}"
        for i, (s, w) in enumerate(zip(starts, rng.integers(1, 40, 300), strict=True))
    }
    subs |= {1000 + i: f"ts > {int(s)}" for i, s in enumerate(starts[:50])}
    values = [*(T0 + rng.integers(-10, 5100, 400)).tolist(), T0 + 256, T0 + 255, T0 - 1]
    subs_f = {s: parse(t) for s, t in subs.items()}
    want = brute(subs_f, [{"ts": v} for v in values])
    m = matcher(strategy, subs)
    assert answers(m, pa.table({"ts": pa.array(values, pa.int64())})) == want
    assert answers(m, [{"ts": v} for v in values]) == want
    assert sum(map(len, want)) > 200


# ------------------------------------------------------------------ item 3: foreign number types


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_numpy_scalars_and_decimals_are_numbers(strategy: str) -> None:
    m = matcher(
        strategy, {"eq": "x = 5", "ne": "x != 5", "gt": "x > 3", "in": "x in {5, 7}", "t": "x = true"}
    )
    for v in (
        np.int64(5),
        np.int32(5),
        np.uint8(5),
        np.float64(5.0),
        np.float32(5.0),
        Decimal(5),
        Decimal("5.00"),
    ):
        assert m.match({"x": v}) == ["eq", "gt", "in"], repr(v)
    assert m.match({"x": Decimal("3.5")}) == ["gt", "ne"]
    assert m.match({"x": np.bool_(True)}) == ["ne", "t"]
    assert m.match({"x": np.str_("5")}) == ["ne"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_arrow_columns_of_every_numeric_type(strategy: str) -> None:
    subs = {
        "eq": "x = 5",
        "ne": "x != 5",
        "gt": "x > 3",
        "big": f"x > {2**63}",
        "tenth": "x = 0.1",
        "zero": "x = 0",
    }
    m = matcher(strategy, subs)
    subs_f = {s: parse(t) for s, t in subs.items()}
    columns = [
        pa.array([5, 3, None, 0], pa.int8()),
        pa.array([5, 2**64 - 1, 2**63 + 1, 0], pa.uint64()),
        pa.array([5.0, 0.1, -0.0, None], pa.float32()),
        pa.array([5.0, 0.1, -0.0, math.nan], pa.float64()),
        pa.array([Decimal("5.00"), Decimal("0.10"), Decimal("3.01"), None], pa.decimal128(10, 2)),
        pa.array([Decimal(T0 + 1), Decimal(2**64), Decimal(0), None], pa.decimal128(38, 0)),
        pa.array([True, False, None, True]),
    ]
    for column in columns:
        table = pa.table({"x": column})
        assert answers(m, table) == brute(subs_f, table.to_pylist()), column.type


# ------------------------------------------------------------------ item 4: huge ints


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_huge_integers_match_as_ints(strategy: str) -> None:
    huge = "9" * 400
    subs = {"gt5": "x > 5", "gt-huge": f"x > {huge}", "eq-huge": f"x = {huge}", "lt-huge": f"x < {huge}"}
    subs |= {"neg": f"!(x >= {huge})", "big-float": "x > 1e300"}
    m = matcher(strategy, subs)
    subs_f = {s: parse(t) for s, t in subs.items()}
    rows = [{"x": v} for v in (10**400, 10**400 - 1, int(huge), 5, 2**64, math.inf, -(10**400), 1e300)]
    assert answers(m, rows) == brute(subs_f, rows)
    assert m.match({"x": 10**400}) == ["big-float", "gt-huge", "gt5"]


def test_a_huge_constant_is_taken_as_it_is() -> None:
    m = Matcher()
    m.add("s", "x > " + "9" * 400)
    m.add("t", Filter((Conjunction((Predicate("x", Op.LE, 10**400), Predicate("x", Op.GE, 2**70 + 1))),)))
    assert m.match({"x": 10**400}) == ["s", "t"]
    assert m.match({"x": 2**70}) == []
    assert answers(m, pa.table({"x": pa.array([2**62], pa.int64())})) == [[]]


# ------------------------------------------------------------------ item 5: functions that raise


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_function_that_raises_makes_its_predicate_undefined(strategy: str) -> None:
    functions = {"first": lambda s: s[0], "table": {"a": 1}}
    subs = {"f": 'first(issue) = "I"', "nf": '!(first(issue) = "I")', "t": "table(issue) = 1"}
    m = matcher(strategy, subs, functions)
    assert m.match({"issue": ""}) == ["nf"]
    assert m.match({"issue": "IBM"}) == ["f"]
    assert m.match({"issue": "a"}) == ["nf", "t"]
    assert answers(m, pa.table({"issue": ["", "IBM", None]})) == [["nf"], ["f"], ["nf"]]


# ------------------------------------------------------------------ item 6: None and null


NONE_FILTERS = {
    "ne": "x != 5",
    "not-in": "x not in {1, 5}",
    "exists": "exists x",
    "not-exists": "not exists x",
    "not-eq": "!(x = 5)",
    "not-lt": "!(x < 3)",
    "ge": "x >= 0",
    "prefix": 'y prefix "a"',
    "not-prefix": '!(y prefix "a")',
    "y-ne": 'y != "a"',
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_none_in_a_dict_is_null_in_arrow_is_missing(strategy: str) -> None:
    m = matcher(strategy, NONE_FILTERS)
    subs_f = {s: parse(t) for s, t in NONE_FILTERS.items()}
    rows = [{"x": None, "y": None}, {"x": 5, "y": "ab"}, {"x": None, "y": "b"}, {"x": 2, "y": None}]
    absent = [{k: v for k, v in r.items() if v is not None} for r in rows]
    want = brute(subs_f, absent)
    assert brute(subs_f, rows) == want
    assert answers(m, rows) == want
    assert answers(m, absent) == want
    assert answers(m, pa.Table.from_pylist(rows)) == want
    assert want[0] == ["not-eq", "not-exists", "not-lt", "not-prefix"]


# ------------------------------------------------------------------ the property, on Arrow

EDGE_INTS = (0, 1, 2**53 - 1, 2**53, 2**53 + 1, 2**53 + 2, T0, T0 + 1, INT64_MAX - 1, INT64_MAX, -(2**63))
EDGE_FLOATS = (0.5, -0.0, 2.0**53, 2.0**53 + 2, float(T0), 2.0**63, -(2.0**63), 1e300, math.inf, math.nan)
CONSTANTS = (*EDGE_INTS, *EDGE_FLOATS[:-2], 2**63, 2**64 + 1, -(2**63) - 1, 10**400, "a", True)
COLUMN_VALUES: dict[str, tuple[Any, ...]] = {
    "int64": EDGE_INTS,
    "uint64": tuple(v for v in (*EDGE_INTS, 2**63, 2**64 - 1, 2**63 + 1) if v >= 0),
    "float64": EDGE_FLOATS,
    "decimal": (Decimal(0), Decimal("0.5"), Decimal(2**53 + 1), Decimal(T0 + 1), Decimal(2**64 + 1)),
    "string": ("a", "b", ""),
    "bool": (True, False),
}
ARROW_TYPES = {
    "int64": pa.int64(),
    "uint64": pa.uint64(),
    "float64": pa.float64(),
    "decimal": pa.decimal128(38, 1),
    "string": pa.string(),
    "bool": pa.bool_(),
}


@st.composite
def edge_filters(draw: st.DrawFn) -> Filter:
    conjs = []
    for _ in range(draw(st.integers(1, 2))):
        lits = []
        for _ in range(draw(st.integers(1, 3))):
            op = draw(
                st.sampled_from([Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN, Op.NOT_IN, Op.EXISTS])
            )
            const = st.sampled_from(CONSTANTS)
            if op in (Op.LT, Op.LE, Op.GT, Op.GE):
                value: Any = draw(const.filter(lambda c: type(c) is not bool))
            elif op in (Op.IN, Op.NOT_IN):
                value = tuple(draw(st.lists(const, min_size=1, max_size=3)))
            elif op is Op.EXISTS:
                value = None
            else:
                value = draw(const)
            lits.append(Predicate(draw(st.sampled_from("xy")), op, value, draw(st.integers(0, 4)) == 0))
        conjs.append(Conjunction(tuple(lits)))
    return Filter(tuple(conjs))


@pytest.fixture(params=["scan", "dense"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "dense":
        monkeypatch.setattr(intervals, "DENSE_MIN", 1)
        monkeypatch.setattr(intervals, "DENSE_BYTES_PER_INTERVAL", 10**9)
        monkeypatch.setattr(intervals, "EXACT_BUCKETS", 6)
        monkeypatch.setattr(intervals, "QUANTILE_BUCKETS", 4)
    return str(request.param)


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fs=st.lists(edge_filters(), min_size=1, max_size=20),
    kinds=st.tuples(st.sampled_from(sorted(COLUMN_VALUES)), st.sampled_from(sorted(COLUMN_VALUES))),
    data=st.data(),
)
def test_arrow_and_dicts_equal_brute_force_on_edge_values(
    strategy: str, layout: str, fs: list[Filter], kinds: tuple[str, str], data: st.DataObject
) -> None:
    n = data.draw(st.integers(1, 25))
    columns = {
        name: pa.array(
            data.draw(
                st.lists(st.one_of(st.none(), st.sampled_from(COLUMN_VALUES[kind])), min_size=n, max_size=n)
            ),
            ARROW_TYPES[kind],
        )
        for name, kind in zip("xy", kinds, strict=True)
    }
    table = pa.table(columns)
    rows = table.to_pylist()
    subs = dict(enumerate(fs))
    m = Matcher(strategy=strategy)  # type: ignore[arg-type]
    m.add_many(subs.items())
    want = brute(subs, rows)
    assert answers(m, table) == want
    assert answers(m, rows) == want


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_first_residual_comes_to_a_dense_index(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index without residuals (doubles only) takes its first int past 2**53, then loses it."""
    monkeypatch.setattr(intervals, "DENSE_MIN", 1)
    monkeypatch.setattr(intervals, "DENSE_BYTES_PER_INTERVAL", 10**9)
    subs = {i: f"x >= {i * 1e14} & x < {(i + 3) * 1e14}" for i in range(40)}
    m = matcher(strategy, subs)
    late = {100: f"x > {2**53} & x <= {2**53 + 3}", 101: f"x = {2**53 + 1} | x >= {T0 + 1}"}
    for sid, text in late.items():
        m.add(sid, text)
    subs_f = {s: parse(t) for s, t in (subs | late).items()}
    values = [2**53, 2**53 + 1, 2**53 + 3, 2**53 + 4, T0, T0 + 1, 5 * 10**14 + 1, 0]
    rows = [{"x": v} for v in values]
    assert answers(m, rows) == brute(subs_f, rows)
    assert answers(m, pa.table({"x": pa.array(values, pa.int64())})) == brute(subs_f, rows)
    m.remove(100)
    del subs_f[100]
    assert answers(m, rows) == brute(subs_f, rows)
