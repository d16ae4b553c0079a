"""Scribe-based baseline: tree shape, exact delivery, message counts, loss under failures
without repair, heartbeat repair, unsubscribe pruning; driven by the simulator on 64-300
node static Pastry networks."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from flowbus.core import Effect, Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.overlay.pastry import BITS, Route, numerically_closest
from flowbus.overlay.pastry_static import build_static
from flowbus.routing.scribe import (
    TIMER,
    TOPIC,
    Heartbeat,
    JoinTree,
    LeaveTree,
    Multicast,
    Publish,
    ScribeNode,
)
from flowbus.sim import ConstantLatency, Layer, Simulator, UniformLatency

SETTLE = 40.0
"""Time units to let a local call's messages settle (latency 1, notices 0.5)."""


class Count:
    """A transport layer counting sends by message type (a Route by its payload's type)."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()

    def bind(self, host: object) -> Callable[[int, int, Any, float], float | str]:
        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            body = msg.payload if isinstance(msg, Route) else msg
            self.sent[type(body).__name__] += 1
            return 0.0

        return decide


@dataclass
class World:
    sim: Simulator
    nodes: list[ScribeNode]
    ids: list[int]
    count: Count
    got: list[tuple[int, Hashable]] = field(default_factory=list)
    subs: dict[tuple[int, Hashable], Filter] = field(default_factory=dict)

    def call(self, addr: int, fn: Callable[[ScribeNode], list[Effect]]) -> None:
        self.sim.invoke(addr, fn)
        self.sim.run(until=self.sim.now + SETTLE)

    def subscribe(self, addr: int, filt: Filter, sub: Hashable) -> None:
        self.call(addr, lambda n: n.subscribe(filt, sub))
        self.subs[(addr, sub)] = filt

    def unsubscribe(self, addr: int, sub: Hashable) -> None:
        self.call(addr, lambda n: n.unsubscribe(sub))
        del self.subs[(addr, sub)]

    def publish(self, addr: int, event: Mapping[str, Any]) -> Counter[tuple[int, Hashable]]:
        self.got.clear()
        self.count.sent.clear()
        self.call(addr, lambda n: n.publish(event))
        return Counter(self.got)

    def live(self) -> list[int]:
        return [a for a in range(len(self.nodes)) if not self.sim.is_down(a)]

    def root(self) -> int:
        """The live node numerically closest to the topic: the rendezvous."""
        live = {self.ids[a]: a for a in self.live()}
        return live[numerically_closest(sorted(live), TOPIC)]

    def route_len(self, addr: int) -> int:
        """Pastry hops from ``addr`` to the rendezvous."""
        hops = 0
        nxt = self.nodes[addr].next_hop(TOPIC)
        while nxt is not None:
            hops += 1
            nxt = self.nodes[nxt].next_hop(TOPIC)
        return hops

    def below(self, top: int) -> set[int]:
        """``top`` and every node under it in the tree (children pointers)."""
        out, todo = set(), [top]
        while todo:
            a = todo.pop()
            out.add(a)
            todo.extend(self.nodes[a].children)
        return out

    def wanted(self, event: Mapping[str, Any], among: set[int] | None = None) -> set[tuple[int, Hashable]]:
        keep = set(self.live()) if among is None else among
        return {k for k, f in self.subs.items() if k[0] in keep and f.matches(event)}


def make_world(
    n: int,
    seed: int,
    *,
    heartbeat: float | None = None,
    notice: float | None = None,
    latency: Layer | None = None,
) -> World:
    rng = random.Random(seed)
    ids = [rng.getrandbits(BITS) for _ in range(n)]
    nodes = [ScribeNode(p, heartbeat=heartbeat) for p in build_static(ids, rng)]
    count = Count()
    delay = ConstantLatency(1.0) if latency is None else latency
    sim = Simulator(seed=seed, transport=[delay, count], failure_notice=notice)
    world = World(sim, nodes, ids, count)
    sim.on_deliver = lambda node, sub, event, now: world.got.append((node, sub))
    for nd in nodes:
        sim.add_node(nd.address, nd)
    return world


def random_filter(rng: random.Random) -> Filter:
    kind = rng.random()
    if kind < 0.4:
        return parse(f"x > {rng.randrange(0, 100, 10)}")
    if kind < 0.7:
        lo = rng.randrange(0, 80, 10)
        return parse(f"x >= {lo} & x < {lo + rng.randrange(10, 40, 10)}")
    return parse(f'kind = "k{rng.randrange(4)}"')


def random_event(rng: random.Random) -> dict[str, Any]:
    return {"x": rng.randrange(0, 110), "kind": f"k{rng.randrange(5)}"}


def subscribe_many(world: World, rng: random.Random, count: int, start: int = 0) -> None:
    addrs = world.live()
    for i in range(start, start + count):
        world.subscribe(rng.choice(addrs), random_filter(rng), i)


def check_tree(world: World) -> None:
    """Parent and children pointers agree, form one tree rooted at the rendezvous, contain
    every live subscriber, and every member has a reason to be there. (A crashed child stays
    in its parent's list until a send to it fails, which needs failure notices.)"""
    nodes, root = world.nodes, world.root()
    live = set(world.live())
    members = {a for a in live if nodes[a].in_tree}
    assert nodes[root].is_root
    assert [a for a in members if nodes[a].is_root] == [root]
    for a in members:
        assert nodes[a].subs or nodes[a].children
        assert all(nodes[c].parent == a for c in nodes[a].children if c in live)
        seen, at = {a}, a
        while (up := nodes[at].parent) is not None:  # up to the root, without a cycle
            assert up in members and at in nodes[up].children and up not in seen
            seen.add(up)
            at = up
    assert world.below(root) & live == members
    assert {addr for addr, _ in world.subs if not world.sim.is_down(addr)} <= members


def check_exact(world: World, rng: random.Random, events: int, *, among: set[int] | None = None) -> None:
    addrs = world.live()
    for _ in range(events):
        event = random_event(rng)
        got = world.publish(rng.choice(addrs), event)
        assert set(got) == world.wanted(event, among)
        assert all(c == 1 for c in got.values())


def interior(world: World, k: int, rng: random.Random) -> list[int]:
    """k tree nodes with children, not the root."""
    cands = [a for a, nd in enumerate(world.nodes) if nd.in_tree and nd.children and not nd.is_root]
    return rng.sample(cands, k)


# ---------------------------------------------------------------------------------- tests


@pytest.mark.parametrize(("n", "seed"), [(64, 1), (200, 2)])
def test_tree_is_the_union_of_routes_to_the_rendezvous(n: int, seed: int) -> None:
    rng = random.Random(seed)
    world = make_world(n, seed)
    subscribe_many(world, rng, n // 3)
    check_tree(world)
    members = [a for a, nd in enumerate(world.nodes) if nd.in_tree]
    # each member's parent is its Pastry next hop towards the key (a static network)
    assert all(world.nodes[a].parent == world.nodes[a].next_hop(TOPIC) for a in members)
    # a join stops at the first tree node: one JoinTree message per tree edge
    assert world.count.sent["JoinTree"] == len(members) - 1
    distinct = {addr for addr, _ in world.subs}
    assert world.count.sent["JoinTree"] < sum(world.route_len(a) for a in distinct)
    assert world.count.sent["Publish"] == world.count.sent["Multicast"] == 0


@pytest.mark.parametrize(("n", "seed"), [(64, 3), (150, 4), (300, 5)])
def test_exact_delivery_without_failures(n: int, seed: int) -> None:
    rng = random.Random(seed)
    world = make_world(n, seed)
    subscribe_many(world, rng, n // 2)
    check_exact(world, rng, 30)


def test_every_event_goes_to_the_root_then_down_the_whole_tree() -> None:
    rng = random.Random(6)
    world = make_world(120, 6)
    subscribe_many(world, rng, 40)
    edges = sum(len(nd.children) for nd in world.nodes)
    for _ in range(10):
        addr = rng.randrange(120)
        world.publish(addr, random_event(rng))
        assert world.count.sent["Publish"] == world.route_len(addr)
        assert world.count.sent["Multicast"] == edges
    # even an event nobody wants crosses the whole tree: the baseline does not prune
    assert world.publish(0, {"x": -5, "kind": "none"}) == Counter()
    assert world.count.sent["Multicast"] == edges


def test_crashed_interior_nodes_lose_their_subtrees_without_repair() -> None:
    rng = random.Random(7)
    world = make_world(200, 7, notice=0.5)
    subscribe_many(world, rng, 80)
    crashed = interior(world, 2, rng)
    cut = set().union(*(world.below(c) for c in crashed))
    parents = {c: world.nodes[c].parent for c in crashed}
    for c in crashed:
        world.sim.crash(c)
    reached = set(world.live()) - cut
    assert any(k[0] in cut - set(crashed) for k in world.subs)  # some live subscriber is cut off
    check_exact(world, rng, 20, among=reached)
    for c, p in parents.items():  # the failed sends dropped the dead children
        assert p is not None and c not in world.nodes[p].children


def test_heartbeats_repair_the_tree_after_a_crash() -> None:
    rng = random.Random(8)
    world = make_world(150, 8, heartbeat=4.0, notice=0.5)
    subscribe_many(world, rng, 60)
    before = {a: nd.parent for a, nd in enumerate(world.nodes)}
    world.sim.run(until=world.sim.now + 100)  # no failure, no false alarm
    assert {a: nd.parent for a, nd in enumerate(world.nodes)} == before
    crashed = interior(world, 2, rng)
    orphans = {c2 for c in crashed for c2 in world.nodes[c].children} - set(crashed)
    for c in crashed:
        world.sim.crash(c)
    world.sim.run(until=world.sim.now + 10 * 4.0)
    check_tree(world)
    assert all(world.nodes[o].in_tree and world.nodes[o].parent not in crashed for o in orphans)
    check_exact(world, rng, 20)


def test_heartbeats_elect_a_new_root_after_the_root_crashes() -> None:
    rng = random.Random(9)
    world = make_world(100, 9, heartbeat=4.0, notice=0.5)
    subscribe_many(world, rng, 40)
    old = world.root()
    world.sim.crash(old)
    world.sim.run(until=world.sim.now + 10 * 4.0)
    assert world.root() != old
    check_tree(world)
    check_exact(world, rng, 15)


def test_unsubscribe_prunes_branches() -> None:
    rng = random.Random(10)
    world = make_world(150, 10)
    subscribe_many(world, rng, 50)
    root = world.root()
    branch = max(world.nodes[root].children, key=lambda c: len(world.below(c)))
    gone = world.below(branch)
    for addr, sub in [k for k in world.subs if k[0] in gone]:
        world.unsubscribe(addr, sub)
    assert branch not in world.nodes[root].children
    assert not any(world.nodes[a].in_tree or world.nodes[a].children for a in gone)
    check_tree(world)
    edges = sum(len(nd.children) for nd in world.nodes)
    world.publish(3, random_event(rng))
    assert world.count.sent["Multicast"] == edges
    check_exact(world, rng, 10)
    for addr, sub in list(world.subs):
        world.unsubscribe(addr, sub)
    assert not any(nd.in_tree or nd.children for nd in world.nodes)
    assert world.publish(5, {"x": 50, "kind": "k1"}) == Counter()
    assert world.count.sent["Multicast"] == 0


@pytest.mark.parametrize("seed", [1, 13])
def test_concurrent_churn_on_a_reordering_transport_settles(seed: int) -> None:
    """Subscribes and unsubscribes issued before earlier ones settle; messages overtake each
    other, so a leave may arrive after the same child's next join (membership epochs)."""
    rng = random.Random(seed)
    world = make_world(120, seed, latency=UniformLatency(0.5, 3.0))
    sim = world.sim
    for i in range(80):
        addr, filt = rng.randrange(120), random_filter(rng)
        sim.invoke(addr, partial(ScribeNode.subscribe, filt=filt, sub_id=i))
        world.subs[(addr, i)] = filt
        if i % 3 == 2:
            key = rng.choice(sorted(world.subs, key=repr))
            del world.subs[key]
            sim.invoke(key[0], partial(ScribeNode.unsubscribe, sub_id=key[1]))
        sim.run(until=sim.now + rng.random() * 2)
    sim.run()
    check_exact(world, rng, 10)
    check_tree(world)


def test_a_crashed_root_loses_events_without_repair() -> None:
    rng = random.Random(11)
    quiet = make_world(120, 11)  # no failure notice: routes to the dead root vanish
    subscribe_many(quiet, rng, 50)
    quiet.sim.crash(quiet.root())
    for _ in range(10):
        assert quiet.publish(rng.choice(quiet.live()), random_event(rng)) == Counter()
    rng = random.Random(11)
    world = make_world(120, 11, notice=0.5)  # re-routed to the next closest node
    subscribe_many(world, rng, 50)
    world.sim.crash(world.root())
    lost = wanted = 0
    for _ in range(20):
        event = random_event(rng)
        got = world.publish(rng.choice(world.live()), event)
        heir = world.root()
        reach = world.below(heir) if world.nodes[heir].in_tree else set()
        assert set(got) == world.wanted(event, reach)
        assert all(c == 1 for c in got.values())
        lost += len(world.wanted(event)) - len(got)
        wanted += len(world.wanted(event))
    assert lost > 0 and wanted > lost


def test_errors_and_local_calls() -> None:
    world = make_world(64, 12)
    node = world.nodes[0]
    with pytest.raises(ProtocolError, match="unknown message"):
        node.on_message(1, "hello", 0.0)
    with pytest.raises(ProtocolError, match="unknown timer"):
        node.on_timer(TIMER, 0.0)  # heartbeats are off
    with pytest.raises(ProtocolError, match="unexpected route"):
        node.on_message(1, Route(TOPIC ^ 1, JoinTree(1), 1, 1), 0.0)
    with pytest.raises(ProtocolError, match="heartbeat period"):
        ScribeNode(node.pastry, heartbeat=0.0)
    with pytest.raises(ProtocolError, match="topic"):
        ScribeNode(node.pastry, topic=-1)
    assert node.subscribe(parse("x > 1"), "a")  # a join towards the root
    assert node.in_tree and node.subscribe(parse("x > 2"), "b") == []  # already in the tree
    with pytest.raises(ProtocolError, match="exists already"):
        node.subscribe(parse("x > 2"), "a")
    with pytest.raises(ProtocolError, match="no subscription"):
        node.unsubscribe("c")
    assert node.unsubscribe("a") == []  # "b" keeps it in the tree
    # a tree message from a node that is not our parent: it is told to forget us
    stranger = next(a for a in range(1, 64) if a != node.parent)
    out = node.on_message(stranger, Multicast({"x": 9}), 0.0)
    assert len(out) == 1 and isinstance(out[0], Send)
    assert out[0].dst == stranger and isinstance(out[0].msg, LeaveTree)
    assert node.on_message(stranger, Heartbeat(), 0.0) == out
    assert isinstance(Publish({"x": 1}), Publish)
