"""A takeover's barrier (routing/ring_barrier.py): the deliveries to subscriptions taken over
wait for every asked broker's ``Drained``, the kept events themselves too, and are
released in each publisher's order; a barrier nobody answers is released after
``DRAIN_ROUNDS`` rounds."""

from __future__ import annotations

from flowbus.core import Deliver, DeliverAll, Send
from flowbus.meta import EVENT_ID
from flowbus.routing.ring_barrier import DRAIN_ROUNDS, Barriers, Drain


def _ev(p: str, i: int) -> dict[str, object]:
    return {"x": i, EVENT_ID: (p, i)}


def test_deliveries_wait_for_every_answer_and_go_in_each_publishers_order() -> None:
    b = Barriers()
    assert b.open(9, ["a", "b"], [2, 3]) == [Send(2, Drain(9)), Send(3, Drain(9))]
    assert b.hold(("a", "own"), _ev("p", 7)) == ("own",)  # ("a" waits)
    assert b.hold(("a", "b"), _ev("q", 1)) == ()
    assert b.hold(("b",), _ev("p", 3)) == ()  # (a kept one, handed over: waits with the others)
    assert b.hold(("a",), _ev("p", 5)) == ()
    assert b.drained(2, 9) == []  # (3 has not answered)
    assert b.drained(2, 8) == []  # (no such barrier)
    released = b.drained(3, 9)
    assert released == [
        Deliver("b", _ev("p", 3)),
        Deliver("a", _ev("p", 5)),
        Deliver("a", _ev("p", 7)),
        DeliverAll(("a", "b"), _ev("q", 1)),
    ]
    assert b.released == 1 and not b
    assert b.hold(("a",), _ev("p", 8)) == ("a",)  # (open again)


def test_a_barrier_nobody_answers_is_released_after_its_rounds() -> None:
    b = Barriers()
    b.open(9, ["a"], [2])
    b.hold(("a",), _ev("p", 2))
    b.hold(("a",), _ev("p", 1))
    for _ in range(DRAIN_ROUNDS - 1):
        assert b.round() == []
    assert b.round() == [Deliver("a", _ev("p", 1)), Deliver("a", _ev("p", 2))]
    assert b.overdue == 1 and b.drained(2, 9) == []


def test_a_subscription_no_longer_served_waits_for_nothing() -> None:
    b = Barriers()
    b.open(9, ["a", "b"], [2])
    b.forget("a")
    assert b.hold(("a", "b"), _ev("p", 1)) == ("a",)
    assert b.open(9, [], [2]) == [] and b.open(8, ["c"], []) == []
