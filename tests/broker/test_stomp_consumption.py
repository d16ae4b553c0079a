"""How far a durable STOMP subscription's client consumed each publisher's events
(:class:`flowbus.broker.stomp.Consumption`): what the ring keeps so that a broker taking the
subscription over does not send a STOMP client what it had (it cannot drop it by id)."""

from __future__ import annotations

from flowbus.broker.stomp import Consumption


def test_in_order_acknowledgements_move_each_publisher_on() -> None:
    c = Consumption({})
    for n in (1, 2, 3):
        c.sent("alice", n)
    c.sent("bob", 10)
    assert c.done("alice", 1) == 1 and c.done("alice", 2) == 2
    assert c.done("bob", 10) == 10
    assert c.upto == {"alice": 2, "bob": 10}
    assert c.covers("alice", 2) and not c.covers("alice", 3)


def test_one_acknowledged_before_an_earlier_one_counts_once_that_one_is() -> None:
    c = Consumption({})
    for n in (4, 5, 6):
        c.sent("alice", n)
    assert c.done("alice", 6) is None and c.done("alice", 5) is None
    assert not c.covers("alice", 5)
    assert c.done("alice", 4) == 6 and c.covers("alice", 6)


def test_one_given_back_keeps_its_place_and_holds_the_others_until_it_is_acknowledged() -> None:
    c = Consumption({})
    for n in (1, 2, 3):
        c.sent("alice", n)
    assert c.done("alice", 2) is None and c.done("alice", 3) is None  # (1 was NACKed: sent again)
    c.sent("alice", 1)
    assert c.done("alice", 1) == 3


def test_what_a_taker_knew_is_the_start_and_nothing_below_it_is_counted_again() -> None:
    c = Consumption({"alice": 5})
    c.sent("alice", 5)  # (covered already: not waited for)
    c.sent("alice", 6)
    assert c.done("alice", 5) is None and c.done("alice", 6) == 6


def test_a_flows_derived_events_are_not_counted() -> None:
    c = Consumption({})
    c.sent("trades/alarms/'IBM'", 1024)
    assert c.done("trades/alarms/'IBM'", 1024) is None and c.upto == {}
    assert c.covers("trades/alarms/'IBM'", 1024)  # (never held back: nothing to wait for)
