"""CDM: counting at the subscriber (accept when every attribute matched, count equal as a
match), exact delivery through the attribute trees in a small network, and the churn paths:
an entry point that left (dead: failure notice; alive but no longer hosting) makes the search
start again from the lower layer with halved hops, and the event still arrives."""

from __future__ import annotations

import random
from collections.abc import Hashable
from functools import partial

from flowbus.core import Deliver, Effect, Send, SetTimer
from flowbus.overlay.cbdlo_tree import RangeSubscription, Topologies
from flowbus.routing import cdm
from flowbus.routing.cbdlo import CbdloNode
from flowbus.routing.cbdlo_maint import TreeOp
from flowbus.routing.cdm import Matched, TreeStep
from flowbus.routing.crawl import Publication, Walk
from flowbus.sim import ConstantLatency, Simulator


def _publish(pub: Publication, core: CbdloNode) -> list[Effect]:
    return core.publish(pub)


class Obs:
    def __init__(self) -> None:
        self.ended: list[tuple[str, Walk, int]] = []
        self.founds: list[tuple[Walk, int, int]] = []

    def walk_ended(self, walk: Walk, outcome: str, node: int) -> None:
        self.ended.append((outcome, walk, node))

    def found(self, walk: Walk, tree_hops: int, members: int) -> None:
        self.founds.append((walk, tree_hops, members))


def test_counting_accepts_when_every_attribute_matched() -> None:
    topo = Topologies(0, 100)
    node = CbdloNode(1, topologies=topo, rng=random.Random(1), ttl=50.0)
    node.subscribe(RangeSubscription("s", 1, (("a", 0, 10), ("b", 20, 30), ("c", 0, 100))))
    node.subscribe(RangeSubscription("t", 1, (("a", 5, 6),)))
    pub = Publication.of(7, {"a": 5.5, "b": 25.0, "c": 1.0, "d": 3.0})
    first = node.on_message(2, Matched(pub, "a", 5.5), 0.0)
    assert SetTimer(50.0, ("cdm", 7)) in first and Deliver("t", pub) in first  # t has 1 attribute
    assert not any(isinstance(e, Deliver) and e.sub == "s" for e in first)
    assert node.on_message(3, Matched(pub, "a", 5.5), 0.0) == []  # the same attribute again: no count
    assert node.on_message(3, Matched(pub, "b", 25.0), 0.0) == []  # 2 of 3
    assert node.on_message(4, Matched(pub, "c", 1.0), 0.0) == [Deliver("s", pub)]  # 3 of 3: equal is a match
    assert node.on_message(4, Matched(pub, "c", 1.0), 0.0) == []  # delivered once
    # a value outside the predicate does not count
    other = Publication.of(8, {"a": 5.5, "b": 35.0, "c": 1.0})
    for attr, v in other.values:
        node.on_message(2, Matched(other, attr, v), 0.0)
    assert node.counts.delivered[8] == {"t"}
    node.on_timer(("cdm", 7), 60.0)
    assert 7 not in node.counts.matched and 8 in node.counts.matched


World = tuple[Simulator, list[CbdloNode], Obs, set[tuple[Hashable, int]]]


def _world(n: int = 60, *, seed: int = 3, notice: float | None = None) -> World:
    topo = Topologies(0, 100)
    obs = Obs()
    rng = random.Random(seed)
    got: set[tuple[Hashable, int]] = set()
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)], failure_notice=notice,
                    on_deliver=lambda node, sub, pub, now: got.add((sub, pub.eid)))  # fmt: skip
    nodes = [CbdloNode(a, topologies=topo, rng=rng, view_size=5, apt_size=10, max_hops=12, observer=obs)
             for a in range(n)]  # fmt: skip
    for a, core in enumerate(nodes):
        core.cyclon.seed(rng.sample([b for b in range(n) if b != a], 5))
        sim.add_node(a, core)
    return sim, nodes, obs, got


def _subscribe(sim: Simulator, *subs: RangeSubscription) -> None:
    """Subscribe through the simulator: the predicates travel to the coordinators."""
    for sub in subs:
        sim.invoke(sub.node, partial(CbdloNode.subscribe, sub=sub))
    sim.run()


def _subscribe_randomly(
    sim: Simulator, nodes: list[CbdloNode], rng: random.Random, count: int
) -> list[RangeSubscription]:
    subs = []
    for i in range(count):
        node = nodes[rng.randrange(len(nodes))]
        attrs = rng.sample(["a", "b", "c", "d"], rng.randint(1, 3))
        ranges = []
        for attr in attrs:
            lo = rng.uniform(0, 80)
            ranges.append((attr, lo, lo + rng.uniform(5, 40)))
        sub = RangeSubscription(i, node.addr, tuple(ranges))
        subs.append(sub)
    _subscribe(sim, *subs)
    return subs


def _teach_apts(nodes: list[CbdloNode], rng: random.Random) -> None:
    topo = nodes[0].topologies
    for core in nodes:
        for attr, tree in sorted(topo.trees.items()):
            if rng.random() < 0.5:
                core.apt.learn(attr, rng.choice(tree.hosts()))


def test_every_matching_subscription_gets_each_event_once() -> None:
    sim, nodes, obs, got = _world()
    rng = random.Random(9)
    subs = _subscribe_randomly(sim, nodes, rng, 120)
    _teach_apts(nodes, rng)
    for tree in nodes[0].topologies.trees.values():
        tree.check()
    for eid in range(40):
        values = {a: rng.uniform(0, 100) for a in rng.sample(["a", "b", "c", "d", "e"], 4)}
        pub = Publication.of(eid, values)
        sim.invoke(rng.randrange(len(nodes)), partial(_publish, pub))
        sim.run()
        want = {s.sid for s in subs if s.matches(values)}
        assert {sid for sid, e in got if e == eid} == want
    assert sim.metrics.duplicates == 0
    outcomes = {o for o, _, _ in obs.ended}
    assert "hit" in outcomes and outcomes <= {"hit", "expired"}
    assert all(o == "hit" for o, w, _ in obs.ended if w.attr != "e")  # "e" has no topology
    assert any(h2 > 0 for _, h2, _ in obs.founds) and sim.metrics.sent_by_type().get("TreeStep", 0) > 0


def test_a_dead_entry_point_makes_the_search_start_again_with_halved_hops() -> None:
    sim, nodes, obs, got = _world(notice=0.5)
    topo = nodes[0].topologies
    _subscribe(
        sim, RangeSubscription("gone", 40, (("a", 0, 100),)), RangeSubscription("stays", 41, (("a", 0, 100),))
    )
    assert topo.trees["a"].coordinator == 40 and topo.trees["a"].backup == 41
    for core in nodes[1:]:
        core.apt.learn("a", 41)
    nodes[0].apt.learn("a", 40)  # node 0 still names node 40 as the entry point ...
    sim.crash(40)  # ... which fails: its backup 41 takes the topology over when node 0 says so
    pub = Publication.of(0, {"a": 50.0})
    sim.invoke(0, lambda core: core.publish(pub))
    sim.run()
    assert topo.trees["a"].coordinator == 41 and topo.trees["a"].hosts() == [41]
    assert got == {("stays", 0)}
    assert nodes[0].apt.lookup("a") != 40  # the stale entry was forgotten
    ((outcome, walk, node),) = obs.ended
    assert outcome == "hit" and node == 41 and walk.restarts == 1 and walk.max_hops == 12 // 2


def test_an_entry_point_no_longer_hosting_restarts_the_search() -> None:
    sim, nodes, obs, got = _world()
    _subscribe(sim, RangeSubscription("x", 7, (("a", 0, 50),)), RangeSubscription("y", 8, (("a", 40, 100),)))
    sim.invoke(7, lambda core: core.unsubscribe("x"))  # node 7 no longer hosts a virtual node of "a"
    sim.run()
    assert 7 not in nodes[0].topologies.trees["a"].hosted
    for core in nodes:
        core.apt.learn("a", 8)
    nodes[0].apt.learn("a", 7)  # stale
    pub = Publication.of(0, {"a": 45.0})
    sim.invoke(0, lambda core: core.publish(pub))
    sim.run()
    assert got == {("y", 0)}
    ((outcome, walk, node),) = obs.ended
    assert outcome == "hit" and node == 8 and walk.restarts == 1 and walk.max_hops == 6


def test_a_tree_step_to_a_dead_host_is_routed_again_after_the_repair_then_restarts() -> None:
    sim, nodes, obs, _ = _world()
    _subscribe(sim, RangeSubscription("z", 3, (("a", 10, 20),)), RangeSubscription("y", 4, (("a", 50, 60),)))
    assert 4 in nodes[3].topologies.trees["a"].hosted
    walk = Walk(Publication.of(0, {"a": 55.0}), "a", 55.0, (), 0, 8)
    step = TreeStep(walk, vid=7, tree_hops=2)
    first = nodes[3].on_send_failed(4, step, 0.0)
    assert SetTimer(cdm.RETRY_AFTER, ("cdm", "retry", step, 1)) in first
    # node 3 coordinates "a": it repaired at once (node 4's virtual nodes moved), and routes again
    assert 4 not in nodes[3].topologies.trees["a"].hosted
    assert nodes[3].on_timer(("cdm", "retry", step, 1), 3.0) == []  # node 4's predicate went with it
    assert obs.founds[-1][0] is walk  # the search reached the virtual node holding 55, now node 3's
    # a step that failed after its last try restarts the lower-layer search, hops halved
    for core in nodes:
        core.apt.learn("a", 3)
    effects = nodes[5].on_send_failed(9, TreeStep(walk, 7, 2, cdm.RETRIES), 0.0)
    (last,) = [e for e in effects if isinstance(e, Send) and not isinstance(e.msg, TreeOp)]
    assert last.msg.walk.restarts == 1 and last.msg.walk.max_hops == 4  # type: ignore[attr-defined]


def test_a_tree_step_to_a_virtual_node_that_moved_restarts_the_search() -> None:
    sim, nodes, _, _ = _world()
    _subscribe(sim, RangeSubscription("z", 3, (("a", 10, 20),)))
    for core in nodes:
        core.apt.learn("a", 3)
    walk = Walk(Publication.of(0, {"a": 15.0}), "a", 15.0, (), 0, 8)
    effects = nodes[5].on_message(4, TreeStep(walk, vid=999, tree_hops=1), 0.0)
    assert len(effects) == 1 and effects[0].dst == 3  # type: ignore[union-attr]
    assert effects[0].msg.walk.restarts == 1 and effects[0].msg.walk.max_hops == 4  # type: ignore[union-attr]
