"""Interpretations: fold, the catch-up of a reconnecting subscriber, the config and its errors.

A table of rule sets and backlogs with the expected catch-up; a property test
that folding the catch-up gives the state the backlog gives, is never longer than
the backlog, and for rule sets whose form allows it is as short as a brute-force
breadth-first search over every event built from the values in play; errors.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.broker.interpret import Interpretation, Interpretations, load_interpretation
from flowbus.errors import FlowbusError, FlowError, SchemaError

TRADE = {"symbol": "str", "price": "float", "vol": "int"}

RULESETS: dict[str, Any] = {
    # the latest price per symbol (vol is read by no rule)
    "latest": {
        "key": {"symbol": "symbol"},
        "state": {"schema": {"last": "float"}, "initial": {"last": 0}},
        "rules": [{"set": {"last": "price"}}],
    },
    # the highest price per symbol
    "max_price": {
        "key": "symbol",
        "state": {"schema": {"symbol": "str", "maxP": "float"}, "initial": {"maxP": 0}},
        "rules": [{"when": "price > maxP", "set": {"maxP": "price"}}],
    },
    # the paper's <max, cur> (000 document, section 2)
    "max_cur": {
        "key": ["symbol"],
        "state": {"schema": {"maxP": "float", "curP": "float"}, "initial": {"maxP": 0, "curP": 0}},
        "rules": [
            {"when": "price > maxP", "set": {"maxP": "price", "curP": "price"}},
            {"set": {"curP": "price"}},
        ],
    },
    # how many trades per symbol
    "count": {
        "key": "symbol",
        "state": {"schema": {"n": "int"}, "initial": {"n": 0}},
        "rules": [{"set": {"n": "n + 1"}}],
    },
    # the volume traded per symbol
    "volume": {
        "key": "symbol",
        "state": {"schema": {"total": "int"}, "initial": {"total": 0}},
        "rules": [{"set": {"total": "total + vol"}}],
    },
    # price band per symbol, set by guards on constants
    "band": {
        "key": "symbol",
        "state": {"schema": {"band": "str"}, "initial": {"band": "none"}},
        "rules": [
            {"when": "price >= 3", "set": {"band": '"high"'}},
            {"when": "price <= 1", "set": {"band": '"low"'}},
        ],
    },
    # the last price and volume per symbol: one event replaces both
    "last_trade": {
        "key": "symbol",
        "state": {"schema": {"p": "float", "v": "int"}, "initial": {"p": 0, "v": 0}},
        "rules": [{"set": {"p": "price", "v": "vol"}}],
    },
    # a two-part key and an event schema of its own
    "by_venue": {
        "key": {"venue": "venue", "symbol": "symbol"},
        "event": {"venue": "str", "symbol": "str", "price": "float"},
        "state": {"schema": {"last": "float"}, "initial": {"last": 0}},
        "rules": [{"set": {"last": "price"}}],
    },
}

CATALOG = Interpretations(RULESETS)


def interp(name: str) -> Interpretation:
    return CATALOG.get(name, None if name == "by_venue" else TRADE)


def t(symbol: str, price: float, vol: int = 1) -> dict[str, Any]:
    return {"symbol": symbol, "price": float(price), "vol": vol}


# ------------------------------------------------------------------ table

# (rule set, events seen, backlog, expected catch-up)
CASES: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]] = [
    # one event per symbol that changed, the latest; unread fields from its last event
    (
        "latest",
        [],
        [t("IBM", 100, 1), t("HP", 50, 2), t("IBM", 120, 3), t("IBM", 110, 4), t("HP", 51, 5)],
        [t("IBM", 110, 4), t("HP", 51, 5)],
    ),
    ("latest", [t("IBM", 100)], [t("IBM", 120), t("IBM", 100)], []),  # back where the subscriber was
    ("latest", [], [t("IBM", 5), t("IBM", 0)], []),  # back to the initial row
    ("latest", [], [], []),
    # keys in the order of their last change
    ("latest", [], [t("A", 1), t("B", 2), t("A", 3)], [t("B", 2), t("A", 3)]),
    # the maximum: lower prices change nothing
    ("max_price", [t("IBM", 160)], [t("IBM", 150), t("IBM", 120)], []),
    (
        "max_price",
        [t("IBM", 160)],
        [t("IBM", 170, 7), t("HP", 3), t("IBM", 200, 8), t("IBM", 180), t("HP", 9)],
        [t("IBM", 200, 8), t("HP", 9)],
    ),
    # the paper's reconnect example: seen <160, 140>, now <200, 120>
    (
        "max_cur",
        [t("IBM", 160), t("IBM", 140)],
        [t("IBM", 150), t("IBM", 200), t("IBM", 180), t("IBM", 130), t("IBM", 120)],
        [t("IBM", 200), t("IBM", 120)],
    ),
    ("max_cur", [t("IBM", 160), t("IBM", 140)], [t("IBM", 150), t("IBM", 155)], [t("IBM", 155)]),
    # a counter cannot be compressed: every increment is needed
    ("count", [t("A", 1)], [t("A", 1), t("B", 1), t("A", 2)], [t("B", 1), t("A", 1), t("A", 2)]),
    # a sum can: one event carries the difference when the search has that value (the goal's)
    ("volume", [], [t("A", 0, 1), t("A", 0, 1), t("A", 0, 1)], [{"symbol": "A", "price": 0.0, "vol": 3}]),
    # guards on constants: the last event that reaches the band alone
    ("band", [], [t("A", 5), t("A", 0), t("A", 4), t("A", 2)], [t("A", 4)]),
    ("band", [t("A", 5)], [t("A", 0), t("A", 4)], []),
    # two columns replaced by one event
    ("last_trade", [t("A", 1, 1)], [t("A", 2, 2), t("A", 3, 3)], [t("A", 3, 3)]),
    # a two-part key
    (
        "by_venue",
        [],
        [
            {"venue": "N", "symbol": "IBM", "price": 1},
            {"venue": "Q", "symbol": "IBM", "price": 2},
            {"venue": "N", "symbol": "IBM", "price": 3},
        ],
        [{"venue": "Q", "symbol": "IBM", "price": 2.0}, {"venue": "N", "symbol": "IBM", "price": 3.0}],
    ),
]


@pytest.mark.parametrize(("name", "seen", "backlog", "expected"), CASES)
def test_catch_up_cases(
    name: str, seen: list[dict[str, Any]], backlog: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    i = interp(name)
    state = i.fold({}, seen)
    out = i.catch_up(state, backlog)
    assert out == expected
    assert i.fold(state, out) == i.fold(state, backlog)


def test_fold_gives_the_rows_that_differ_from_initial() -> None:
    i = interp("max_cur")
    state = i.fold({}, [t("IBM", 160), t("IBM", 140), t("HP", 5)])
    assert state == {("IBM",): (160.0, 140.0), ("HP",): (5.0, 5.0)}
    assert i.fold(state, []) == state
    assert i.fold(state, [t("IBM", 200)]) == {("IBM",): (200.0, 200.0), ("HP",): (5.0, 5.0)}
    assert state == {("IBM",): (160.0, 140.0), ("HP",): (5.0, 5.0)}  # unchanged
    assert interp("latest").fold({}, [t("A", 3), t("A", 0)]) == {}  # the initial row is not kept


def test_a_long_backlog_becomes_one_event_per_symbol() -> None:
    i = interp("max_cur")
    symbols = ["IBM", "HP", "SUN"]
    backlog = [t(symbols[n % 3], (n * 7919) % 500) for n in range(10_000)]
    seen = i.fold({}, backlog[:100])
    out = i.catch_up(seen, backlog[100:])
    assert len(out) <= 2 * len(symbols)
    assert i.fold(seen, out) == i.fold(seen, backlog[100:])


def test_rows_and_back() -> None:
    i = interp("max_cur")
    state = i.fold({}, [t("IBM", 160), t("IBM", 140)])
    rows = i.rows(state)
    assert rows == [{"symbol": "IBM", "maxP": 160.0, "curP": 140.0}]
    assert i.state_of(rows) == state
    assert i.state_of([{"symbol": "X", "maxP": 0, "curP": 0}]) == {}  # initial rows are dropped
    with pytest.raises(FlowError, match="missing 'curP'"):
        i.state_of([{"symbol": "IBM", "maxP": 1.0}])


def test_each_rule_set_is_bound_once_per_event_schema() -> None:
    c = Interpretations(RULESETS)
    a = c.get("latest", TRADE)
    assert c.get("latest", dict(TRADE)) is a
    b = c.get("latest", {"symbol": "str", "price": "float"})
    assert b is not a and b.event.to_dict() == {"symbol": "str", "price": "float"}
    assert "latest" in c and "nope" not in c
    assert c.names() == list(RULESETS)
    assert a.key_names == ("symbol",) and a.components == ("last",) and a.initial == (0.0,)


def test_from_yaml_and_load_interpretation() -> None:
    text = """
    listen: 127.0.0.1:7000
    rulesets:
      max_price:
        description: the highest price per symbol
        key: {symbol: symbol}
        state: {schema: {maxP: float}, initial: {maxP: 0}}
        rules:
          - {when: "price > maxP", set: {maxP: price}}
    """
    c = Interpretations.from_yaml(text)
    i = c.get("max_price", TRADE)
    assert i.catch_up({}, [t("A", 1), t("A", 3), t("A", 2)]) == [t("A", 3)]
    assert Interpretations.from_yaml("listen: x").names() == []
    assert Interpretations.from_yaml("").names() == []
    j = load_interpretation("count", RULESETS, TRADE)
    assert j.fold({}, [t("A", 1), t("A", 1)]) == {("A",): (2,)}


def test_the_state_may_be_left_to_the_rules() -> None:
    rulesets = {
        "mixed": {
            "key": "symbol",
            "state": {"schema": {"n": "int"}, "initial": {"hi": 10}},  # n declared; hi, lo, mean inferred
            "rules": [
                {"when": "n = 0", "set": {"n": 1, "hi": "price", "lo": "vol", "mean": "price"}},
                {
                    "set": {
                        "n": "n + 1",
                        "hi": "max(hi, price)",
                        "lo": "lo + 0.5",
                        "mean": "(mean + price) / 2",
                    }
                },
            ],
        }
    }
    i = Interpretations(rulesets).get("mixed", TRADE)
    assert i.state.to_dict() == {"symbol": "str", "n": "int", "hi": "float", "lo": "float", "mean": "float"}
    assert i.components == ("n", "hi", "lo", "mean")
    assert i.initial == (0, 10.0, 0.0, 0.0)  # a component without an initial value: its type's zero
    state = i.fold(None, [t("A", 4, 2), t("A", 6, 2)])
    assert state == {("A",): (2, 6.0, 2.5, 5.0)}
    out = i.catch_up(None, [t("A", 4, 2), t("A", 6, 2)])
    assert i.fold(None, out) == state and len(out) <= 2


STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"


def test_the_flow_specs_rule_sets_serve_as_they_are() -> None:
    """examples/stocks/flow.yaml's rule sets, verbatim, over the schemas of the spaces they fold."""
    c = Interpretations.from_yaml(STOCKS.read_text(encoding="utf-8"))
    assert c.names() == ["max_cur", "trend", "drop_events"]
    ticks = {"name": "str", "price": "float"}
    max_cur = c.get("max_cur", ticks)
    seen = max_cur.fold(None, [{"name": "IBM", "price": 160}, {"name": "IBM", "price": 140}])
    backlog = [{"name": "IBM", "price": p} for p in (150, 200, 180, 130, 120)]
    assert max_cur.catch_up(seen, backlog) == [
        {"name": "IBM", "price": 200.0},
        {"name": "IBM", "price": 120.0},
    ]
    trend = c.get("trend", ticks)  # n, avg, last, peak, drop: int, then floats (drop: 0, then peak - price)
    assert trend.state.to_dict() == {
        "name": "str",
        "n": "int",
        "avg": "float",
        "last": "float",
        "peak": "float",
        "drop": "float",
    }
    seen = trend.fold(None, backlog[:2])
    out = trend.catch_up(seen, backlog[2:])
    assert trend.fold(seen, out) == trend.fold(seen, backlog[2:]) and len(out) <= 3
    drops = c.get("drop_events", {"name": "str", "drop": "float"})
    assert drops.catch_up(None, [{"name": "IBM", "drop": d} for d in (1, 5, 3)]) == [
        {"name": "IBM", "drop": 3.0}
    ]


def test_functions_reach_the_rules() -> None:
    rulesets = {
        "named": {
            "key": "symbol",
            "state": {"schema": {"com": "str"}, "initial": {"com": ""}},
            "rules": [{"set": {"com": "NAME(symbol)"}}],
        }
    }
    i = Interpretations(rulesets, functions={"NAME": {"IBM": "International"}}).get("named", TRADE)
    assert i.fold({}, [t("IBM", 1), t("HP", 1)]) == {("IBM",): ("International",)}  # a miss: unchanged


def test_a_search_that_gives_up_falls_back_to_the_backlog() -> None:
    c = Interpretations(RULESETS, max_states=1)
    i = c.get("max_cur", TRADE)
    seen = i.fold({}, [t("IBM", 160), t("IBM", 140)])
    backlog = [t("IBM", 150), t("IBM", 200), t("IBM", 120)]  # the shortest is 2, found past 1 state
    out = i.catch_up(seen, backlog)
    assert i.fold(seen, out) == i.fold(seen, backlog) and len(out) <= len(backlog)


# -------------------------------------------------------------- property

KEYS = ["A", "B"]
PRICES = [0, 1, 2, 3, 4]
VOLS = [1, 2]

#: Rule sets where the search's candidate values always suffice: its answer is the shortest of all.
EXACT = {"latest", "max_price", "max_cur", "count", "last_trade", "band"}


def trades(n: int) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(
        st.builds(t, st.sampled_from(KEYS), st.sampled_from(PRICES), st.sampled_from(VOLS)), max_size=n
    )


def brute_force(i: Interpretation, seen: Mapping[Any, Any], goal: Mapping[Any, Any]) -> int:
    """The fewest events taking ``seen`` to ``goal``: a BFS per key over every event of the test values.

    (The goal is reachable -- the backlog reaches it -- so the search ends.)
    """
    total = 0
    for key in set(seen) | set(goal):
        start, end = seen.get(key, i.initial), goal.get(key, i.initial)
        events = [t(key[0], p, v) for p in PRICES for v in VOLS]
        dist, queue = {start: 0}, deque([start])
        while end not in dist:
            row = queue.popleft()
            for ev in events:
                nxt = i.bound.step(key, row, ev) or row
                if nxt not in dist:
                    dist[nxt] = dist[row] + 1
                    queue.append(nxt)
        total += dist[end]
    return total


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(set(RULESETS) - {"by_venue"})), trades(6), trades(12))
def test_catch_up_is_equivalent_never_longer_and_shortest(
    name: str, seen_events: list[dict[str, Any]], backlog: list[dict[str, Any]]
) -> None:
    i = interp(name)
    seen = i.fold({}, seen_events)
    out = i.catch_up(seen, backlog)
    goal = i.fold(seen, backlog)
    assert i.fold(seen, out) == goal
    assert len(out) <= len(backlog)
    assert all(set(ev) == set(TRADE) for ev in out)
    if name in EXACT:
        assert len(out) == brute_force(i, seen, goal), (name, seen, backlog, out)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(set(RULESETS) - {"by_venue"})), trades(30), st.integers(1, 7))
def test_a_queue_folds_its_deliveries_in_batches_as_a_checked_fold_does(
    name: str, backlog: list[dict[str, Any]], batch: int
) -> None:
    i = interp(name)
    seen = i.fold(None, [], delivered=True)
    for lo in range(0, len(backlog), batch):
        seen = i.fold(seen, backlog[lo : lo + batch], delivered=True)
    assert seen == i.fold({}, backlog)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["A", "B", "C"]), max_size=40), st.lists(st.sampled_from(KEYS), max_size=5))
def test_a_counter_needs_every_increment(backlog_keys: Sequence[str], seen_keys: Sequence[str]) -> None:
    i = interp("count")
    seen = i.fold({}, [t(k, 0) for k in seen_keys])
    out = i.catch_up(seen, [t(k, 0) for k in backlog_keys])
    assert len(out) == len(backlog_keys)


# ------------------------------------------------------------------ errors


def test_unknown_rule_set() -> None:
    with pytest.raises(FlowError, match=r"unknown rule set 'max_prise' \(did you mean 'max_price'\?\)"):
        CATALOG.get("max_prise", TRADE)
    with pytest.raises(FlowError, match="none configured"):
        Interpretations({}).get("latest", TRADE)


def _with(name: str, **changes: Any) -> dict[str, Any]:
    spec = {**RULESETS[name], **changes}
    return {name: {k: v for k, v in spec.items() if v is not None}}


BAD_CONFIGS: list[tuple[Any, str]] = [
    ([], "rulesets must map names"),
    ({"x": "latest"}, "a rule set is a mapping"),
    (_with("latest", key=None), "missing key 'key'"),
    (_with("latest", rules=None), "missing key 'rules'"),
    (_with("latest", rulse=[]), "unknown key 'rulse'"),
    (_with("latest", rules=[]), "no rules"),
    (_with("latest", rules=[{"set": {"last": "price +"}}]), "rule 1: set 'last'"),
    (_with("latest", rules=[{"when": "price >", "set": {"last": "price"}}]), "rule 1: when"),
    (_with("latest", key={"symbol": "NAME(symbol)"}), "plain event field"),
    (_with("latest", state={"schema": {"last": "float"}, "start": {}}), "state: unknown key 'start'"),
    (_with("latest", state={"initial": {"lsat": 0}}), "initial value for 'lsat', which is not a component"),
    (_with("latest", state={"schema": {"last": "money"}}), "unknown type 'money'"),
    (_with("latest", state={"initial": {"last": "x"}}), "state: initial: 'last' must be float, got str"),
    (
        _with("latest", state={"schema": {"last": "float"}, "initial": {"last": 0, "symbol": "x"}}),
        "initial value for 'symbol', which is a key component",
    ),
    (_with("latest", state=None, rules=[{"set": {}}]), "no component besides the key"),
    (_with("count", state=None), r"cannot tell the type of 'n'.*\(n \+ 1\): declare it"),
    (
        _with("latest", rules=[{"set": {"last": "price"}}, {"set": {"last": '"x"'}}], state=None),
        r"cannot tell the type of 'last' \(its rules give float/str\)",
    ),
    (_with("latest", rules=[{"set": {"last": "prise"}}], state=None), "did you mean 'price'"),
    (_with("latest", rules=[{"set": {"last": "vol / 2"}}], state={"schema": {"last": "int"}}), "a float"),
    (_with("by_venue", event={"venue": "str"}), "'symbol', which is not a field"),
    (_with("by_venue", event={"venue": "str", "symbol": "str", "price": "money"}), "unknown type 'money'"),
]


@pytest.mark.parametrize(("rulesets", "wanted"), BAD_CONFIGS)
def test_bad_configs_are_refused_with_the_rule_set_named(rulesets: Any, wanted: str) -> None:
    with pytest.raises(FlowError, match=wanted) as info:
        c = Interpretations(rulesets)  # the syntax, and the binding of a declared event schema
        for name in c.names():
            c.get(name, TRADE)  # the rest binds over the space's schema
    assert "rule set" in str(info.value) or "rulesets" in str(info.value)


BAD_BINDINGS: list[tuple[str, Any, str]] = [
    ("latest", None, "declares no event schema"),
    ("latest", {"symbol": "str"}, "rule set 'latest': rule 1: last"),  # the rules read price
    ("latest", {"sym": "str", "price": "float"}, "key 'symbol' reads 'symbol', which is not a field"),
    ("max_price", {"symbol": "str", "price": "str"}, "rule set 'max_price'"),  # a str price vs a float
    ("by_venue", TRADE, "declared over events"),
    ("latest", {}, "a schema maps field names"),
]


@pytest.mark.parametrize(("name", "event", "wanted"), BAD_BINDINGS)
def test_rules_that_do_not_fit_the_events_are_refused(name: str, event: Any, wanted: str) -> None:
    with pytest.raises(FlowError, match=wanted):
        CATALOG.get(name, event)


def test_bad_yaml() -> None:
    with pytest.raises(FlowError, match="not valid YAML at line 1"):
        Interpretations.from_yaml("rulesets: {")
    with pytest.raises(FlowError, match="broker config is a mapping"):
        Interpretations.from_yaml("- a")


BAD_EVENTS: list[tuple[Any, str, str | None]] = [
    ({"symbol": "A", "price": 1.0}, "backlog event 1: field 'vol' is missing", "vol"),
    ({"symbol": "A", "price": "1", "vol": 1}, "backlog event 1: field 'price' must be float", "price"),
    ({"symbol": "A", "price": 1.0, "vol": 1, "x": 2}, "field 'x' is not in the schema", "x"),
    ({"symbol": "A", "price": math.nan, "vol": 1}, "field 'price' is NaN", "price"),
    ([("symbol", "A")], "backlog event 1 is not a mapping", None),
]


@pytest.mark.parametrize(("event", "wanted", "field"), BAD_EVENTS)
def test_events_that_do_not_fit(event: Any, wanted: str, field: str | None) -> None:
    i = interp("latest")
    seen = {("A",): (1.0,)}
    with pytest.raises(SchemaError, match=wanted) as info:
        i.catch_up(seen, [t("A", 2), event])
    assert info.value.field == field
    assert seen == {("A",): (1.0,)}
    with pytest.raises(SchemaError, match=wanted.replace("backlog event 1", "event 0")):
        i.fold({}, [event])
    if "must be" not in wanted:  # (a delivered event's types were checked when it was published)
        with pytest.raises(SchemaError, match=wanted.replace("backlog event 1", "event 1")):
            i.fold(seen, [t("A", 2), event], delivered=True)


BAD_STATES: list[tuple[Any, str]] = [
    ([("A", 1.0)], "seen state must map key tuples to row tuples"),
    ({"A": (1.0,)}, "key 'A': expected a tuple of 1 \\(symbol\\)"),
    ({("A", "B"): (1.0,)}, "expected a tuple of 1"),
    ({("A",): 1.0}, "row 1.0 of key \\('A',\\): expected a tuple of 1 \\(last\\)"),
    ({("A",): ("1",)}, "'last' must be float, got str '1'"),
    ({(1,): (1.0,)}, "'symbol' must be str, got int 1"),
]


@pytest.mark.parametrize(("state", "wanted"), BAD_STATES)
def test_malformed_seen_states(state: Any, wanted: str) -> None:
    with pytest.raises(FlowError, match=wanted):
        interp("latest").catch_up(state, [t("A", 1)])


def test_every_error_is_a_flowbus_error() -> None:
    for exc in (FlowError, SchemaError):
        assert issubclass(exc, FlowbusError)


# ------------------------------------------ the search tries the backlog's values (issue 16, item 7)

XY = {
    "key": "a",
    "event": {"a": "str", "v": "int"},
    "state": {"schema": {"x": "int", "y": "int"}},
    "rules": [{"when": "x > 100 & v < 10", "set": {"y": "v"}}, {"when": "v < 200", "set": {"x": "v"}}],
}


@pytest.mark.parametrize(
    ("published", "length"),
    [
        ([150, 7, 50], 3),  # the example: y takes 7 only while x > 100
        ([150, 120, 7, 50, 60], 3),  # [150 or 120, 7, 60]: 150 and 120 are in no row, only in the backlog
        ([150, 7, 150, 7, 50], 3),
    ],
)
def test_catch_up_searches_with_the_backlogs_values(published: list[int], length: int) -> None:
    i = Interpretations({"xy": XY}).get("xy")
    backlog = [{"a": "a", "v": v} for v in published]
    out = i.catch_up({}, backlog)
    assert i.fold({}, out) == i.fold({}, backlog) == {("a",): (published[-1], 7)}
    assert len(out) == length
