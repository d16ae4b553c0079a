"""The generated rule functions (flow/rulecode.py) against the interpreter's closures (BoundRules)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from tests.spark.flowgen import CODE, NUMBERS, TEXTS, _filter, _num

from flowbus.errors import FlowError, Undefined
from flowbus.filters.ast import Field, Filter
from flowbus.filters.expr import parse_expression
from flowbus.filters.parser import parse
from flowbus.flow.collapse import BoundRules, Rule, RuleSet
from flowbus.flow.expand import expand_key, expander
from flowbus.flow.rulecode import key_function, step_function
from flowbus.model import Schema

EVENT = {"k": "str", "a": "float", "b": "float"}
STATE = {"k": "str", "top": "float", "total": "float", "n": "int"}
VALUES = (*NUMBERS, 0.0, -0.0, 1e308, 10**400, math.nan, math.inf)
STATE_LITERALS = ("a > top", "total <= b", "n = 0", "!(top >= 1.5)", "top + total > a", 'k = "IBM"', "n >= 2")


def _value(rng: random.Random) -> str:
    """A float expression over the event and the state: flowgen's, or mixed with a state component."""
    if rng.random() < 0.5:
        return _num(rng)
    other = rng.choice(["top", "total", "n", "state.top", "event.a", "(n + 1)"])
    return f"({_num(rng, 1)} {rng.choice('+-*/')} {other})"


def _rule(rng: random.Random) -> Rule:
    sets: dict[str, str] = {}
    for name in rng.sample(["top", "total", "n"], rng.randint(1, 3)):
        sets[name] = rng.choice(["n + 1", "n - 1", "1", "n * 2"]) if name == "n" else _value(rng)
    when = Filter.true()
    if rng.random() < 0.7:
        when = parse(
            f"({_filter(rng)}) & {rng.choice(STATE_LITERALS)}" if rng.random() < 0.5 else _filter(rng)
        )
    return Rule(tuple((n, parse_expression(e)) for n, e in sets.items()), when)


def _bound(rules: tuple[Rule, ...]) -> BoundRules:
    return BoundRules(
        RuleSet("r", (("k", parse_expression("k")),), rules),
        event=Schema.of(EVENT),
        state=Schema.of(STATE),
        key_names=("k",),
        components=("top", "total", "n"),
        initial=(0.0, 0.0, 0),
        functions={"code": CODE},
        where="test",
    )


def _event(rng: random.Random) -> dict[str, Any]:
    ev = {"k": rng.choice(TEXTS), "a": rng.choice(VALUES), "b": rng.choice(VALUES)}
    if rng.random() < 0.1:
        del ev[rng.choice(["k", "a", "b"])]
    return ev


def _key(fn: Any, ev: dict[str, Any]) -> Any:
    try:
        return fn(ev)
    except Undefined:
        return "undefined"


def _same(x: Any, y: Any) -> bool:
    """Equal, NaN equal to NaN, and of the same types (an int stays an int)."""
    if x is None or y is None:
        return x is y
    return len(x) == len(y) and all(
        type(a) is type(b) and (a == b or (a != a and b != b)) for a, b in zip(x, y, strict=True)
    )


@pytest.mark.parametrize("seed", range(4))
def test_generated_step_is_the_interpreters(seed: int) -> None:
    rng = random.Random(seed)
    checked = 0
    while checked < 60:
        try:
            bound = _bound(tuple(_rule(rng) for _ in range(rng.randint(1, 3))))
        except FlowError:
            continue  # (a drawn rule that does not type-check)
        checked += 1
        step, key_of = step_function(bound), key_function(bound)
        row = bound.initial
        for _ in range(25):
            ev = _event(rng)
            assert _key(key_of, ev) == _key(bound.key_of, ev)
            want = bound.step(("a",), row, ev)
            got = step(("a",), row, ev)
            assert _same(got, want), (bound.describe(), row, ev, got, want)
            row = want if want is not None and rng.random() < 0.8 else row


def test_the_first_defined_rule_fires() -> None:
    """Division by zero leaves a rule's value undefined: the next rule whose guard holds fires."""
    bound = _bound((
        Rule((("top", parse_expression("a / b")),), parse("a > 0")),
        Rule((("total", parse_expression("total + a")), ("n", parse_expression("n + 1")))),
    ))  # fmt: skip
    step = step_function(bound)
    assert step(("x",), (0.0, 1.0, 2), {"k": "x", "a": 3.0, "b": 2.0}) == (1.5, 1.0, 2)
    assert step(("x",), (0.0, 1.0, 2), {"k": "x", "a": 3.0, "b": 0.0}) == (0.0, 4.0, 3)
    assert step(("x",), (0.0, 1.0, 2), {"k": "x", "b": 0.0}) is None  # a undefined: no rule fires


def _goal_rules(rng: random.Random) -> tuple[Rule, ...]:
    """A first rule writing every column from an event field of its own (a or b, and n from n), or a
    guarded or arithmetic one (no shortcut), then random rules."""
    first = [("top", "a"), ("total", "b"), ("n", "n")]
    rng.shuffle(first)
    kind = rng.randrange(3)
    sets = tuple((c, parse_expression(f"event.{f}" if f == "n" else f)) for c, f in first)
    if kind == 1:
        sets = ((sets[0][0], parse_expression("a + 1")), *sets[1:])
    head = Rule(sets, parse("a > 0") if kind == 2 else Filter.true())
    return (head, *(_rule(rng) for _ in range(rng.randint(0, 2))))


def test_the_event_read_off_the_goal_is_what_the_search_finds() -> None:
    """Expander.goal_event (the owners' expand shortcut) against expand_key, from random rows."""
    rng = random.Random(7)
    event = {**EVENT, "n": "int"}
    shortcuts = 0
    for _ in range(60):
        try:
            bound = BoundRules(
                RuleSet("r", (("k", parse_expression("k")),), _goal_rules(rng)),
                event=Schema.of(event), state=Schema.of(STATE), key_names=("k",),
                components=("top", "total", "n"), initial=(0.0, 0.0, 0), functions={"code": CODE}, where="t",
            )  # fmt: skip
        except FlowError:
            continue
        x = expander(bound)
        for _ in range(10):
            start, goal = (
                (rng.choice(VALUES[:9]), rng.choice(VALUES[:9]), rng.randrange(3)) for _ in range(2)
            )
            first = bound.ruleset.rules[0]
            plain = first.when == Filter.true() and all(isinstance(e, Field) for _, e in first.sets)
            assert (x.goal_event is not None) == plain
            if x.goal_event is not None and start != goal:
                got = x.goal_event(("IBM",), goal)
                shortcuts += 1
                found = expand_key(bound, ("IBM",), start, goal).events
                assert len(found) == 1 and repr(got) == repr(found[0])  # (the same values, of the same types)
    assert shortcuts > 50
