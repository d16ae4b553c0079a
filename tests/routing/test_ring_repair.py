"""The ring's repair (routing/ring_repair.py), piece by piece."""

from __future__ import annotations

from types import SimpleNamespace

from flowbus.core import Effect, Send
from flowbus.filters import parse
from flowbus.routing import cbr
from flowbus.routing.ring_custody import EVENT_ID, Custodian
from flowbus.routing.ring_repair import HandedOver, Repair


def test_orphans_are_handed_over_only_to_a_neighbour_the_event_does_not_go_to_already() -> None:
    """A dead tree neighbour's own subscriptions (orphans) go to the ring neighbour across the
    cut as ``HandedOver``; when that neighbour is a tree neighbour by now and the router sends
    it the event, the publish is enough (it serves what it took over). Both sent, custody kept
    one message per neighbour and lost the other (a traced split run: 40 lost)."""
    ring = SimpleNamespace(right=SimpleNamespace(addr=4), left=None)
    repair = Repair(ring, SimpleNamespace(), Custodian())  # type: ignore[arg-type]
    repair.orphans = {2: {(2, "s"): parse("x > 1")}}
    repair.orphan_side = {2: 1}
    event = {"x": 5, EVENT_ID: ("p", 1)}
    alone = repair.route_orphans([], event)
    assert alone == [Send(4, HandedOver(event, 2))]  # (the router sends it nothing: handed over)
    routed: list[Effect] = [Send(4, cbr.Publish(event)), Send(7, cbr.Publish(event))]
    assert repair.route_orphans(routed, event) == routed  # (it gets the publish: no second message)
    elsewhere: list[Effect] = [Send(7, cbr.Publish(event))]
    assert repair.route_orphans(elsewhere, event) == [*elsewhere, Send(4, HandedOver(event, 2))]
    assert repair.route_orphans([], {"x": 0, EVENT_ID: ("p", 2)}) == []  # (no orphan wants it)
