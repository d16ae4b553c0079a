"""Refusals upstream, in the core (``RingBroker.refuse`` and ``Refused``): an event a broker
on the way does not send on (its driver's link rule: a secure space's event before a plain
link) is released hop by hop back to the publisher's broker, which lists the publish as
refused with the reason instead of settled; nothing stays in custody, and what was
delivered before the plain link stays delivered. The same for a local delivery its broker's
driver refuses (``RingBroker.refuse_local``: a queue whose store is full)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any

from flowbus.core import Effect, Outcome, PublishRefused, Send, Settled
from flowbus.filters import parse
from flowbus.meta import EVENT_ID
from flowbus.routing import cbr
from flowbus.routing.link_classes import LinkClasses
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim import CoordinateLatency, Simulator


class PlainTo:
    """A ring broker behind its driver's link rule: the events it would send to ``plain``
    are not sent but given back to it as refused (what ``broker/links.py`` does)."""

    def __init__(self, core: RingBroker) -> None:
        self.core = core
        self.settled: list[Hashable] = []  # (the core's Settled and PublishRefused effects)
        self.refused: list[tuple[Hashable, str]] = []
        self.plain: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)

    def _rule(self, effects: Sequence[Effect]) -> list[Effect]:
        out: list[Effect] = []
        refused: list[tuple[Any, str]] = []
        for e in effects:
            if isinstance(e, Send) and e.dst == self.plain and isinstance(e.msg, cbr.Publish):
                refused.append((e.msg.event[EVENT_ID], f"a plain link to {self.plain}"))
            else:
                out.append(e)
        if refused and self.plain is not None:
            out += self._rule(self.core.refuse(self.plain, refused))
        return out

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        return self._rule(self.core.on_message(src, msg, now))

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return self._rule(self.core.on_timer(key, now))

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        return self._rule(self.core.on_send_failed(dst, msg, now))


def _ring(n: int) -> tuple[Simulator, list[PlainTo], list[tuple[int, Hashable, Any]]]:
    sim = Simulator(seed=5, transport=[CoordinateLatency(0.5, 2.0)], failure_notice=8.0)
    got: list[tuple[int, Hashable, Any]] = []

    def delivered(node: int, sub: Hashable, event: Any, now: float) -> None:
        got.append((node, sub, event[EVENT_ID]))
        sim.invoke(node, lambda c: c.settle(sub, event[EVENT_ID]), at=now + 1.0)

    def reported(node: int, result: Outcome, now: float) -> None:
        b = sim.core(node)
        assert isinstance(b, PlainTo)
        if type(result) is Settled:
            b.settled.extend(result.ids)
        elif type(result) is PublishRefused:
            b.refused.extend(result.items)

    sim.on_deliver = delivered
    sim.on_outcome = reported
    brokers = []
    rng = random.Random(5)
    for a in range(n):
        b = PlainTo(
            RingBroker(a, heartbeat=5.0, probe_timeout=10.0, ping_timeout=10.0, custody=True, local_ack=True)
        )
        brokers.append(b)
        sim.add_node(a, b)  # type: ignore[arg-type]
        picks = rng.sample(range(a), min(3, a))
        sim.invoke(a, (lambda c: c.core.start()) if a == 0 else (lambda c, p=picks: c.core.join(p)))
        sim.run(until=sim.now + 40)
    return sim, sorted(brokers, key=lambda b: b.core.ring.me.id), got


def test_an_event_refused_on_the_way_is_refused_back_to_its_publisher_and_leaves_no_custody() -> None:
    sim, (first, middle, after, last), got = _ring(4)  # the tree: first - middle - after - last
    middle.plain = after.addr
    sim.invoke(last.addr, lambda c: c.core.subscribe("far", parse("x > 1")))
    sim.invoke(middle.addr, lambda c: c.core.subscribe("near", parse("x > 5")))
    sim.run(until=sim.now + 60)
    sim.invoke(first.addr, lambda c: c.core.publish({"x": 9}, event_id=("p", 1)))  # near and far
    sim.invoke(first.addr, lambda c: c.core.publish({"x": 3}, event_id=("p", 2)))  # far only
    sim.run(until=sim.now + 60)
    assert [g[1:] for g in got] == [("near", ("p", 1))]  # delivered before the plain link only
    assert first.settled == [] and sorted(first.refused) == [
        (("p", 1), f"a plain link to {after.addr}"),
        (("p", 2), f"a plain link to {after.addr}"),
    ]
    assert all(b.core.in_custody() == 0 for b in (first, middle, after, last))
    middle.plain = None  # the link is secure again: the next one settles
    sim.invoke(first.addr, lambda c: c.core.publish({"x": 3}, event_id=("p", 3)))
    sim.run(until=sim.now + 60)
    assert first.settled == [("p", 3)] and got[-1][1:] == ("far", ("p", 3))


def test_link_classes_are_flooded_on_the_tree_newest_kept() -> None:
    sim, brokers, _ = _ring(4)
    first = brokers[0]
    sim.invoke(first.addr, lambda c: c.core.announce_links(2, ((brokers[1].addr, True),)))
    sim.run(until=sim.now + 20)
    assert all(b.core.link_book.known[first.addr].version == 2 for b in brokers)
    sim.invoke(
        brokers[-1].addr, lambda c: c.core.on_message(first.addr, LinkClasses(first.addr, 1, ()), sim.now)
    )
    assert brokers[-1].core.link_book.known[first.addr].links == (
        (brokers[1].addr, True),
    )  # (older: kept out)


def test_a_local_delivery_refused_by_its_driver_refuses_the_publish_upstream_and_leaves_no_custody() -> None:
    """``RingBroker.refuse_local``: a subscriber's broker whose queue cannot take a delivery
    (its store full) refuses it; the reason travels back to the publisher's broker."""
    sim, (first, middle, after, last), got = _ring(4)
    full = "broker X cannot queue the event for subscription 'stuck': its store is full (disk)"

    def delivered(node: int, sub: Hashable, event: Any, now: float) -> None:
        eid = event[EVENT_ID]
        got.append((node, sub, eid))
        if sub == "stuck":  # (its driver refuses it instead of settling it)
            sim.invoke(node, lambda c: c.core.refuse_local([(eid, full)]), at=now + 1.0)
        else:
            sim.invoke(node, lambda c: c.settle(sub, eid), at=now + 1.0)

    sim.on_deliver = delivered
    sim.invoke(last.addr, lambda c: c.core.subscribe("stuck", parse("x > 5")))
    sim.invoke(after.addr, lambda c: c.core.subscribe("fine", parse("x > 1")))
    sim.run(until=sim.now + 60)
    sim.invoke(first.addr, lambda c: c.core.publish({"x": 9}, event_id=("p", 1)))  # both
    sim.invoke(first.addr, lambda c: c.core.publish({"x": 3}, event_id=("p", 2)))  # fine only
    sim.run(until=sim.now + 60)
    assert sorted(g[1:] for g in got) == [("fine", ("p", 1)), ("fine", ("p", 2)), ("stuck", ("p", 1))]
    assert first.refused == [(("p", 1), full)] and first.settled == [("p", 2)]
    assert all(b.core.in_custody() == 0 for b in (first, middle, after, last))
    last.core.refuse_local([(("p", 1), full)])  # (given up twice, or for an event not held: nothing)
    assert first.refused == [(("p", 1), full)] and last.core.in_custody() == 0
