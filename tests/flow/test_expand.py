"""Expand (section 4.2): the paper's reconnect example, several keys, ceil(m/k), A* against BFS, errors."""

from __future__ import annotations

import importlib
import itertools
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.filters import parse
from flowbus.filters.expr import parse_expression
from flowbus.flow import ExpandError, Graph, Rule, RuleSet, expand, expand_key
from flowbus.flow.collapse import BoundRules
from flowbus.flow.expand import Heuristic, analyse, shorten
from flowbus.flow.validate import bind_rules
from flowbus.model import Schema

IBM = ("IBM",)
expand_module = importlib.import_module("flowbus.flow.expand")  # the package exports a function of that name


@pytest.fixture
def max_cur(stocks: Graph) -> BoundRules:
    return bind_rules(stocks, stocks.arc("E4"))


def _replay(bound: BoundRules, key: tuple[Any, ...], row: tuple[Any, ...], events: Any) -> tuple[Any, ...]:
    for ev in events:
        nxt = bound.step(key, row, ev)
        row = row if nxt is None else nxt
    return row


def test_the_papers_reconnect_example(max_cur: BoundRules) -> None:
    result = expand_key(max_cur, IBM, (160.0, 140.0), (200.0, 120.0))
    assert [dict(e) for e in result.events] == [
        {"name": "IBM", "price": 200.0},
        {"name": "IBM", "price": 120.0},
    ]
    assert result.states_expanded == 2  # <160, 140>, then <200, 200>; the goal is reached from there


def test_the_papers_estimates(max_cur: BoundRules) -> None:
    h = Heuristic(max_cur, IBM, (200.0, 120.0))
    assert h((160.0, 140.0)) == 2  # only the second row can end in <200, 120>: maxP needs another event
    assert h((200.0, 200.0)) == 1
    assert h((200.0, 160.0)) == 1
    assert h((160.0, 120.0)) == 2
    assert h((200.0, 120.0)) == 0
    assert analyse(max_cur).kind == "constrained"  # the first row replaces maxP and curP by one value


def test_one_event_when_one_suffices(max_cur: BoundRules) -> None:
    assert [e["price"] for e in expand_key(max_cur, IBM, (160.0, 140.0), (160.0, 150.0)).events] == [150.0]
    assert [e["price"] for e in expand_key(max_cur, IBM, (160.0, 140.0), (170.0, 170.0)).events] == [170.0]
    assert expand_key(max_cur, IBM, (160.0, 140.0), (160.0, 140.0)).events == ()


def test_several_keys_one_sequence_each_merged(max_cur: BoundRules) -> None:
    start = {("IBM",): (160.0, 140.0), ("HP",): (50.0, 45.0), ("SUN",): (9.0, 9.0)}
    goal = {("IBM",): (200.0, 120.0), ("HP",): (50.0, 50.0), ("SUN",): (9.0, 9.0), ("DEC",): (30.0, 20.0)}
    result = expand(max_cur, start, goal)
    by_key = {k.key: k for k in result.keys}
    assert {k: len(v.events) for k, v in by_key.items()} == {
        ("IBM",): 2,
        ("HP",): 1,
        ("SUN",): 0,
        ("DEC",): 2,
    }
    assert [e["name"] for e in result.events] == ["DEC", "DEC", "HP", "IBM", "IBM"]  # key order, per key
    for key, target in goal.items():
        mine = [e for e in result.events if e["name"] == key[0]]
        assert _replay(max_cur, key, start.get(key, max_cur.initial), mine) == target
    assert result.states_expanded == sum(k.states_expanded for k in result.keys)


def test_unreachable_goal_is_an_error(max_cur: BoundRules) -> None:
    with pytest.raises(ExpandError, match="no event sequence takes"):
        expand_key(max_cur, IBM, (160.0, 140.0), (100.0, 120.0))  # the maximum never decreases


def test_a_goal_no_rule_can_produce_is_refused_at_once() -> None:
    rules = RuleSet("r", (("k", parse_expression("k")),), (Rule((("a", parse_expression("0")),)),))
    bound = _bound(rules, ("a",))
    with pytest.raises(ExpandError, match="no rule can produce the goal"):
        expand_key(bound, ("K",), (1,), (5,))


def test_cost_bound(max_cur: BoundRules) -> None:
    with pytest.raises(ExpandError, match="at most 1 events"):
        expand_key(max_cur, IBM, (160.0, 140.0), (200.0, 120.0), max_cost=1)
    assert len(expand_key(max_cur, IBM, (160.0, 140.0), (200.0, 120.0), max_cost=2).events) == 2
    goal = {("IBM",): (200.0, 120.0), ("HP",): (60.0, 50.0)}
    with pytest.raises(ExpandError, match="at most 1 events"):
        expand(max_cur, {("IBM",): (160.0, 140.0)}, goal, max_cost=3)  # 2 for IBM leaves 1 for HP's 2


def test_search_limit(max_cur: BoundRules) -> None:
    with pytest.raises(ExpandError, match="gave up after 1 states"):
        expand_key(max_cur, IBM, (160.0, 140.0), (200.0, 120.0), max_states=1)


# ------------------------------------------------------ uniform unconstrained


def _bound(rules: RuleSet, components: tuple[str, ...], event: dict[str, str] | None = None) -> BoundRules:
    fields = event or {"k": "str", "x": "int", "y": "int"}
    return BoundRules(
        rules,
        event=Schema.of(fields),
        state=Schema.of({"k": "str", **dict.fromkeys(components, "int")}),
        key_names=("k",),
        components=components,
        initial=(0,) * len(components),
        functions={},
        where="test",
    )


def _uniform(m: int, k: int) -> BoundRules:
    """Every k of the m columns has a row replacing them by k distinct parameters p0..p(k-1)."""
    columns = [f"c{i}" for i in range(m)]
    rules = []
    for n, chosen in enumerate(itertools.combinations(columns, k)):
        sets = tuple((c, parse_expression(f"p{j}")) for j, c in enumerate(chosen))
        rules.append(Rule(sets, parse(f'row = "r{n}"')))
    event = {"k": "str", "row": "str", **{f"p{j}": "int" for j in range(k)}}
    return _bound(RuleSet("uniform", (("k", parse_expression("k")),), tuple(rules)), tuple(columns), event)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from([(3, 1), (4, 2), (5, 2), (4, 3)]), st.data())
def test_uniform_unconstrained_needs_exactly_ceil_m_over_k(mk: tuple[int, int], data: st.DataObject) -> None:
    m, k = mk
    bound = _uniform(m, k)
    assert analyse(bound).kind == "uniform unconstrained" and analyse(bound).k == k
    start = tuple(data.draw(st.lists(st.integers(0, 5), min_size=m, max_size=m)))
    goal = tuple(data.draw(st.lists(st.integers(0, 5), min_size=m, max_size=m)))
    differ = sum(a != b for a, b in zip(start, goal, strict=True))
    result = expand_key(bound, ("K",), start, goal)
    assert len(result.events) == math.ceil(differ / k)
    assert Heuristic(bound, ("K",), goal)(start) == math.ceil(differ / k)
    assert _replay(bound, ("K",), start, result.events) == goal


# ------------------------------------------------------------ against BFS

GUARDS = ["true", "x > a", "x = b", "a < b", "x != 2", "y >= x", "x + y = 3", "!(a = 1)", "b in {0, 3}"]
VALUES = ["x", "y", "0", "1", "3", "a", "b", "x + 1", "max(a, x)", "min(b, y)"]


def _random_rules(rng: random.Random) -> RuleSet:
    rules = []
    for _ in range(rng.randint(1, 4)):
        columns = rng.sample(["a", "b", "c"], rng.randint(1, 2))
        sets = tuple((c, parse_expression(rng.choice(VALUES))) for c in columns)
        rules.append(Rule(sets, parse(rng.choice(GUARDS))))
    return RuleSet("random", (("k", parse_expression("k")),), tuple(rules))


def _bfs(
    bound: BoundRules,
    start: tuple[Any, ...],
    goal: tuple[Any, ...],
    published: Sequence[tuple[int, int]] = (),
) -> int | None:
    """The shortest distance by breadth-first search over every event built from the pool (x and y also
    from the ``published`` pairs' x and y)."""
    pool = [v for v in (*start, *goal, *bound.ruleset.constants()) if type(v) is int]
    xs, ys = sorted({*pool, *(x for x, _ in published)}), sorted({*pool, *(y for _, y in published)})
    events = [{"k": "K", "x": x, "y": y} for x in xs for y in ys]
    seen, queue = {start: 0}, deque([start])
    while queue:
        row = queue.popleft()
        if row == goal:
            return seen[row]
        for ev in events:
            nxt = bound.step(("K",), row, ev)
            if nxt is not None and nxt not in seen:
                seen[nxt] = seen[row] + 1
                queue.append(nxt)
    return None


def test_astar_finds_the_length_bfs_finds() -> None:
    rng = random.Random(20240601)
    lengths: Counter[int | None] = Counter()
    for _ in range(800):
        bound = _bound(_random_rules(rng), ("a", "b", "c"))
        start = tuple(rng.randint(0, 3) for _ in range(3))
        goal = start
        for _ in range(rng.randint(0, 6)):  # mostly a goal some events away, sometimes any row
            ev = {"k": "K", "x": rng.randint(0, 3), "y": rng.randint(0, 3)}
            goal = bound.step(("K",), goal, ev) or goal
        if rng.random() < 0.25:
            goal = tuple(rng.randint(0, 3) for _ in range(3))
        expected = _bfs(bound, start, goal)
        lengths[expected] += 1
        if expected is None:
            with pytest.raises(ExpandError):
                expand_key(bound, ("K",), start, goal)
            continue
        assert Heuristic(bound, ("K",), goal)(start) <= expected  # admissible: never overestimates
        result = expand_key(bound, ("K",), start, goal)
        assert len(result.events) == expected, (bound.describe(), start, goal)
        assert _replay(bound, ("K",), start, result.events) == goal
    assert sum(n for length, n in lengths.items() if length is not None and length >= 2) >= 50, lengths
    assert lengths[None] >= 20, lengths


# ------------------------------------------------- with a backlog (issue 16, item 7)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.integers(0, 2**32),
    st.lists(st.tuples(st.integers(-3, 12), st.integers(-3, 12)), min_size=1, max_size=7),
)
def test_shorten_never_fails_never_exceeds_the_backlog_and_is_shortest(
    seed: int, published: list[tuple[int, int]]
) -> None:
    rng = random.Random(seed)
    bound = _bound(_random_rules(rng), ("a", "b", "c"))
    start = tuple(rng.randint(0, 3) for _ in range(3))
    backlog = [{"k": "K", "x": x, "y": y} for x, y in published]
    goal = _replay(bound, ("K",), start, backlog)
    result = shorten(bound, ("K",), start, goal, backlog)
    assert _replay(bound, ("K",), start, result.events) == goal
    assert len(result.events) <= len(backlog)
    assert len(result.events) == _bfs(bound, start, goal, published), (bound.describe(), start, published)


def test_shorten_falls_back_to_the_backlog_when_the_search_gives_up(max_cur: BoundRules) -> None:
    backlog = [{"name": "IBM", "price": p} for p in (150.0, 200.0, 180.0, 120.0)]
    goal = _replay(max_cur, IBM, (160.0, 140.0), backlog)
    assert shorten(max_cur, IBM, (160.0, 140.0), goal, backlog, max_states=0).events == tuple(backlog)
    assert [e["price"] for e in shorten(max_cur, IBM, (160.0, 140.0), goal, backlog).events] == [200.0, 120.0]


def test_a_backlog_with_too_many_values_to_combine_lends_its_events_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    xy = (
        Rule((("b", parse_expression("y")),), parse("a > 100 & x < 10")),
        Rule((("a", parse_expression("x")),), parse("x < 200")),
    )
    bound = _bound(RuleSet("xy", (("k", parse_expression("k")),), xy), ("a", "b"))
    backlog = [{"k": "K", "x": x, "y": y} for x, y in [(150, 0), (120, 0), (7, 7), (50, 0)]]
    goal = _replay(bound, ("K",), (0, 0), backlog)
    monkeypatch.setattr(expand_module, "MAX_CANDIDATES", 40)  # 6 x 6 usual, 8 x 6 with the backlog's values
    result = shorten(bound, ("K",), (0, 0), goal, backlog)
    assert len(result.events) == 3 and _replay(bound, ("K",), (0, 0), result.events) == goal
    assert result.events[0] in backlog[:2]  # x = 150 or 120 only the backlog's events carry
