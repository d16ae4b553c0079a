"""Content routing over the chordal ring: exact delivery on the ring's tree, and again after
a broker dies, its subscriptions served by the broker that took its state over."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable
from typing import Any

import pytest

from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim import CoordinateLatency, Simulator


class World:
    def __init__(self, n: int, seed: int, backup: int = 2) -> None:
        self.sim = Simulator(seed=seed, transport=[CoordinateLatency(0.5, 2.0)], failure_notice=8.0)
        self.got: list[tuple[int, Hashable, Any]] = []
        self.sim.on_deliver = lambda node, sub, event, now: self.got.append((node, sub, event))
        self.brokers: list[RingBroker] = []
        self.subs: dict[Hashable, Filter] = {}
        rng = random.Random(seed)
        for a in range(n):
            b = RingBroker(a, backup=backup, heartbeat=5.0, probe_timeout=10.0, ping_timeout=10.0)
            self.brokers.append(b)
            self.sim.add_node(a, b)
            if a == 0:
                self.sim.invoke(0, lambda c: c.start())
            else:
                picks = rng.sample(range(a), min(3, a))
                self.sim.invoke(a, lambda c, p=picks: c.join(p))
            self.sim.run(until=self.sim.now + 40)

    def settle(self, span: float = 60.0) -> None:
        self.sim.run(until=self.sim.now + span)

    def subscribe(self, addr: int, sub: Hashable, text: str) -> None:
        self.subs[sub] = parse(text)
        self.sim.invoke(addr, lambda c: c.subscribe(sub, self.subs[sub]))

    def publish(self, addr: int, event: dict[str, Any]) -> Counter[Hashable]:
        self.got.clear()
        self.sim.invoke(addr, lambda c: c.publish(event))
        self.settle(60.0)
        return Counter(sub for _, sub, _ in self.got)


def check(world: World, rng: random.Random, live: list[int], events: int = 30) -> None:
    for _ in range(events):
        event = {"x": rng.randrange(100), "k": f"k{rng.randrange(4)}"}
        got = world.publish(rng.choice(live), event)
        want = {s for s, f in world.subs.items() if f.matches(event)}
        assert set(got) == want and set(got.values()) <= {1}


@pytest.mark.parametrize("seed", [1, 2])
def test_exact_delivery_then_after_a_crash(seed: int) -> None:
    world, rng = World(20, seed), random.Random(seed + 10)
    for i in range(40):
        x = rng.randrange(90)
        world.subscribe(
            rng.randrange(20), ("c", i), rng.choice([f"x > {x}", f'k = "k{i % 4}"', f'x < {x} & k = "k1"'])
        )
    world.settle(100.0)
    check(world, rng, list(range(20)))
    victim = next(b for b in world.brokers if b.subs)
    world.sim.crash(victim.addr)
    world.settle(200.0)
    live = [b.addr for b in world.brokers if b.addr != victim.addr]
    takers = [b for b in world.brokers if victim.ring.me.id in b.ring.taken_over]
    assert len(takers) == 1 and victim.subs <= takers[0].subs
    check(world, rng, live)


def test_errors() -> None:
    b = RingBroker(0)
    b.start()
    b.subscribe("s", parse("x > 1"))
    with pytest.raises(ProtocolError, match="exists already"):
        b.subscribe("s", parse("x > 2"))
    with pytest.raises(ProtocolError, match="no subscription"):
        b.unsubscribe("t")
    assert b.tree_neighbours() == set()


def test_messages_are_read_in_one_place_and_an_unknown_one_is_a_protocol_error() -> None:
    from flowbus.overlay.ring_messages import Ping, Pong

    b = RingBroker(0)
    b.start()
    assert b.on_message(1, Ping(1, 0.5), 1.0)[0].msg == Pong(0, 0.5)  # the ring's: to the ring node
    with pytest.raises(ProtocolError, match=r"RingBroker 0: unknown message 'hello' from 1"):
        b.on_message(1, "hello", 1.0)


def test_events_that_came_together_are_routed_as_they_would_be_one_by_one() -> None:
    """``on_messages`` (what the asyncio runtime calls with the frames of one read) routes a
    run of events from a tree neighbour in one matcher pass, with the same effects as
    taking each message in turn."""
    import copy

    from flowbus.meta import EVENT_ID
    from flowbus.routing import cbr

    world, rng = World(6, 3), random.Random(4)
    for i in range(30):
        world.subscribe(
            rng.randrange(6), ("c", i), rng.choice([f"x > {rng.randrange(90)}", f'k = "k{i % 4}"'])
        )
    world.settle(100.0)
    b = next(b for b in world.brokers if len(b.router.neighbours) == 2)
    src = min(b.router.neighbours)
    events = [{"x": rng.randrange(100), "k": f"k{rng.randrange(4)}", EVENT_ID: ("p", n)} for n in range(12)]
    msgs = [cbr.Publish(e) for e in events]
    one_by_one = copy.deepcopy(b)
    together = b.on_messages(src, msgs, 1.0)
    apart = [e for m in msgs for e in one_by_one.on_message(src, m, 1.0)]
    assert sorted(map(repr, together)) == sorted(map(repr, apart))
    assert any(type(e).__name__ == "Deliver" for e in together)


def test_how_far_a_client_consumed_is_backed_up_taken_over_and_gone_with_its_subscription() -> None:
    """:meth:`RingBroker.consume` keeps in the ring state how far a subscription's client
    consumed each publisher: the version it gives is confirmed by the backups, the broker
    that takes the subscription over knows it, and an unsubscribe deletes it."""
    world = World(6, 3)
    home = world.brokers[2]
    world.subscribe(home.addr, "s", "x > 0")
    world.settle()
    versions: list[int] = []

    def consume(c: RingBroker) -> list[Any]:
        version, effects = c.consume("s", {"alice": 7, "bob": 2})
        versions.append(version)
        return effects

    world.sim.invoke(home.addr, consume)
    world.sim.invoke(home.addr, lambda c: c.consume("s", {"alice": 9})[1])
    world.settle()
    assert home.backups_confirmed() >= versions[0] > 0
    assert home.consumed("s") == {"alice": 9, "bob": 2}
    world.sim.crash(home.addr)
    world.settle(200.0)
    [taker] = [b for b in world.brokers if home.ring.me.id in b.ring.taken_over]
    assert "s" in taker.subs and taker.consumed("s") == {"alice": 9, "bob": 2}
    world.sim.invoke(taker.addr, lambda c: c.unsubscribe("s"))
    world.settle()
    assert taker.consumed("s") == {}
