"""Express spaces on ring brokers (routing/express.py): links measured from heartbeat beats,
judged against the bound with hysteresis, announced ring-wide; an express event's hop over
a slow link goes round it and comes back when the link recovers (the simulator's run of the
brokers' own core)."""

from __future__ import annotations

from flowbus.core import Send
from flowbus.experiments.ring_sim import BrokerRing, SlowLinks
from flowbus.filters import parse
from flowbus.overlay.class_router import LinkBeat
from flowbus.routing import cbr
from flowbus.routing.express import Detour, ExpressRoutes, LinkJudge, LinkLatency


def test_a_link_is_judged_against_the_bound_with_hysteresis() -> None:
    judge = LinkJudge(1.0)
    assert judge.measure(7, 0.5) and judge.express[7]
    assert not judge.measure(7, 0.9)  # (still within the bound)
    assert judge.measure(7, 1.2) and not judge.express[7]
    assert not judge.measure(7, 0.8) and not judge.express[7]  # between 0.75 and 1: still slow
    assert judge.measure(7, 0.4) and judge.express[7]
    beats, changed = judge.beats(1, [7], now=10.0)
    assert beats == [Send(7, LinkBeat(1, 10.0))] and not changed
    _, changed = judge.beats(1, [7], now=13.0)  # (the beat of 10 unanswered: 1.5 at least)
    assert changed and not judge.express[7] and judge.latency[7] == 1.5
    assert judge.echo(7, 13.0, 13.2) and judge.express[7]  # (answered: 0.1)
    _, changed = judge.beats(1, [7], now=14.0)  # (nothing unanswered but the beat of 14)
    assert not changed and judge.express[7]
    _, changed = judge.beats(1, [], now=15.0)  # (the link is gone)
    assert changed and judge.express == {}


def test_an_express_event_goes_round_a_slowed_link_and_back_in_the_simulator() -> None:
    slow = SlowLinks()
    ring = BrokerRing(3, seed=3, backup=2, heartbeat=1.0, layers=[slow])
    for b in ring.brokers:
        b.express = ExpressRoutes(b.addr, bound=3.0, is_express=lambda space: space == "fast")
    a, b, c = ring.order()
    ring.sim.invoke(b.addr, lambda x: x.subscribe("s", parse('__space = "fast"')))
    ring.settle(10.0)
    routes = a.express.routes

    def send(n: int) -> None:
        ring.sim.invoke(a.addr, lambda x: x.publish({"__space": "fast", "n": n}))
        ring.settle(10.0)

    send(1)
    assert routes == {(a.addr, b.addr): 1}
    slow.slow[frozenset((a.addr, b.addr))] = 20.0
    ring.settle(30.0)
    assert a.express.judge is not None and a.express.judge.express[b.addr] is False
    send(2)
    assert routes[(a.addr, c.addr, b.addr)] == 1 and c.express.relayed == 1
    del slow.slow[frozenset((a.addr, b.addr))]
    ring.settle(40.0)
    send(3)
    assert routes[(a.addr, b.addr)] == 2 and a.express.detours == 1
    assert sorted(ev["n"] for sub, ev, _ in ring.got if sub == "s") == [1, 2, 3]


def test_the_ring_view_detours_over_express_links_and_falls_back_to_the_direct_link() -> None:
    routes = ExpressRoutes(1, bound=1.0, is_express=lambda space: space == "x")
    assert routes.judge is not None
    routes.judge.measure(2, 5.0)  # (our link to 2: slow)
    routes.judge.measure(3, 0.1)
    event = {"__space": "x", "n": 1}
    for msg in (
        LinkLatency(2, 1, ((1, False, 5.0), (3, True, 0.1))),
        LinkLatency(3, 1, ((1, True, 0.1), (2, True, 0.1))),
        LinkLatency(4, 1, ((1, True, 0.1), (2, True, 0.1))),  # (gone: nobody lists it any more)
    ):
        routes.take(msg.broker, msg, 0.0, [])
    plain = Send(2, cbr.Publish({"__space": "y"}))
    out = routes.route([Send(2, cbr.Publish(event)), plain], "__space")
    assert out == [Send(3, Detour((2,), 1, event)), plain] and routes.detours == 1
    assert set(routes.view().brokers) == {1, 2, 3, 4} and not routes.view().incident(4)
    routes.take(3, LinkLatency(3, 2, ((1, True, 0.1), (2, False, 5.0))), 0.0, [])
    assert routes.route([Send(2, cbr.Publish(event))], "__space") == [Send(2, cbr.Publish(event))]
    assert routes.fallbacks == 1 and routes.routes == {(1, 3, 2): 1, (1, 2): 1}
    assert routes.failed(Detour((2,), 1, event)) == [Send(2, Detour((), 1, event))]
