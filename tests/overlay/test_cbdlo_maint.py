"""CBDLO's trees kept by messages (flowbus.routing.cbdlo_maint): after random inserts and
deletes through the simulator, the hosts' records make the same AVL tree as the one-process
reference (Topologies.subscribe / unsubscribe); each operation costs the messages the
protocol says; a failed host is repaired, a failed coordinator's backup takes over, and
later events reach every interested live subscriber."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Hashable
from functools import partial

from flowbus.overlay.cbdlo_tree import AttributeTree, RangeSubscription, Topologies, VRec
from flowbus.routing.cbdlo import CbdloNode
from flowbus.routing.cbdlo_maint import MESSAGES, TreeOp
from flowbus.routing.cdm import Matched
from flowbus.routing.crawl import Publication
from flowbus.sim import ConstantLatency, Simulator

ATTRS = ("a", "b", "c")


def _world(
    n: int, *, notice: float | None = None, seed: int = 5
) -> tuple[Simulator, list[CbdloNode], set[tuple[Hashable, int]]]:
    topo = Topologies(0, 1000)
    rng = random.Random(seed)
    got: set[tuple[Hashable, int]] = set()
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)], failure_notice=notice,
                    on_deliver=lambda node, sub, pub, now: got.add((sub, pub.eid)))  # fmt: skip
    nodes = [CbdloNode(a, topologies=topo, rng=rng, view_size=6, apt_size=10, max_hops=16) for a in range(n)]
    for a, core in enumerate(nodes):
        core.cyclon.seed(rng.sample([b for b in range(n) if b != a], 6))
        sim.add_node(a, core)
    return sim, nodes, got


def _maintenance(sim: Simulator) -> int:
    sent = sim.metrics.sent_by_type()
    return sum(sent.get(k, 0) for k in MESSAGES)


def _random_sub(rng: random.Random, sid: int, node: int) -> RangeSubscription:
    ranges = []
    for attr in rng.sample(ATTRS, rng.randint(1, 2)):
        lo = round(rng.uniform(0, 900), 1)
        ranges.append((attr, lo, lo + round(rng.uniform(1, 120), 1)))
    return RangeSubscription(sid, node, tuple(ranges))


def _assert_hosts_hold_the_tree(
    nodes: list[CbdloNode], tree: AttributeTree, dead: frozenset[int] = frozenset()
) -> None:
    """The union of the live hosts' records is the coordinator's tree, record for record."""
    held: dict[int, VRec] = {}
    for core in nodes:
        if core.addr in dead:
            continue
        for vid, rec in core.replica.recs.get(tree.attr, {}).items():
            assert rec.host == core.addr and vid not in held
            held[vid] = rec
    assert held == tree.records()


def test_hosts_records_agree_with_the_reference_after_random_inserts_and_deletes() -> None:
    sim, nodes, _ = _world(30)
    ref = Topologies(0, 1000)
    rng = random.Random(17)
    live: list[RangeSubscription] = []
    t = 0.0
    for sid in range(400):
        t += 2.0  # one operation at a time: each is applied before the next is sent
        if live and rng.random() < 0.4:
            sub = live.pop(rng.randrange(len(live)))
            ref.unsubscribe(sub.node, sub.sid)
            sim.invoke(sub.node, partial(CbdloNode.unsubscribe, sid=sub.sid), at=t)
        else:
            sub = _random_sub(rng, sid, rng.randrange(len(nodes)))
            live.append(sub)
            ref.subscribe(sub)
            sim.invoke(sub.node, partial(CbdloNode.subscribe, sub=sub), at=t)
        if sid % 50 == 49:
            sim.run()
            _check_against(nodes, ref)
    sim.run()
    _check_against(nodes, ref)
    assert sorted(nodes[0].topologies.trees) == sorted(ref.trees)


def _check_against(nodes: list[CbdloNode], ref: Topologies) -> None:
    topo = nodes[0].topologies
    assert sorted(topo.trees) == sorted(ref.trees)
    for attr, want in ref.trees.items():
        tree = topo.trees[attr]
        tree.check()
        assert tree.height() <= 1.4405 * math.log2(len(tree) + 2)
        # the same partition, hosted by the same nodes, in the same tree shape
        shape = [(v.lo, v.hi, v.host, v.height) for v in tree.vnodes()]
        assert shape == [(v.lo, v.hi, v.host, v.height) for v in want.vnodes()]
        assert [tree.node_list(v) for v in tree.vnodes()] == [want.node_list(v) for v in want.vnodes()]
        _assert_hosts_hold_the_tree(nodes, tree)
        backup = nodes[tree.backup].backups[attr] if tree.backup is not None else None
        if backup is not None:  # the backup's replayed copy is the same tree
            assert [(v.lo, v.hi, v.host) for v in backup.vnodes()] == [
                (v.lo, v.hi, v.host) for v in tree.vnodes()
            ]


def test_each_operation_costs_what_the_protocol_says() -> None:
    sim, nodes, _ = _world(12)
    topo = nodes[0].topologies

    def op(node: int, sub: RangeSubscription | None = None, sid: Hashable = None) -> int:
        before = _maintenance(sim)
        if sub is not None:
            sim.invoke(node, partial(CbdloNode.subscribe, sub=sub))
        else:
            sim.invoke(node, partial(CbdloNode.unsubscribe, sid=sid))
        sim.run()
        return _maintenance(sim) - before

    # the first subscriber creates the topology and hosts its three virtual nodes: no message
    assert op(1, RangeSubscription("s1", 1, (("a", 10, 20),))) == 0
    assert topo.trees["a"].hosts() == [1] and len(topo.trees["a"]) == 3
    # node 2: its predicate to the coordinator, the new virtual node's record to node 2, and
    # the copy to node 2, now the backup (the coordinator's own records change locally)
    assert op(2, RangeSubscription("s2", 2, (("a", 50, 100),))) == 3
    assert topo.trees["a"].backup == 2 and nodes[2].replica.attrs() == ("a",)
    # from now on: 1 (the predicate) + 1 per other host whose records change + 1 (the replay)
    rng = random.Random(4)
    for sid in range(3, 40):
        node = rng.randrange(12)
        lo = round(rng.uniform(0, 900), 1)
        sub = RangeSubscription(sid, node, (("a", lo, lo + 50.0),))
        mirror = _mirror(topo.trees["a"], sub)
        want = (node != 1) + len([h for h in mirror if h != 1]) + 1
        assert op(node, sub) == want
    # an unsubscribe is the same: the merge, the path, the moves
    for core in nodes:
        for sid in list(core.subs)[:1]:
            tree = topo.trees["a"]
            mirror = _mirror(tree, core.subs[sid], remove=True)
            want = (core.addr != 1) + len([h for h in mirror if h != 1]) + 1
            assert op(core.addr, sid=sid) == want


def _mirror(tree: AttributeTree, sub: RangeSubscription, *, remove: bool = False) -> list[int]:
    """The hosts whose records an operation changes, found on a copy of the tree."""
    twin = copy.deepcopy(tree)
    ((_, lo, hi),) = sub.ranges
    if remove:
        twin.remove(sub.node, lo, hi)
        twin.release(sub.node)
    else:
        twin.add(sub.node, lo, hi)
    return twin.changes().hosts()


def test_failed_hosts_are_repaired_and_later_events_reach_every_live_subscriber() -> None:
    sim, nodes, got = _world(40, notice=0.5)
    rng = random.Random(23)
    subs = [_random_sub(rng, sid, rng.randrange(40)) for sid in range(120)]
    for i, sub in enumerate(subs):
        sim.invoke(sub.node, partial(CbdloNode.subscribe, sub=sub), at=2.0 * i)
    sim.run()
    topo = nodes[0].topologies
    for core in nodes:  # every node knows an entry point of every topology
        for attr, tree in sorted(topo.trees.items()):
            core.apt.learn(attr, rng.choice(tree.hosts()))
    coordinator, backup = topo.trees["a"].coordinator, topo.trees["a"].backup
    others = [h for h in topo.trees["b"].hosts() if h not in (coordinator, backup)]
    dead = {coordinator, *rng.sample(others, 3)}  # not both the coordinator and its backup
    for d in dead:
        sim.crash(d)
    live_subs = [s for s in subs if s.node not in dead]
    missed = []
    for eid in range(60):
        values = {a: rng.uniform(0, 1000) for a in ATTRS}
        src = rng.choice([a for a in range(40) if a not in dead])
        sim.invoke(src, partial(CbdloNode.publish, pub=Publication.of(eid, values)))
        sim.run()
        want = {s.sid for s in live_subs if s.matches(values)}
        have = {sid for sid, e in got if e == eid}
        assert have <= want
        if have != want:
            missed.append(eid)
    assert topo.trees["a"].coordinator not in dead  # the backup took over
    for tree in topo.trees.values():
        tree.check()
        assert not set(tree.hosted) & dead and not tree.members() & dead
        _assert_hosts_hold_the_tree(nodes, tree, frozenset(dead))
    # events may miss while the repair runs (a search restarts with halved hops); not after
    assert not missed or max(missed) < 10, missed
    assert sim.metrics.sent_by_type().get("TakeOver", 0) >= 1


def test_the_reporters_of_a_dead_node_cost_one_repair() -> None:
    sim, nodes, _ = _world(8, notice=0.5)
    for i, node in enumerate((1, 2, 3, 4)):
        sub = RangeSubscription(i, node, (("a", 100.0 * node, 100.0 * node + 50),))
        sim.invoke(node, partial(CbdloNode.subscribe, sub=sub), at=2.0 * i)
    sim.run()
    tree = nodes[0].topologies.trees["a"]
    assert tree.coordinator == 1 and tree.backup == 2 and 3 in tree.hosted
    twin = copy.deepcopy(tree)
    twin.drop_node(3)
    touched = [h for h in twin.changes().hosts() if h != 1]
    assert 3 in touched  # the dead host is told to drop (that send fails: nothing more)
    sim.crash(3)
    before = _maintenance(sim)
    probe = Matched(Publication.of(0, {"a": 1.0}), "a", 1.0)
    for reporter in (2, 4, 5):
        sim.invoke(reporter, lambda core: core.on_send_failed(3, probe, sim.now))
    sim.run()
    assert 3 not in tree.hosted and 3 not in tree.members()
    tree.check()
    # three reports; the first repairs (an update to each host that changed, one replay at
    # the backup), the other two find nothing left to do
    assert _maintenance(sim) - before == 3 + len(touched) + 1


def test_a_down_report_for_an_unknown_attribute_is_ignored() -> None:
    _, nodes, _ = _world(8)
    assert nodes[0].on_message(1, TreeOp("zzz", "down", 2), 0.0) == []


def test_the_last_unsubscribe_retires_the_topology_everywhere() -> None:
    sim, nodes, _ = _world(8)
    subs = [
        RangeSubscription(i, node, (("a", 100.0 * i, 100.0 * i + 50),)) for i, node in enumerate((1, 2, 3))
    ]
    for i, sub in enumerate(subs):
        sim.invoke(sub.node, partial(CbdloNode.subscribe, sub=sub), at=2.0 * i)
    sim.run()
    assert nodes[2].backups and nodes[3].replica.attrs() == ("a",)
    for i, sub in enumerate(subs):
        sim.invoke(sub.node, partial(CbdloNode.unsubscribe, sid=sub.sid), at=sim.now + 2.0 * (i + 1))
    sim.run()
    assert "a" not in nodes[0].topologies.trees
    assert all(not core.replica.recs and not core.backups and not core.coordinating for core in nodes)


def test_with_probes_a_dead_backup_is_replaced_and_a_dead_coordinator_taken_over() -> None:
    sim, nodes, _ = _world(8, notice=0.5)
    for core in nodes:
        core.probe = 10.0
    for i, node in enumerate((1, 2, 3, 4)):
        sub = RangeSubscription(i, node, (("a", 100.0 * node, 100.0 * node + 50),))
        sim.invoke(node, partial(CbdloNode.subscribe, sub=sub), at=2.0 * i)
    sim.run(until=20.0)
    topo = nodes[0].topologies
    assert topo.trees["a"].backup == 2
    sim.crash(2)  # the backup dies: the next probe fails and node 3 becomes the backup
    sim.run(until=40.0)
    assert topo.trees["a"].backup == 3 and "a" in nodes[3].backups
    sim.crash(1)  # the coordinator dies with no operation pending: node 3 hears no probe
    sim.run(until=90.0)
    tree = topo.trees["a"]
    assert tree.coordinator == 3 and tree.backup == 4 and not {1, 2} & set(tree.hosted)
    tree.check()
    assert sim.metrics.sent_by_type()["TreePing"] >= 3
