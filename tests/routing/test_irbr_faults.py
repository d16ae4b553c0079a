"""IRBR under failures, joins and departures, driven by the simulator with failure notices:
exactly once for every reachable subscriber (a property over random networks, failure
rates and workloads), subscriptions made after failures, dead ranges, a newcomer's filter
table, a node leaving."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from flowbus.experiments.irbr_run import IrbrRun, QuoteWorkload, dead_run, reachable_sets, run
from flowbus.filters import Filter, parse
from flowbus.overlay.pastry import BITS, LEAF_SIZE, PastryNode, shared_prefix_len
from flowbus.overlay.pastry_static import build_static
from flowbus.routing.irbr import IrbrNode, Publish, prefix_of
from flowbus.sim import ConstantLatency, Simulator


@settings(max_examples=25, deadline=None)
@given(
    nodes=st.integers(20, 120),
    failure=st.sampled_from([0.0, 0.05, 0.2, 0.4]),
    subscribers=st.sampled_from([0.2, 0.6, 1.0]),
    covering=st.booleans(),
    seed=st.integers(0, 10_000),
)
# a leaf-set request to a node that died unnoticed, never answered (Pastry's repair requests
# were not acknowledged): one node's leaf set stayed short and a reachable subscriber lost
@example(nodes=118, failure=0.4, subscribers=0.2, covering=False, seed=118)
def test_exactly_once_for_every_reachable_subscriber(
    nodes: int, failure: float, subscribers: float, covering: bool, seed: int
) -> None:
    """Exactly once for every reachable subscriber, as long as fewer than half a leaf set of
    adjacent ids died at once (IRBR's guarantee, routing/irbr.py: past it, a range's live
    nodes may lie beyond every live leaf set: 58 nodes, 40 % failed, seed 165, eight
    adjacent ids dead, the subscriber two places past them lost one event); duplicates and wrong
    deliveries never."""
    config = IrbrRun("irbr", nodes=nodes, failure=failure, seed=seed, events=25, subscribers=subscribers)
    row = run(IrbrRun(**{**config.to_dict(), "covering": covering})).row
    if dead_run(config) < LEAF_SIZE // 2:
        assert row["lost_reachable"] == 0 and row["delivered"] == row["reachable"]
    assert row["duplicates"] == 0 and row["wrong"] == 0
    assert row["failed"] == round(failure * nodes)
    assert row["interested"] >= row["reachable"]


def test_a_subscriber_beyond_a_short_leaf_set_is_reached() -> None:
    """The property's example above, kept whole: nine adjacent ids dead (past half a leaf
    set), and still every reachable subscriber reached. A leaf-set request to a node that
    died unnoticed was never answered, one node's leaf set stayed short, and a reachable
    subscriber lost events (fixed: Pastry's repair requests are acknowledged)."""
    config = IrbrRun("irbr", nodes=118, failure=0.4, seed=118, events=25, subscribers=0.2, covering=False)
    assert dead_run(config) >= LEAF_SIZE // 2
    row = run(config).row
    assert row["lost_reachable"] == 0 and row["delivered"] == row["reachable"] > 0


@dataclass
class World:
    """IRBR nodes on a static Pastry network in a simulator with failure notices."""

    sim: Simulator
    cores: dict[int, IrbrNode]
    got: list[tuple[int, Hashable, Any]] = field(default_factory=list)

    def subscribe(self, addr: int, filt: Filter, sub: Hashable) -> None:
        self.sim.invoke(addr, lambda core: core.subscribe(filt, sub))
        self.sim.run()

    def publish(self, addr: int, event: Mapping[str, Any]) -> Counter[tuple[int, Hashable]]:
        self.got.clear()
        self.sim.invoke(addr, lambda core: core.publish(event))
        self.sim.run()
        return Counter((node, sub) for node, sub, _ in self.got)


def make_world(n: int, seed: int) -> World:
    rng = random.Random(seed)
    ids = [rng.getrandbits(BITS) for _ in range(n)]
    cores = {p.address: IrbrNode(p) for p in build_static(ids, rng)}
    world = World(Simulator(seed=seed, transport=[ConstantLatency(1.0)], failure_notice=2.0), cores)
    world.sim.on_deliver = lambda node, sub, event, now: world.got.append((node, sub, event))
    for addr, core in cores.items():
        world.sim.add_node(addr, core)
    return world


Subs = Mapping[tuple[int, Hashable], Filter]


def expected(subs: Subs, event: Mapping[str, Any], live: set[int]) -> set[Any]:
    return {key for key, f in subs.items() if key[0] in live and f.matches(event)}


def test_subscriptions_made_after_failures_reach_every_live_node() -> None:
    world, rng = make_world(150, 4), random.Random(5)
    work = QuoteWorkload(5, 1.0)
    dead = set(rng.sample(range(150), 30))
    for addr in sorted(dead):
        world.sim.crash(addr)
    live = set(range(150)) - dead
    subs: dict[tuple[int, Hashable], Filter] = {}
    for i, addr in enumerate(rng.sample(sorted(live), 60)):  # sent through dead entries
        subs[(addr, i)] = work.subscription(rng)
        world.subscribe(addr, subs[(addr, i)], i)
    assert any(core.state.vacated for core in world.cores.values())
    for i in range(40):
        event = work.event(rng, i)
        got = world.publish(rng.choice(sorted(live)), event)
        assert set(got) == expected(subs, event, live) and set(got.values()) <= {1}


def test_a_range_whose_nodes_all_died_is_given_up() -> None:
    world = make_world(120, 6)
    pub = world.cores[0]
    col = next(d for d, c in enumerate(pub.state.rows[0]) if c is not None)
    members = [a for a, c in world.cores.items() if prefix_of(pub.node_id, c.node_id) == (1, col)]
    subscriber = members[0]
    world.subscribe(subscriber, parse("x > 1"), "s")
    for addr in members:
        world.sim.crash(addr)
    assert world.publish(0, {"x": 5}) == Counter()
    assert sum(c.empty_ranges for c in world.cores.values()) == 1  # one search, given up once
    live = set(world.cores) - set(members)
    assert subscriber not in reachable_sets(list(world.cores.values()), live)(0)


def test_a_dead_child_is_replaced_by_another_node_of_its_range() -> None:
    world = make_world(200, 7)
    pub = world.cores[3]
    child = pub.state.rows[0][[c is not None for c in pub.state.rows[0]].index(True)]
    assert child is not None
    prefix = prefix_of(pub.node_id, child)
    members = [a for a, c in world.cores.items() if prefix_of(pub.node_id, c.node_id) == prefix]
    assert len(members) >= 3
    child_addr = pub.pastry.book.addr_of[child]
    for i, addr in enumerate(members):
        world.subscribe(addr, parse("x > 1"), i)
    world.sim.crash(child_addr)
    got = world.publish(3, {"x": 5})
    want = {(a, i) for i, a in enumerate(members) if a != child_addr}
    assert set(got) == want and set(got.values()) == {1}
    assert child not in set(pub.state.table_entries())  # Pastry forgot the dead entry
    assert world.sim.metrics.failure_notices >= 1


def test_a_newcomer_fills_its_filter_table_and_takes_part() -> None:
    world, rng = make_world(80, 8), random.Random(9)
    work = QuoteWorkload(4, 1.0)
    subs: dict[tuple[int, Hashable], Filter] = {}
    for i, addr in enumerate(rng.sample(range(80), 40)):
        subs[(addr, i)] = work.subscription(rng)
        world.subscribe(addr, subs[(addr, i)], i)
    new_id = rng.getrandbits(BITS)
    newcomer = IrbrNode(PastryNode(80, new_id, rng=random.Random(10)))
    world.cores[80] = newcomer
    world.sim.add_node(80, newcomer)
    world.sim.invoke(80, lambda core: core.join(17))
    world.sim.run()
    assert newcomer.pastry.ready and len(newcomer.table) > 0
    for entry in newcomer.table:  # filed under the newcomer's own ranges
        assert entry.prefix == prefix_of(new_id, entry.node)
        assert shared_prefix_len(new_id, entry.node) == entry.prefix[0] - 1
    live = set(world.cores)
    for i in range(30):  # the newcomer publishes through its own table
        event = work.event(rng, i)
        got = world.publish(80, event)
        assert set(got) == expected(subs, event, live) and set(got.values()) <= {1}
    subs[(80, "new")] = parse('symbol = "s0"')
    world.subscribe(80, subs[(80, "new")], "new")
    for i in range(30, 50):  # and is reached as a subscriber
        event = work.event(rng, i)
        got = world.publish(rng.randrange(80), event)
        assert set(got) == expected(subs, event, live) and set(got.values()) <= {1}


def test_a_leaving_node_withdraws_its_subscriptions() -> None:
    world, rng = make_world(100, 11), random.Random(12)
    subs = {(a, "s"): parse(f"x > {rng.randrange(50)}") for a in rng.sample(range(100), 30)}
    for (addr, sub), f in subs.items():
        world.subscribe(addr, f, sub)
    leaver = next(iter(subs))[0]
    sent = world.sim.metrics.sent_by_type().get("Unsubscribe", 0)
    world.sim.invoke(leaver, lambda core: core.leave())
    world.sim.run()
    world.sim.crash(leaver)
    assert world.sim.metrics.sent_by_type()["Unsubscribe"] > sent
    assert not world.cores[leaver].rows_from
    assert all(c.table.get(leaver, "s") is None for a, c in world.cores.items() if a != leaver)
    del subs[(leaver, "s")]
    live = set(world.cores) - {leaver}
    for _ in range(20):
        event = {"x": rng.randrange(100)}
        got = world.publish(rng.choice(sorted(live)), event)
        assert set(got) == expected(subs, event, live) and set(got.values()) <= {1}
    assert world.sim.metrics.sent_by_type().get("Publish", 0) > 0
    assert Publish in IrbrNode.app_messages


def test_a_slot_emptied_by_a_failure_still_gets_subscriptions() -> None:
    world = make_world(200, 13)
    s = world.cores[5]
    child = next(c for c in s.state.rows[0] if c is not None)
    prefix = prefix_of(s.node_id, child)
    members = [a for a, c in world.cores.items() if prefix_of(s.node_id, c.node_id) == prefix]
    assert len(members) >= 3
    dead = s.pastry.book.addr_of[child]
    world.sim.crash(dead)
    s.pastry.node_failed(dead)  # known dead, before any repair: the slot is empty
    assert s.state.vacated == {(0, child >> (BITS - 4)): child}
    world.subscribe(5, parse("x > 1"), "s")
    assert all(c.table.get(s.node_id, "s") is not None for a, c in world.cores.items() if a != dead)
