"""OwnIndex (routing/flows_index.py) gives exactly the router's deliveries for a broker alone:
random filters (spaces, text equalities indexed or not, orderings, negations, sets, exists,
expressions, disjunctions) and events (missing fields, None, NaN, booleans, texts where
numbers are expected and back), through subscriptions coming and going; not alone, it
declines; on a ring broker with a flow, a paced step's events go through it."""

from __future__ import annotations

import math
import random
from typing import Any

from flowbus.core import DeliverAll
from flowbus.filters import Filter, parse
from flowbus.routing.cbr import ContentRouter
from flowbus.routing.flows_index import OwnIndex

SPACES = ("x", "y")
TEXTS = ("p", "q", "r")
VALUES: tuple[Any, ...] = (*TEXTS, 0, 1, 2.5, 7, -3, True, False, None, math.nan, math.inf, "")


def _literal(rng: random.Random) -> str:
    kind = rng.randrange(9)
    neg = "not " if rng.randrange(6) == 0 else ""
    field = rng.choice("abs")
    if kind <= 2:
        return f'{neg}s = "{rng.choice(TEXTS)}"'
    if kind <= 4:
        return f"{neg}{field} {rng.choice(['<', '<=', '>', '>='])} {rng.choice([0, 1, 2.5, 7, -3])}"
    if kind == 5:
        return f"{neg}{field} = {rng.choice(['1', '2.5', 'true', chr(34) + 'p' + chr(34)])}"
    if kind == 6:
        return f'{neg}{field} in {{1, "p", 2.5}}'
    if kind == 7:
        return f"{neg}exists {field}"
    return f"{neg}a + b > {rng.choice([0, 3])}"


def _filter(rng: random.Random) -> Filter:
    disjuncts = []
    for _ in range(1 if rng.randrange(4) else 2):
        lits = [_literal(rng) for _ in range(rng.randrange(0, 4))]
        if rng.randrange(5):
            lits.insert(rng.randrange(len(lits) + 1), f'__space = "{rng.choice(SPACES)}"')
        disjuncts.append(" & ".join(lits) if lits else "true")
    return parse(" | ".join(f"({d})" for d in disjuncts))


def _event(rng: random.Random) -> dict[str, Any]:
    event = {k: rng.choice(VALUES) for k in "abs" if rng.randrange(4)}
    event["__space"] = rng.choice(SPACES)
    return event


def _index(router: ContentRouter) -> OwnIndex:
    index = OwnIndex()
    index.update(router.changes, 1, router.table_size, lambda: router.received_from(1))
    return index


def test_equals_the_router_alone() -> None:
    rng = random.Random(17)
    for _ in range(60):
        router = ContentRouter(1, (), grouped=True)
        subs: list[str] = []
        for _ in range(rng.randrange(1, 30)):
            subs.append(f"s{len(subs)}")
            router.subscribe(subs[-1], _filter(rng))
        for _ in range(min(len(subs) - 1, rng.randrange(3))):  # (some go: the index keeps the table's order)
            router.unsubscribe(subs.pop(rng.randrange(len(subs))))
        index = _index(router)
        events = [_event(rng) for _ in range(30)]
        assert index.route(events) == router.route_batch(events, 1)


def test_an_indexed_text_and_others_in_one_space() -> None:
    router = ContentRouter(1, (), grouped=True)
    router.subscribe("ibm", parse('__space = "x" & s = "p" & a > 1'))
    router.subscribe("all", parse('__space = "x"'))
    router.subscribe("any", parse("a > 5"))
    router.subscribe("other", parse('__space = "y" & s = "p"'))
    events = [{"__space": "x", "s": "p", "a": 2}, {"__space": "x", "s": 1, "a": 9}, {"__space": "y"}]
    got = _index(router).route(events)
    assert got == [
        DeliverAll(("ibm", "all"), events[0]),
        DeliverAll(("all", "any"), events[1]),
    ]
    assert got == router.route_batch(events, 1)


def test_declines_when_a_neighbour_subscribes_or_a_space_is_not_text() -> None:
    router = ContentRouter(1, (2,), grouped=True)
    router.subscribe("a", parse('__space = "x"'))
    index = _index(router)
    assert index.route([{"__space": "x"}]) == router.route_batch([{"__space": "x"}], 1)
    assert index.route([{"__space": 3}]) is None
    router.on_message(2, _subscribe_from_neighbour(router), 0.0)
    index.update(router.changes, 1, router.table_size, lambda: router.received_from(1))
    assert index.route([{"__space": "x"}]) is None


def _subscribe_from_neighbour(router: ContentRouter) -> Any:
    from flowbus.routing.cbr import Subscribe

    return Subscribe((2, "b"), parse('__space = "x"'), 1)
