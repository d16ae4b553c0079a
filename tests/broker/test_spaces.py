"""A broker's spaces: events and filters checked against the schemas with the reason named,
the routing filter that keeps spaces apart, collapse rule sets bound to a space."""

from __future__ import annotations

from flowbus.broker.config import DEFAULT
from flowbus.broker.spaces import Spaces
from flowbus.filters import parse
from flowbus.meta import SPACE

RULES = {"last": {"key": {"symbol": "symbol"}, "rules": [{"set": {"p": "price"}}]}}


def test_events_are_checked_and_tagged_with_their_space() -> None:
    spaces = Spaces(DEFAULT)
    assert spaces.check_event("events", {"x": 1}) == ({"x": 1, SPACE: "events"}, "")
    trade = {"symbol": "IBM", "price": 1, "quantity": 2, "exchange": "X", "level": 3}
    fields, _ = spaces.check_event("stocks", trade)
    assert fields == {**trade, "price": 1.0, SPACE: "stocks"}
    assert spaces.check_event("nope", {}) == (None, "unknown space 'nope' (known: events, stocks)")
    assert spaces.check_event("events", [1]) == (None, "an event is a map of field names to values, got list")
    assert spaces.check_event("events", {"__space": "x"}) == (
        None,
        "field names starting with '__' are reserved",
    )
    fields, why = spaces.check_event("stocks", {**trade, "level": "high"})
    assert fields is None and why.startswith("space 'stocks': field 'level' must be int")


def test_filters_are_checked_against_the_schema() -> None:
    spaces = Spaces(DEFAULT)
    filt, why = spaces.check_filter("stocks", "price > 1")
    assert filt is not None and why == ""
    assert spaces.check_filter("stocks", "colour = 1")[1] == (
        "filter: unknown field 'colour' in space 'stocks' (fields: symbol, price, quantity, exchange, level)"
    )
    assert spaces.check_filter("events", "colour = 1")[0] is not None  # (no schema: any field)
    assert spaces.check_filter("events", "x >")[1].startswith("filter: ")


def test_the_routing_filter_keeps_spaces_apart() -> None:
    routing = Spaces.routing_filter("stocks", parse('price > 1 | symbol = "A"'))
    assert routing.to_text() == '(__space = "stocks" & price > 1) | (__space = "stocks" & symbol = "A")'


def test_collapse_rule_sets_are_bound_to_a_space() -> None:
    spaces = Spaces(DEFAULT.with_(rulesets=RULES))
    assert spaces.check_collapse("last", "stocks") is None
    assert spaces.check_collapse("max", "stocks") == "unknown collapse rule set 'max' (known: last)"
    assert spaces.interpretation("last", "stocks") is spaces.interpretation("last", "stocks")
    bad = Spaces(DEFAULT.with_(rulesets={"bad": {"rules": "nonsense"}}))
    why = bad.check_collapse("bad", "stocks")
    assert why is not None and why.startswith("collapse rule set 'bad': ")
