"""Recognising collapse rule sets that are plain aggregates, checked against the sequential fold.

The relation checked: for any starting table and events, the sequential fold
(``BoundRules.collapse``, table ``T``) and ``fold_aggregates`` (table ``R``) agree
on every key -- ``T.get(k, initial) == R.get(k, initial)`` -- and ``T`` holds no
key ``R`` lacks (``R`` has a row for every key seen, ``T`` only for changed ones).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from flowbus.filters.ast import Const, Field
from flowbus.flow import BoundRules, FlowBuilder, FlowError, Graph
from flowbus.flow.aggregates import MAX_ATOMS, Aggregate, Aggregates, as_aggregates, fold_aggregates
from flowbus.flow.collapse import Key, Row
from flowbus.flow.validate import bind_rules
from flowbus.model import Schema, Value

EVENT = {"name": "str", "price": "float", "vol": "int"}
STATE = {"name": "str", "a": "float", "b": "float", "n": "int"}
INITIAL: dict[str, Value] = {"a": 0, "b": 0.0, "n": 0}
START: dict[str, Value] = {"a": 0.5, "b": 0.0, "n": 0}  # a float sum: an int past the float range overflows
NAMES = ("IBM", "Apple", "Intel")


def bound(
    rules: Sequence[Mapping[str, Any]],
    *,
    key: Mapping[str, str] | None = None,
    state: Mapping[str, str] = STATE,
    initial: Mapping[str, Value] = INITIAL,
    event: Mapping[str, str] = EVENT,
) -> BoundRules:
    """A rule set in spec form, bound to ``event`` and the state ``state`` keyed on name."""
    ruleset = FlowBuilder().rules("r", key=dict(key or {"name": "name"}), rules=list(rules))
    components = tuple(c for c in state if c != "name")
    return BoundRules(
        ruleset,
        event=Schema.of(event),
        state=Schema.of(state),
        key_names=("name",),
        components=components,
        initial=tuple(initial[c] for c in components),
        functions={},
        where="test",
    )


def sequential(
    b: BoundRules, events: Iterable[Mapping[str, Any]], table: Mapping[Key, Row] | None = None
) -> dict[Key, Row]:
    """The reference: each event folded by the rules, in order."""
    out = dict(table or {})
    for ev in events:
        b.collapse(out, ev)
    return out


def same(x: Row, y: Row) -> bool:
    """Rows equal, NaN equal to NaN."""
    return len(x) == len(y) and all(
        u == v or (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))
        for u, v in zip(x, y, strict=True)
    )


def assert_agree(b: BoundRules, seq: Mapping[Key, Row], agg: Mapping[Key, Row]) -> None:
    assert set(seq) <= set(agg)
    for k, row in agg.items():
        assert same(seq.get(k, b.initial), row), (k, seq.get(k), row)


def agrees(b: BoundRules, aggs: Aggregates, events: list[dict[str, Any]], split: int) -> None:
    """The relation from the empty table, and from the table a prefix of the events leaves."""
    assert_agree(b, sequential(b, events), fold_aggregates(aggs, events))
    start = sequential(b, events[:split])
    assert_agree(b, sequential(b, events[split:], start), fold_aggregates(aggs, events[split:], start))


# ------------------------------------------------------------------ recognised


def test_max_cur_is_max_and_last(stocks: Graph) -> None:
    for arc in ("C4", "E4"):
        aggs = as_aggregates(bind_rules(stocks, stocks.arc(arc)))
        assert aggs == Aggregates(
            (("name", Field("name")),),
            (Aggregate("maxP", "max", Field("price"), 0), Aggregate("curP", "last", Field("price"), 0)),
        )
    assert aggs is not None
    assert aggs.describe() == ["key <name=name>", "maxP = max(price) from 0", "curP = last(price)"]
    assert aggs.key_fields == ("name",) and aggs.initial == (0, 0)


def test_trend_is_not_an_aggregate(stocks: Graph) -> None:
    assert as_aggregates(bind_rules(stocks, stocks.arc("C5"))) is None


def test_drop_events_is_last_drop(stocks: Graph) -> None:
    aggs = as_aggregates(bind_rules(stocks, stocks.arc("E5")))  # tracks only drop
    assert aggs is not None and aggs.components == (Aggregate("drop", "last", Field("drop"), 0),)
    state = {"name": "str", "drop": "float"}
    b = bound([{"set": {"drop": "event.drop"}}], state=state, initial={"drop": 0}, event=state)
    aggs = as_aggregates(b)
    assert aggs is not None and aggs.components == (Aggregate("drop", "last", Field("drop"), 0),)


KITCHEN: list[dict[str, Any]] = [
    {"when": "price >= a", "set": {"a": "event.price", "b": "b + price", "n": "1 + n"}},
    {"when": "vol > 2", "set": {"b": "state.b + event.price", "n": "n + 1"}},
    {"set": {"b": "price + b", "n": "state.n + 1"}},
]


def test_max_sum_count_and_what_breaks_them() -> None:
    b = bound(
        [
            {"when": "a < price", "set": {"a": "price", "b": "vol", "n": "n + vol"}},
            {"set": {"b": "vol", "n": "vol + n"}},
        ],
        state={"name": "str", "a": "float", "b": "float", "n": "int", "lo": "float", "c": "int"},
        initial={"a": 0, "b": 0.0, "n": 0, "lo": 100.0, "c": 5},
    )
    assert as_aggregates(b) is None  # lo and c are never set: not an aggregate
    b = bound(
        [
            {"when": "a < price", "set": {"a": "price", "b": "vol", "n": "n + vol"}},
            {"when": "price <= lo", "set": {"lo": "price", "b": "vol", "n": "vol + n", "c": "c + 1"}},
            {"set": {"b": "vol", "n": "vol + n", "c": "c + 1"}},
        ],
        state={"name": "str", "a": "float", "b": "float", "n": "int", "lo": "float", "c": "int"},
        initial={"a": 0, "b": 0.0, "n": 0, "lo": 100.0, "c": 5},
    )
    # lo and c change only when a did not grow: they depend on the guard over a
    assert as_aggregates(b) is None
    aggs = as_aggregates(bound(KITCHEN))
    assert aggs is not None
    assert aggs.describe() == [
        "key <name=name>",
        "a = max(price) from 0 (ties replace)",
        "b = sum(price) from 0.0",
        "n = count from 0",
    ]


def test_min_sum_of_a_field_and_a_constant_argument() -> None:
    aggs = as_aggregates(
        bound(
            [
                {"when": "price < a", "set": {"a": "price"}},
                {"when": "!(price < a)", "set": {"b": "b + 2.5", "n": "n + vol"}},
            ]
        )
    )
    assert aggs is None  # b and n change only when a does not
    aggs = as_aggregates(
        bound([{"when": "price < a", "set": {"a": "price", "b": "b + 2.5", "n": "n + vol"}}, {"set": {}}])
    )
    assert aggs is None  # an empty unconditional rule: b, n change only under the guard
    aggs = as_aggregates(
        bound(
            [
                {"when": "price < a", "set": {"a": "price", "b": "b + 2.5", "n": "n + vol"}},
                {"set": {"b": "b + 2.5", "n": "n + vol"}},
            ]
        )
    )
    assert aggs is not None
    assert [(x.kind, x.arg) for x in aggs.components] == [
        ("min", Field("price")),
        ("sum", Const(2.5)),
        ("sum", Field("vol")),
    ]


def test_a_constant_maximum_and_a_key_read() -> None:
    # `5 > a` parses to the simple predicate a < 5; key reads are the event field the key comes from
    state = {"name": "str", "a": "float", "who": "str"}
    b = bound(
        [{"when": "5 > a", "set": {"a": 5, "who": "name"}}, {"set": {"who": "state.name"}}],
        state=state,
        initial={"a": 0, "who": ""},
    )
    aggs = as_aggregates(b)
    assert aggs is not None
    assert aggs.components == (
        Aggregate("a", "max", Const(5), 0),
        Aggregate("who", "last", Field("name"), ""),
    )


def test_guards_that_do_not_change_the_outcome() -> None:
    aggs = as_aggregates(
        bound(
            [
                {"when": "vol > 10 or n = 0", "set": {"a": "price", "b": "b", "n": "n + 1"}},
                {"when": "price > b", "set": {"a": "price", "b": "price", "n": "n + 1"}},
                {"when": "!(price > b)", "set": {"a": "price", "n": "n + 1"}},
            ]
        )
    )
    # b: set to price only under `price > b` when the first rule did not fire -- not max
    assert aggs is None
    aggs = as_aggregates(
        bound(
            [
                {"when": "vol > 10 or n = 0", "set": {"a": "price", "n": "n + 1"}},
                {"when": "b < price", "set": {"a": "price", "b": "price", "n": "n + 1"}},
                {"when": "!(price > b)", "set": {"a": "price", "n": "n + 1"}},
            ]
        )
    )
    assert aggs is None  # the first rule hides `b < price` for some events
    aggs = as_aggregates(
        bound(
            [
                {"when": "price > b", "set": {"a": "price", "b": "price", "n": "n + 1"}},
                {"when": "vol > 10", "set": {"a": "price", "n": "n + 1"}},
                {"when": "!(vol > 10)", "set": {"a": "price", "n": "n + 1"}},
            ]
        )
    )
    assert aggs is not None  # no rule is unconditional, but one always fires
    assert [x.describe() for x in aggs.components] == [
        "a = last(price)",
        "b = max(price) from 0.0",
        "n = count from 0",
    ]


# ------------------------------------------------------------------ not recognised


def maxed(guard: str = "price > a", arg: str = "price", **first: Any) -> list[dict[str, Any]]:
    """``a = max(arg)``, ``b = last(price)``, ``n = count``; with other ``guard``, ``arg``, ``first``: not."""
    return [
        {"when": guard, "set": {"a": arg, "b": "price", "n": "n + 1", **first}},
        {"set": {"b": "price", "n": "n + 1"}},
    ]


# Each case: a rule set that is no aggregate, and the nearest one that is (so the first fails for its reason).
NOT_AGGREGATES = {
    "a guard on another component changes b's outcome": (
        [*maxed()[:1], {"when": "a > 100", "set": {"b": 0, "n": "n + 1"}}, *maxed()[1:]],
        [*maxed()[:1], {"when": "a > 100", "set": {"b": "price", "n": "n + 1"}}, *maxed()[1:]],
    ),
    "a guard on an event field changes b's outcome": (
        [*maxed()[:1], {"when": "vol > 2", "set": {"b": 0, "n": "n + 1"}}, *maxed()[1:]],
        [*maxed()[:1], {"when": "vol > 2", "set": {"b": "price", "n": "n + 1"}}, *maxed()[1:]],
    ),
    "n = n + 1 only under a guard": (
        [{"when": "vol > 10", "set": {"a": "price", "b": "price", "n": "n + 1"}}, {"set": {"a": 1, "b": 2}}],
        [{"when": "vol > 10", "set": {"a": 1, "b": 2, "n": "n + 1"}}, {"set": {"a": 1, "b": 2, "n": "n+1"}}],
    ),
    "n = n + 1 only under a guard on itself": (
        [{"when": "n < 5", "set": {"a": 1, "b": 2, "n": "n + 1"}}, {"set": {"a": 1, "b": 2}}],
        [{"when": "n < 5", "set": {"a": 1, "b": 2, "n": "n + 1"}}, {"set": {"a": 1, "b": 2, "n": "n + 1"}}],
    ),
    "max with a non-event argument": (maxed("b > a", "b"), maxed()),
    "max with a computed argument": (maxed("price * 2 > a", "price * 2"), maxed()),
    "max under an extra condition": (maxed("price > a and vol > 2"), maxed()),
    "max under a negated comparison (true on NaN)": (maxed("!(price <= a)"), maxed("price > a")),
    "max whose guard compares with another component": (maxed("price > b"), maxed("price > a")),
    "max whose guard compares another argument": (maxed("vol > a"), maxed("vol > a", "vol")),
    "max of one argument under a guard on another": (maxed("price > a", "vol"), maxed("price > a", "price")),
    "max whose value also changes something else": (maxed(n="n + 2"), maxed(n="1 + n")),
    "last only when a guard holds": (
        [{"when": "vol > 2", "set": {"a": "price", "b": "price", "n": "n + 1"}}],
        [{"when": "vol > 2 or !(vol > 2)", "set": {"a": "price", "b": "price", "n": "n + 1"}}],
    ),
    "last of an expression that can be undefined": (
        [{"set": {"a": "price * 2", "b": "price", "n": "n + 1"}}],
        [{"set": {"a": "price", "b": "price", "n": "n + 1"}}],
    ),
    "sum of an expression that can be undefined": (
        [{"set": {"a": "price", "b": "b + price / vol", "n": "n + 1"}}],
        [{"set": {"a": "price", "b": "b + price", "n": "n + 1"}}],
    ),
    "different values by guard": (
        [{"when": "vol > 2", "set": {"a": "vol", "b": 1, "n": "n+1"}}, {"set": {"a": 0, "b": 1, "n": "n+1"}}],
        [{"when": "vol > 2", "set": {"a": 0, "b": 1, "n": "n+1"}}, {"set": {"a": 0, "b": 1, "n": "n+1"}}],
    ),
    "a component read from another": (
        [{"set": {"a": "b", "b": "price", "n": "n + 1"}}],
        [{"set": {"a": "vol", "b": "price", "n": "n + 1"}}],
    ),
    "a doubling": (
        [{"set": {"a": "a + a", "b": "price", "n": "n + 1"}}],
        [{"set": {"a": "a + 1", "b": "price", "n": "n + 1"}}],
    ),
    "a start value mixed with increments": (
        [{"when": "n = 0", "set": {"a": 1, "b": 2, "n": 1}}, {"set": {"a": 1, "b": 2, "n": "n + 1"}}],
        [{"when": "n = 0", "set": {"a": 1, "b": 2, "n": "n + 1"}}, {"set": {"a": 1, "b": 2, "n": "n + 1"}}],
    ),
    "a component never set": (
        [{"set": {"a": "price", "b": "price"}}],
        [{"set": {"a": "price", "b": "price", "n": 0}}],
    ),
}  # fmt: skip


@pytest.mark.parametrize("bad, good", NOT_AGGREGATES.values(), ids=list(NOT_AGGREGATES))
def test_not_aggregates(bad: list[dict[str, Any]], good: list[dict[str, Any]]) -> None:
    assert as_aggregates(bound(bad)) is None
    assert as_aggregates(bound(good)) is not None


def test_a_computed_key_is_refused() -> None:
    rules = [{"set": {"a": "price", "b": "price", "n": "n + 1"}}]
    assert as_aggregates(bound(rules)) is not None
    state = {"name": "int", "a": "float", "b": "float", "n": "int"}
    assert as_aggregates(bound(rules, key={"name": "vol + 1"}, state=state)) is None


def test_a_maximum_from_nan_is_refused() -> None:
    rules = maxed()
    assert as_aggregates(bound(rules)) is not None
    assert as_aggregates(bound(rules, initial={**INITIAL, "a": math.nan})) is None


def test_too_many_literals_are_not_analysed() -> None:
    guard = " or ".join(f"vol = {i}" for i in range(MAX_ATOMS + 1))
    rules = [{"when": guard, "set": {"a": "price", "b": "price", "n": "n + 1"}}]
    assert as_aggregates(bound([*rules, {"set": {"a": "price", "b": "price", "n": "n + 1"}}])) is None
    fewer = " or ".join(f"vol = {i}" for i in range(MAX_ATOMS))
    rules = [{"when": fewer, "set": {"a": "price", "b": "price", "n": "n + 1"}}]
    assert as_aggregates(bound([*rules, {"set": {"a": "price", "b": "price", "n": "n + 1"}}])) is not None


# ------------------------------------------------------------------ the fold


def test_fold_closed_forms() -> None:
    """With exact (integer-valued) numbers the fold is the closed form an engine computes per key."""
    aggs = as_aggregates(bound(KITCHEN))
    assert aggs is not None
    rng = random.Random(3)
    trades = [(rng.choice(NAMES), float(rng.randint(-5, 20))) for _ in range(300)]
    table = fold_aggregates(aggs, [{"name": name, "price": price, "vol": 1} for name, price in trades])
    assert set(table) == {(n,) for n in NAMES}
    for (name,), (a, b, n) in table.items():
        prices = [p for who, p in trades if who == name]
        assert (a, b, n) == (max(0, *prices), 0.0 + sum(prices), len(prices))


def test_fold_keeps_the_given_state_and_skips_keyless_events() -> None:
    aggs = as_aggregates(bound(KITCHEN))
    assert aggs is not None
    start: dict[Key, Row] = {("IBM",): (50.0, 1.0, 7)}
    out = fold_aggregates(aggs, [{"price": 3.0, "vol": 1}, {"name": "IBM", "price": 3.0, "vol": 1}], start)
    assert out == {("IBM",): (50.0, 4.0, 8)} and start == {("IBM",): (50.0, 1.0, 7)}


def test_fold_refuses_events_outside_the_precondition() -> None:
    aggs = as_aggregates(bound(KITCHEN))
    assert aggs is not None
    with pytest.raises(FlowError, match="no field price"):
        fold_aggregates(aggs, [{"name": "IBM", "vol": 1}])
    with pytest.raises(FlowError, match="not a sum of numbers"):
        fold_aggregates(aggs, [{"name": "IBM", "price": "high", "vol": 1}])
    summed = as_aggregates(bound([{"set": {"a": "a + price", "b": "b", "n": "n + 1"}}]))
    assert summed is None  # b never set
    summed = as_aggregates(bound([{"set": {"a": "a + price", "b": "price", "n": "n + 1"}}], initial=START))
    assert summed is not None
    with pytest.raises(FlowError, match="overflows"):
        fold_aggregates(summed, [{"name": "IBM", "price": 10**400, "vol": 1}])


def test_nan_is_skipped_by_max_as_by_the_rules(stocks: Graph) -> None:
    b = bind_rules(stocks, stocks.arc("C4"))
    aggs = as_aggregates(b)
    assert aggs is not None
    events = [{"name": "IBM", "price": p} for p in (3.0, math.nan, 1.0, math.nan, 7.0, 2.0, math.nan)]
    seq, agg = sequential(b, events), fold_aggregates(aggs, events)
    assert_agree(b, seq, agg)
    max_p, cur_p = agg[("IBM",)]
    assert max_p == 7.0 and isinstance(cur_p, float) and math.isnan(cur_p)


# ------------------------------------------------------------------ properties

PRICES = st.one_of(
    st.sampled_from([-1.0, 0.0, 0.5, 2.5, 3.0, 3.0, 100.0]),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.just(math.nan),
)


def events_strategy(fields: Mapping[str, Any]) -> st.SearchStrategy[list[dict[str, Any]]]:
    one = st.fixed_dictionaries({"name": st.sampled_from(NAMES), **fields})
    return st.lists(one, max_size=40)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.data(),
    events_strategy({"price": PRICES, "vol": st.integers(-3, 20)}),
)
def test_recognised_rule_sets_fold_like_the_rules(data: st.DataObject, events: list[dict[str, Any]]) -> None:
    rules: list[dict[str, Any]] = data.draw(
        st.sampled_from(
            [
                KITCHEN,
                [
                    {"when": "price < a", "set": {"a": "price", "b": "b + 2.5", "n": "n + vol"}},
                    {"set": {"b": "b + 2.5", "n": "n + vol"}},
                ],
                [
                    {"when": "price > b", "set": {"a": "price", "b": "price", "n": "n + 1"}},
                    {"when": "vol > 10", "set": {"a": "price", "n": "n + 1"}},
                    {"when": "!(vol > 10)", "set": {"a": "price", "n": "n + 1"}},
                ],
            ]
        )
    )
    b = bound(rules, initial={"a": data.draw(st.sampled_from([0, 2.5, -1.0])), "b": 0.0, "n": 0})
    aggs = as_aggregates(b)
    assert aggs is not None
    agrees(b, aggs, events, data.draw(st.integers(0, len(events))))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(events_strategy({"price": PRICES}), st.integers(0, 40))
def test_max_cur_folds_like_its_rules(stocks: Graph, events: list[dict[str, Any]], split: int) -> None:
    b = bind_rules(stocks, stocks.arc("C4"))
    aggs = as_aggregates(b)
    assert aggs is not None
    agrees(b, aggs, events, split)


# Random rule sets: whenever one is recognised, it folds exactly like its rules.

GUARDS = [
    "price > a", "a < price", "price >= a", "a >= price", "price < b", "b > price", "price <= b",
    "!(price > a)", "vol > 2", "!(vol > 2)", "n = 0", "n < 3", "a > 1", "price > a and vol > 2",
    "price > b or vol > 2",
]  # fmt: skip
EXTREME_GUARDS = [
    "{x} > {c}", "{c} > {x}", "{c} <= {x}", "{x} <= {c}", "!({x} > {c})", "!({c} <= {x})",
    "{x} > {c} and vol > 2", "{x} >= {c} or vol > 2", "{x} > {c} or {c} < {x}", "!({x} > {c}) and {c} > {x}",
]  # fmt: skip
SETS: dict[str, list[Any]] = {
    "a": [
        "price",
        "event.price",
        "a",
        "state.a",
        "a + price",
        "price + a",
        "a + 1",
        "price * 2",
        "b",
        "vol",
        1.5,
    ],
    "b": ["price", "b", "b + price", "b + vol", "vol", "a", 0.0],
    "n": ["n + 1", "1 + n", "vol", "n + vol", "n", 0, "n + 2", "n + n"],
}


def random_rules(pick: Callable[[Sequence[Any]], Any]) -> list[dict[str, Any]]:
    """A random rule set over the a, b, n state, ``pick`` choosing each part.

    Three in four are shaped like aggregates, so that many are: every rule sets
    the same, or later rules set what the first does but for one component
    (which the first sets to an event field under a guard, for max and min); and
    the last rule is often unconditional.
    """
    rules = []
    for _ in range(pick(range(1, 4))):
        sets = {c: pick(pool) for c, pool in SETS.items() if pick(range(4))}
        rule: dict[str, Any] = {"set": sets}
        if pick(range(3)):
            rule["when"] = pick(GUARDS)
        rules.append(rule)
    shape = pick(["free", "uniform", "one less", "extreme"])
    if shape == "free":
        return rules
    first = rules[0]["set"]
    dropped = pick(sorted(first) or [""]) if shape == "one less" else ""
    if shape == "extreme":  # the first rule sets a or b to an event field, under a guard; later ones do not
        dropped = pick(["a", "b"])
        first.update({c: pick(pool) for c, pool in SETS.items() if c not in first})
        x = first[dropped] = pick(["price", "event.price", "vol"])
        rules[0]["when"] = pick([*GUARDS, *(g.format(x=x, c=dropped) for g in EXTREME_GUARDS)])
        rules.append({"set": {}})
    for rule in rules[1:]:
        rule["set"] = {c: e for c, e in first.items() if c != dropped}
    if pick(range(2)):
        rules[-1].pop("when", None)
    return rules


@st.composite
def rule_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    return random_rules(lambda seq: draw(st.sampled_from(seq)))


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(rule_sets(), events_strategy({"price": PRICES, "vol": st.integers(-3, 20)}), st.integers(0, 40))
def test_whatever_is_recognised_folds_like_its_rules(
    rules: list[dict[str, Any]], events: list[dict[str, Any]], split: int
) -> None:
    b = bound(rules)
    aggs = as_aggregates(b)
    note(f"{rules} -> {aggs and aggs.describe()}")
    if aggs is not None:
        agrees(b, aggs, events, split)


def test_the_random_rule_sets_are_often_recognised() -> None:
    """The property above is not vacuous: a fair share of its rule sets are recognised, of every kind."""
    rng = random.Random(11)
    found = [aggs for _ in range(1000) if (aggs := as_aggregates(bound(random_rules(rng.choice))))]
    kinds = {x.kind for aggs in found for x in aggs.components}
    assert len(found) > 50 and kinds == {"last", "max", "min", "count", "sum"}
