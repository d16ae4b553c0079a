"""CRAWL: walks never step onto their trace, a blocked path restarts from a trace node with
max hops halved until it gives up (the document's figure 3), recovery finds the topology,
walks expire at max hops, APT hits enter the topology, a dead neighbour is skipped."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from flowbus.core import Send
from flowbus.errors import ProtocolError
from flowbus.overlay.cbdlo_tree import RangeSubscription, Topologies
from flowbus.routing.cbdlo import CbdloNode
from flowbus.routing.crawl import Enter, Publication, Walk
from flowbus.sim import Simulator


class Log:
    """Observer and transport layer: walk outcomes, and every Walk sent (src, dst, walk)."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, Walk, int]] = []
        self.founds: list[tuple[Walk, int]] = []
        self.walks: list[tuple[int, int, Walk]] = []

    def walk_ended(self, walk: Walk, outcome: str, node: int) -> None:
        self.ended.append((outcome, walk, node))

    def found(self, walk: Walk, tree_hops: int, members: int) -> None:
        self.founds.append((walk, tree_hops))

    def bind(self, host: object) -> Callable[[int, int, Any, float], float | str]:
        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            if isinstance(msg, Walk):
                self.walks.append((src, dst, msg))
            return 1.0

        return decide

    def outcomes(self) -> list[str]:
        return [o for o, _, _ in self.ended]


def network(
    views: Mapping[int, Sequence[int]],
    *,
    hosts: Sequence[int] = (),
    trace: int = 5,
    max_hops: int = 10,
    seed: int = 1,
    notice: float | None = None,
) -> tuple[Simulator, dict[int, CbdloNode], Log]:
    """Nodes with fixed views; the nodes in ``hosts`` subscribe to attribute ``a``."""
    topo = Topologies(0, 100)
    log = Log()
    sim = Simulator(seed=seed, transport=[log], failure_notice=notice)
    rng = random.Random(seed)
    nodes = {}
    for a, view in views.items():
        core = CbdloNode(a, topologies=topo, rng=rng, view_size=max(1, len(view)), shuffle_len=1,
                         trace_len=trace, max_hops=max_hops, observer=log)  # fmt: skip
        core.cyclon.seed(view)
        nodes[a] = core
        sim.add_node(a, core)
    for i, h in enumerate(hosts):
        sub = RangeSubscription(f"s{i}", h, (("a", 0, 100),))
        sim.invoke(h, lambda core, sub=sub: core.subscribe(sub))  # type: ignore[misc]
    sim.run()
    return sim, nodes, log


def publish(sim: Simulator, src: int, values: Mapping[str, float], eid: int = 0) -> None:
    pub = Publication.of(eid, values)
    sim.invoke(src, lambda core: core.publish(pub))
    sim.run()


def test_walks_never_step_onto_their_trace() -> None:
    rng = random.Random(4)
    views = {a: rng.sample([b for b in range(40) if b != a], 3) for a in range(40)}
    sim, _, log = network(views, trace=4, max_hops=25)
    for eid in range(30):
        publish(sim, eid, {"a": 1.0, "b": 2.0}, eid)  # no topology: every walk runs to its end
    assert log.walks and all(o in ("expired",) or o.startswith("gave-up") for o in log.outcomes())
    for src, dst, walk in log.walks:
        assert len(walk.trace) <= 4
        if walk.hops > 0:  # a step (a restart goes *to* a trace node on purpose)
            assert walk.trace[-1] == src and dst not in walk.trace[:-1] and dst != src


def test_blocked_path_restarts_with_halved_hops_until_it_gives_up() -> None:
    # the document's figure 3: A-B-C-D-E-F, F on the edge with a single neighbour
    line = {0: [1], 1: [0, 2], 2: [1, 3], 3: [2, 4], 4: [3, 5], 5: [4]}
    sim, _, log = network(line, trace=5, max_hops=10)
    publish(sim, 0, {"a": 5.0})
    budgets = [w.max_hops for _, _, w in log.walks]
    assert budgets[:5] == [10] * 5  # A -> B -> C -> D -> E -> F: the only way forward
    assert [src for src, _, _ in log.walks[:5]] == [0, 1, 2, 3, 4]
    restarts = [w for _, _, w in log.walks if w.hops == 0]
    assert [w.max_hops for w in restarts] == sorted({w.max_hops for w in restarts}, reverse=True)
    assert {w.max_hops for w in restarts} <= {5, 2, 1}
    ((outcome, walk, _),) = log.ended
    assert walk.restarts == len(restarts) >= 1
    # it ends blocked with nothing left to halve, or out of (halved) hops
    assert (outcome, walk.max_hops) == ("gave-up-blocked", 1) or (outcome == "expired" and walk.max_hops < 10)
    assert walk.walked == len(log.walks)


def test_a_blocked_walk_recovers_through_another_branch() -> None:
    # 0-1-2-3-4 is a dead end; node 1's other neighbour 6 hosts the topology
    views = {0: [1], 1: [0, 2, 6], 2: [1, 3], 3: [2, 4], 4: [3], 6: [1]}
    recovered = direct = 0
    for seed in range(40):
        sim, _, log = network(views, hosts=[6], trace=5, max_hops=10, seed=seed)
        publish(sim, 0, {"a": 50.0})
        ((outcome, walk, node),) = log.ended
        if outcome == "hit":
            assert node == 6
            recovered += walk.restarts > 0
            direct += walk.restarts == 0
        else:  # unlucky restarts can run out of (halved) hops, never loop
            assert outcome == "expired" or outcome.startswith("gave-up")
    assert recovered >= 5 and direct >= 5  # some went down the dead end first and came back


def test_walk_expires_at_max_hops() -> None:
    ring = {a: [(a + 1) % 20, (a - 1) % 20] for a in range(20)}
    sim, _, log = network(ring, trace=2, max_hops=4)
    publish(sim, 0, {"a": 1.0})
    ((outcome, walk, _),) = log.ended
    assert outcome == "expired" and walk.hops == 4 and walk.walked == 4
    assert len(log.walks) == 4


def test_apt_hit_sends_the_walk_to_the_entry_point() -> None:
    sim, nodes, log = network({0: [1], 1: [0], 2: [0]}, hosts=[2])
    nodes[0].apt.learn("a", 2)
    effects = nodes[0].publish(Publication.of(0, {"a": 7.0}))
    assert len(effects) == 1 and isinstance(effects[0], Send) and effects[0].dst == 2
    assert isinstance(effects[0].msg, Enter) and effects[0].msg.walk.hops == 0
    # a node hosting the topology enters it itself
    publish(sim, 2, {"a": 7.0}, eid=1)
    assert log.outcomes() == ["hit"]


def test_a_dead_neighbour_is_dropped_and_the_walk_goes_on() -> None:
    sim, nodes, log = network({0: [1, 2], 1: [0], 2: [0, 3], 3: [2]}, hosts=[3], notice=0.5)
    sim.crash(1)
    for eid in range(6):
        publish(sim, 0, {"a": 1.0}, eid)
    assert log.outcomes() == ["hit"] * 6
    assert nodes[0].neighbours() == [2]


def test_bad_walks_are_refused() -> None:
    pub = Publication.of(0, {"a": 1.0})
    with pytest.raises(ProtocolError):
        Walk(pub, "a", 1.0, (), 5, 4)
    with pytest.raises(ProtocolError, match="twice"):
        Publication(0, (("a", 1.0), ("a", 2.0)))
