"""CBDLO's lower layer: Cyclon keeps the views a near-random graph under churn (in-degrees
near the view size, no partition, dead links purged), shuffles teach the APT entry points,
and the APT is a bounded LRU table."""

from __future__ import annotations

import random
import statistics
from collections import Counter, deque

import pytest

from flowbus.errors import ProtocolError
from flowbus.overlay.cbdlo_tree import RangeSubscription, Topologies
from flowbus.overlay.cyclon import Apt, Descriptor, Shuffle, ShuffleReply
from flowbus.routing.cbdlo import CbdloNode
from flowbus.sim import ConstantLatency, Simulator

PERIOD = 10.0


def _node(addr: int, topo: Topologies, view: int = 8) -> CbdloNode:
    return CbdloNode(
        addr, topologies=topo, rng=random.Random(addr), view_size=view, shuffle_len=4, period=PERIOD
    )


def _reachable(views: dict[int, list[int]], start: int) -> set[int]:
    seen, todo = {start}, deque([start])
    while todo:
        for b in views[todo.popleft()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_views_stay_random_under_churn() -> None:
    topo = Topologies()
    sim = Simulator(seed=1, transport=[ConstantLatency(0.5)], failure_notice=1.0)
    n, view = 150, 8
    rng = random.Random(7)
    nodes = {a: _node(a, topo, view) for a in range(n)}
    for a, core in nodes.items():
        core.cyclon.seed([(a + 1) % n, rng.randrange(n), rng.randrange(n)])  # a ring plus two random links
        sim.add_node(a, core)
        sim.invoke(a, lambda c: c.start())
    sim.run(until=40 * PERIOD)
    # churn: 20% crash at once, 30 newcomers each knowing one random live node
    dead = set(rng.sample(range(n), n // 5))
    for a in sorted(dead):
        sim.crash(a)
    for a in range(n, n + 30):
        core = nodes[a] = _node(a, topo, view)
        core.cyclon.seed(rng.sample([b for b in range(n) if b not in dead], 2))  # two contacts
        sim.add_node(a, core)
        sim.invoke(a, lambda c: c.start())
    sim.run(until=100 * PERIOD)
    live = {a: c for a, c in nodes.items() if a not in dead}
    views = {a: [b for b in c.neighbours() if b not in dead] for a, c in live.items()}
    dead_links = sum(len(c.neighbours()) - len(views[a]) for a, c in live.items())
    assert dead_links <= 0.02 * view * len(live)  # stale links are purged by oldest-first shuffles
    assert all(len(c.neighbours()) >= view - 2 for c in live.values())
    indeg = Counter(b for vs in views.values() for b in vs)
    degrees = [indeg.get(a, 0) for a in live]
    assert statistics.mean(degrees) >= view - 1
    assert statistics.pstdev(degrees) <= 0.6 * view  # narrow spread, no hubs
    assert max(degrees) <= 3 * view and min(degrees) >= 1
    start = min(live)
    assert _reachable(views, start) == set(live)  # no partition


def test_shuffles_teach_the_apt_entry_points() -> None:
    topo = Topologies()
    topo.subscribe(RangeSubscription("s", 2, (("temp", 0, 10),)))
    a, b = _node(1, topo), _node(2, topo)
    a.cyclon.seed([2])
    b.cyclon.seed([3, 4])
    peer, shuffle = a.cyclon.start_shuffle(a.descriptor()) or (None, None)
    assert peer == 2 and isinstance(shuffle, Shuffle) and shuffle.entries[0].node == 1
    (reply,) = b.on_message(1, shuffle, 0.0)
    assert 1 in b.neighbours()
    a.on_message(2, reply.msg, 0.0)  # type: ignore[union-attr]
    assert set(a.neighbours()) == {3, 4}
    # a learns node 2 hosts "temp" only from a descriptor of node 2
    a.on_message(5, ShuffleReply((Descriptor(2, 0, topo.hosted_attrs(2)),)), 0.0)
    assert a.apt.lookup("temp") == 2
    with pytest.raises(ProtocolError, match="unknown message"):
        a.on_message(2, "hello", 0.0)
    with pytest.raises(ProtocolError, match="unknown timer"):
        a.on_timer("nope", 0.0)


def test_apt_is_a_bounded_lru_table() -> None:
    apt = Apt(3)
    for i, attr in enumerate("abcd"):
        apt.learn(attr, i)
    assert apt.items() == [("b", 1), ("c", 2), ("d", 3)]
    apt.learn("b", 9)  # refreshed: now the most recent
    apt.learn("e", 4)
    assert apt.items() == [("d", 3), ("b", 9), ("e", 4)]
    apt.forget("b", 1)  # not the current entry: kept
    apt.forget("b", 9)
    assert "b" not in apt and len(apt) == 2
    loaded = Apt(2)
    loaded.load([("x", 1), ("y", 2), ("z", 3)])
    learnt = Apt(2, [("x", 1), ("y", 2), ("z", 3)])
    assert loaded.items() == learnt.items() == [("y", 2), ("z", 3)]
    assert Apt(0, [("x", 1)]).lookup("x") is None
