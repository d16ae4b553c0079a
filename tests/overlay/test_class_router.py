"""Class-aware event routing over the broker multigraph: no secure event on a normal-only
link (checked by the receiving broker on every hop), express faster than normal, secure
events dropped rather than downgraded, re-routing around links found down."""

from __future__ import annotations

import pytest

from flowbus.errors import ProtocolError
from flowbus.experiments.output import document
from flowbus.experiments.ring import RingClasses, run_classes
from flowbus.experiments.ring_sim import LinkLatency
from flowbus.overlay.class_router import Classed, ClassRouter
from flowbus.overlay.multigraph import LinkClass, Multigraph
from flowbus.sim import Simulator

NORMAL, EXPRESS, SECURE = LinkClass.NORMAL, LinkClass.EXPRESS, LinkClass.SECURE


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_violations_and_express_is_faster(seed: int) -> None:
    r = document(run_classes(RingClasses(nodes=40, events=80, link_failures=0.2, seed=seed)))
    assert r["violations"] == 0
    by = {(row["phase"], row["cls"]): row for row in r["rows"]}
    for phase in ("intact", "failed"):
        assert by[(phase, "express")]["latency_mean"] < by[(phase, "normal")]["latency_mean"]
        for cls in ("normal", "express", "secure"):
            row = by[(phase, cls)]
            assert row["violations"] == 0
            assert row["delivered"] + row["undeliverable"] == row["sent"]


def line(classes: list[frozenset[LinkClass]]) -> tuple[Multigraph, list[int]]:
    g = Multigraph(range(len(classes) + 1))
    keys = [g.add_link(i, i + 1, weight=1.0, classes=c, latency=1.0).key for i, c in enumerate(classes)]
    return g, keys


Driven = tuple[Simulator, list[ClassRouter], list[Classed]]


def drive(g: Multigraph, truth: Multigraph | None = None) -> Driven:
    routers = [ClassRouter(b, g) for b in g.brokers]
    got: list[Classed] = []
    sim = Simulator(transport=[LinkLatency(truth or g)], failure_notice=1.0)
    sim.on_deliver = lambda node, sub, event, now: got.append(event)
    for r in routers:
        sim.add_node(r.broker, r)
    return sim, routers, got


def test_a_secure_event_is_dropped_not_downgraded() -> None:
    g, _ = line([frozenset({NORMAL, SECURE}), frozenset({NORMAL}), frozenset({NORMAL, SECURE})])
    sim, routers, got = drive(g)
    for cls in (SECURE, EXPRESS, NORMAL):
        sim.invoke(0, lambda r, c=cls: r.send(3, c.name, c, 0.0))
    sim.run()
    assert sorted(e.payload for e in got) == ["EXPRESS", "NORMAL"]
    assert routers[0].undeliverable == 1
    assert next(e for e in got if e.cls is EXPRESS).fell_back  # no express path: normal route
    assert sum(r.violations for r in routers) == 0


def test_a_message_on_a_link_lacking_its_class_is_counted() -> None:
    g, keys = line([frozenset({NORMAL})])
    r = ClassRouter(1, g)
    r.on_message(0, Classed(0, 1, SECURE, "x", keys[0], 0.0), 1.0)
    assert r.violations == 1
    with pytest.raises(ProtocolError):
        r.on_message(0, "hello", 0.0)
    with pytest.raises(ProtocolError):
        ClassRouter(9, g)


def test_a_link_found_down_is_routed_around() -> None:
    truth = Multigraph(range(4))
    a = truth.add_link(0, 1, weight=1.0, classes=frozenset({NORMAL, SECURE}), latency=1.0)
    for x, y in ((1, 3), (0, 2), (2, 3)):
        truth.add_link(x, y, weight=1.0 if x else 3.0, classes=frozenset({NORMAL, SECURE}), latency=1.0)
    view = truth.copy()
    truth.fail_link(a.key)  # the view does not know yet
    sim, routers, got = drive(view, truth)
    sim.invoke(0, lambda r: r.send(3, "p", SECURE, 0.0))
    sim.run()
    assert [e.payload for e in got] == ["p"] and not view.is_live(a.key)
    assert sum(r.violations for r in routers) == 0


def test_a_link_that_slows_past_an_express_bound_is_routed_around() -> None:
    """Heartbeats measure each link's latency; when the cheap link 1-3 slows from 1 to 5,
    express events bounded by 2 move to 0-2-3, unbounded ones stay."""
    express = frozenset({NORMAL, EXPRESS})
    truth = Multigraph(range(4))
    for x, y, w in ((0, 1, 1.0), (1, 3, 1.0), (0, 2, 2.0), (2, 3, 2.0)):
        truth.add_link(x, y, weight=w, classes=express, latency=1.0)
    slow = truth.links_between(1, 3)[0].key
    view = truth.copy()
    routers = [ClassRouter(b, view, heartbeat=1.0) for b in view.brokers]
    got: list[tuple[float, Classed]] = []
    sim = Simulator(transport=[LinkLatency(truth)])
    sim.on_deliver = lambda node, sub, event, now: got.append((now, event))
    for r in routers:
        sim.add_node(r.broker, r)
        sim.invoke(r.broker, lambda r: r.start())
    for t in range(1, 20):
        sim.invoke(0, lambda r, t=t: r.send(3, ("b", t), EXPRESS, float(t), bound=2.0), at=float(t))
        sim.invoke(0, lambda r, t=t: r.send(3, ("u", t), EXPRESS, float(t)), at=float(t))
    sim.schedule(9.5, lambda: truth.measure(slow, 5.0))
    sim.run(until=25.0)
    last = {e.payload: e.link for _, e in got}
    assert all(last[("b", t)] == slow for t in range(1, 10))  # the cheap path while it is fast
    # (beats unanswered for 5 (t = 10 .. 15) say its latency is 2.5 at least; the echo, 5)
    assert all(last[("b", t)] != slow for t in range(16, 20))  # round it once measured slow
    assert all(last[("u", t)] == slow for t in range(1, 20))  # no bound: the cheap path still
    assert view.link(slow).latency == 5.0 and routers[1].measured + routers[3].measured >= 1
    assert not any(e.fell_back for _, e in got) and sum(r.violations for r in routers) == 0
    with pytest.raises(ProtocolError, match="heartbeat"):
        ClassRouter(0, view, heartbeat=0.0)
