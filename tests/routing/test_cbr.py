"""CBR: covering-based subscription forwarding and reverse path event routing on trees of
brokers; exact delivery vs offline evaluation, covering, re-exposure, pruning, topology
changes converging to the from-scratch state, errors."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Any

import pytest

from flowbus.core import Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.routing.cbr import ContentRouter, Publish, Subscribe, Unsubscribe
from flowbus.sim import ConstantLatency, Simulator, UniformLatency

from .trees import Adj, path, random_tree, split_and_rejoin

Subs = dict[tuple[int, Hashable], Filter]


# ------------------------------------------------------------------------------- helpers


def random_filter(rng: random.Random, *, disjunctions: bool = False) -> Filter:
    a = rng.randrange(100)
    y = rng.choice("abc")
    texts = [
        f"x > {a}",
        f"x < {a}",
        f"x >= {a} & x <= {a + rng.randrange(1, 40)}",
        f'y = "{y}"',
        f'x > {a} & y = "{y}"',
    ]
    if disjunctions:
        texts.append(f'x < {a} | y = "{y}"')
    return parse(rng.choice(texts))


def random_event(rng: random.Random, k: int) -> dict[str, Any]:
    return {"id": k, "x": rng.randrange(-5, 110), "y": rng.choice("abcd")}


class Net:
    """Routers on a simulator; deliveries recorded as (broker, sub, event id)."""

    def __init__(self, adj: Adj, *, covering: bool = True, reorder: bool = False, seed: int = 0) -> None:
        layer = UniformLatency(0.1, 5.0) if reorder else ConstantLatency(1.0)
        self.delivered: Counter[tuple[int, Hashable, int]] = Counter()
        self.sim = Simulator(seed=seed, transport=[layer], on_deliver=self._on_deliver)
        self.routers = {b: ContentRouter(b, adj[b], covering=covering) for b in adj}
        for b, r in self.routers.items():
            self.sim.add_node(b, r)

    def _on_deliver(self, node: int, sub: Hashable, event: Any, now: float) -> None:
        self.delivered[(node, sub, event["id"])] += 1

    def subscribe(self, b: int, sub: Hashable, f: Filter) -> None:
        self.sim.invoke(b, lambda r: r.subscribe(sub, f))

    def unsubscribe(self, b: int, sub: Hashable) -> None:
        self.sim.invoke(b, lambda r: r.unsubscribe(sub))

    def set_neighbours(self, b: int, new: set[int]) -> None:
        self.sim.invoke(b, lambda r: r.set_neighbours(set(new)))

    def publish(self, b: int, event: Mapping[str, Any]) -> None:
        self.sim.invoke(b, lambda r: r.publish(event))

    def sent(self, kind: str) -> int:
        return self.sim.metrics.sent_by_type().get(kind, 0)

    def adjacency(self) -> Adj:
        return {b: set(r.neighbours) for b, r in self.routers.items()}

    def state(self) -> dict[int, Any]:
        return {b: r.routing_state() for b, r in self.routers.items()}


def check_delivery(net: Net, subs: Subs, rng: random.Random, n_events: int) -> None:
    """Publish from random brokers; every matching subscription gets each event once."""
    net.delivered.clear()
    events = [random_event(rng, k) for k in range(n_events)]
    for ev in events:
        net.publish(rng.choice(list(net.routers)), ev)
    net.sim.run()
    expected = Counter((b, s, ev["id"]) for ev in events for (b, s), f in subs.items() if f.matches(ev))
    assert net.delivered == expected


def from_scratch(adj: Adj, subs: Subs, *, covering: bool, seed: int) -> dict[int, Any]:
    net = Net(adj, covering=covering, seed=seed)
    items = list(subs.items())
    random.Random(seed).shuffle(items)  # another order: the state must not depend on it
    for (b, s), f in items:
        net.subscribe(b, s, f)
    net.sim.run()
    return net.state()


def random_subs(net: Net, rng: random.Random, count: int, **kw: bool) -> Subs:
    subs: Subs = {}
    brokers = list(net.routers)
    for k in range(count):
        b, f = rng.choice(brokers), random_filter(rng, **kw)
        subs[(b, k)] = f
        net.subscribe(b, k, f)
    return subs


# ------------------------------------------------------------------------ exact delivery


@pytest.mark.parametrize("covering", [True, False])
@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize(("n", "seed"), [(20, 1), (80, 2), (200, 3)])
def test_exactly_once_delivery(n: int, seed: int, covering: bool, reorder: bool) -> None:
    rng = random.Random(seed)
    net = Net(random_tree(n, rng), covering=covering, reorder=reorder, seed=seed)
    subs = random_subs(net, rng, n // 2 + 10, disjunctions=True)
    net.sim.run()
    check_delivery(net, subs, rng, 30)


@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_random_subscribe_unsubscribe_sequences(seed: int, reorder: bool) -> None:
    """Subscribes and unsubscribes (some concurrent, some re-using a sub id) settle to the
    from-scratch state of the survivors, and delivery is exact."""
    rng = random.Random(100 + seed)
    adj = random_tree(rng.randrange(10, 40), rng)
    net = Net(adj, reorder=reorder, seed=seed)
    live: Subs = {}
    for _ in range(120):
        if live and rng.random() < 0.4:
            key = rng.choice(sorted(live, key=repr))
            del live[key]
            net.unsubscribe(*key)
        else:
            b, f = rng.choice(list(adj)), random_filter(rng)
            key = (b, rng.randrange(30))
            if key not in live:
                live[key] = f
                net.subscribe(b, key[1], f)
        if rng.random() < 0.3:
            net.sim.run()
    net.sim.run()
    assert net.state() == from_scratch(adj, live, covering=True, seed=seed)
    check_delivery(net, live, rng, 25)


# ------------------------------------------------------------------------------- covering


def test_covering_reduces_subscription_messages_and_tables() -> None:
    counts, sizes = {}, {}
    for covering in (True, False):
        rng = random.Random(7)
        net = Net(random_tree(60, rng), covering=covering, seed=7)
        subs = random_subs(net, rng, 80)
        net.sim.run()
        counts[covering] = net.sent("Subscribe") + net.sent("Unsubscribe")
        sizes[covering] = sum(sum(r.table_size().values()) for r in net.routers.values())
        check_delivery(net, subs, rng, 20)
    assert counts[True] < counts[False] / 2
    assert sizes[True] < sizes[False] / 2


def test_covered_subscription_is_reexposed_when_its_cover_leaves() -> None:
    """Path 0-1-2-3: f1 (x > 10) at broker 1 covers f2 (x > 20) from broker 0, so broker 1
    only forwards f1 to 2; when f1 goes, f2 is forwarded and still gets events from 3."""
    net = Net(path(4))
    f1, f2 = parse("x > 10"), parse("x > 20")
    net.subscribe(0, "f2", f2)
    net.subscribe(1, "f1", f1)
    net.sim.run()
    r1 = net.routers[1]
    assert r1.routing_state()[1][2] == {(1, "f1"): f1}  # f2 hidden (withdrawn) towards 2
    assert net.routers[3].table_size() == {3: 0, 2: 1}
    net.unsubscribe(1, "f1")
    net.sim.run()
    assert r1.routing_state()[1][2] == {(0, "f2"): f2}
    check_delivery(net, {(0, "f2"): f2}, random.Random(1), 20)
    net.delivered.clear()
    net.publish(3, {"id": 0, "x": 25})
    net.sim.run()
    assert net.delivered == Counter({(0, "f2", 0): 1})


def test_identical_filters_count_as_covering() -> None:
    net = Net(path(3))
    f = parse("x > 10")
    net.subscribe(0, "a", f)
    net.subscribe(1, "b", f)
    net.sim.run()
    # towards 2, broker 1 forwards one of the two (the smaller origin), not both
    assert net.routers[1].routing_state()[1][2] == {(0, "a"): f}
    net.unsubscribe(0, "a")
    net.sim.run()
    assert net.routers[1].routing_state()[1][2] == {(1, "b"): f}
    assert net.routers[2].table_size() == {2: 0, 1: 1}


# ----------------------------------------------------------------------- event pruning


def test_events_only_enter_subtrees_with_matching_subscriptions() -> None:
    net = Net(path(10))
    net.subscribe(3, "s", parse("x > 5"))
    net.sim.run()
    for src, x, hops in [(0, 10, 3), (9, 10, 6), (3, 10, 0), (0, 1, 0), (9, 1, 0)]:
        before = net.sent("Publish")
        net.delivered.clear()
        net.publish(src, {"id": 0, "x": x})
        net.sim.run()
        assert net.sent("Publish") - before == hops
        assert sum(net.delivered.values()) == (1 if x > 5 else 0)


# --------------------------------------------------------------------- topology changes


@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_set_neighbours_converges_to_from_scratch(seed: int, reorder: bool) -> None:
    rng = random.Random(200 + seed)
    adj = random_tree(rng.randrange(15, 60), rng)
    net = Net(adj, reorder=reorder, seed=seed)
    subs = random_subs(net, rng, 40)
    net.sim.run()
    for round_ in range(4):
        # several cuts and re-joins at the same instant (each keeps the graph a tree)
        changes = rng.randrange(1, 3)
        for _ in range(changes):
            (u, v), (a, c) = split_and_rejoin(adj, rng)
            adj[u].discard(v)
            adj[v].discard(u)
            adj[a].add(c)
            adj[c].add(a)
        for b in adj:
            if adj[b] != net.routers[b].neighbours:
                net.set_neighbours(b, adj[b])
        if round_ % 2:  # and some subscription churn at the same time
            key = rng.choice(sorted(subs, key=repr))
            net.unsubscribe(*key)
            del subs[key]
        net.sim.run()
        assert net.adjacency() == adj
        assert net.state() == from_scratch(adj, subs, covering=True, seed=seed)
        check_delivery(net, subs, rng, 15)


def test_messages_from_a_former_neighbour_are_dropped() -> None:
    r = ContentRouter(1, [0, 2])
    r.set_neighbours([2])
    assert r.on_message(0, Subscribe((0, "s"), parse("x > 1"), 1), 0.0) == []
    assert r.on_message(0, Publish({"x": 5}), 0.0) == []
    assert r.dropped == 2 and r.table_size() == {1: 0, 2: 0}


def test_added_neighbour_gets_covering_reduced_filters() -> None:
    r = ContentRouter(1, [0])
    r.subscribe("a", parse("x > 10"))
    r.on_message(0, Subscribe((0, "b"), parse("x > 20"), 1), 0.0)
    r.on_message(0, Subscribe((0, "c"), parse('y = "q"'), 2), 0.0)
    out = r.set_neighbours([0, 2])
    got = {e.msg.origin for e in out if e.dst == 2}  # type: ignore[union-attr]
    assert got == {(1, "a"), (0, "c")}
    out = r.set_neighbours([2])  # 0 leaves: "c" goes, "b" was never sent to 2
    assert [(e.dst, type(e.msg).__name__, e.msg.origin) for e in out] == [(2, "Unsubscribe", (0, "c"))]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- reordering


def test_an_overtaking_unsubscribe_leaves_a_tombstone() -> None:
    r = ContentRouter(1, [0, 2])
    assert r.on_message(0, Unsubscribe((0, "s"), 2), 0.0) == []
    assert r.on_message(0, Subscribe((0, "s"), parse("x > 1"), 1), 0.0) == []
    assert r.table_size()[0] == 0
    out = r.on_message(0, Subscribe((0, "s"), parse("x > 1"), 3), 0.0)
    assert [type(e.msg).__name__ for e in out] == ["Subscribe"]  # type: ignore[union-attr]
    assert r.table_size()[0] == 1


# -------------------------------------------------------------------------------- errors


def test_errors_change_no_state() -> None:
    r = ContentRouter(1, [0, 2])
    r.subscribe("a", parse("x > 1"))
    before = r.routing_state()
    with pytest.raises(ProtocolError, match="exists already"):
        r.subscribe("a", parse("x > 2"))
    with pytest.raises(ProtocolError, match="no subscription"):
        r.unsubscribe("zz")
    with pytest.raises(ProtocolError, match="needs a Filter"):
        r.subscribe("b", "x > 1")  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="unknown message"):
        r.on_message(0, "hello", 0.0)
    with pytest.raises(ProtocolError, match="no timer"):
        r.on_timer("t", 0.0)
    with pytest.raises(ProtocolError, match="not a neighbour"):
        r.on_message(7, Publish({"x": 1}), 0.0)
    with pytest.raises(ProtocolError, match="bad neighbour"):
        r.set_neighbours([0, 1])
    with pytest.raises(ProtocolError, match="bad neighbour"):
        r.set_neighbours([0, "2"])  # type: ignore[list-item]
    assert r.routing_state() == before and r.neighbours == {0, 2}
    with pytest.raises(ProtocolError, match="bad neighbour"):
        ContentRouter(1, [1])
    with pytest.raises(ProtocolError, match="broker id"):
        ContentRouter("1", [])  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="origin"):
        Subscribe(("b", 1), parse("x > 1"), 1)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="Filter"):
        Subscribe((1, 1), "x > 1", 1)  # type: ignore[arg-type]


def test_a_cover_that_leaves_withdraws_itself_after_every_root_it_hid_came() -> None:
    """Path 0-1-2: x > 10 at broker 1 hides two subscriptions from broker 0 (20 < x < 30
    and x > 50) towards 2. When it leaves, broker 1 forwards both; the cover's withdrawal
    rode on the first, so between the two messages broker 2 routed an event for the second
    (x = 60) nowhere: lost, had one been published there then. The withdrawal now comes with
    the last: after each message broker 2 still routes it towards 1."""
    r1 = ContentRouter(1, {0, 2})
    r2 = ContentRouter(2, {1})
    pending = list(r1.on_message(0, Subscribe((0, "a"), parse("x > 20 & x < 30"), 1), 0.0))
    pending += r1.on_message(0, Subscribe((0, "b"), parse("x > 50"), 2), 0.0)
    pending += r1.subscribe("f1", parse("x > 10"))
    for e in pending:
        if isinstance(e, Send) and e.dst == 2:
            r2.on_message(1, e.msg, 0.0)
    assert r2.routing_state()[0][1] == {(1, "f1"): parse("x > 10")}  # (the cover hides them)
    leaving = [e for e in r1.unsubscribe("f1") if isinstance(e, Send) and e.dst == 2]
    assert len(leaving) == 2
    for e in leaving:
        r2.on_message(1, e.msg, 0.0)
        assert [x.dst for x in r2.publish({"x": 60}) if isinstance(x, Send)] == [1]
        assert [x.dst for x in r2.publish({"x": 25}) if isinstance(x, Send)] == [1]


def test_a_neighbour_restarted_on_its_address_keeps_its_side_routed_until_it_synced() -> None:
    """Path 0-1-2: broker 0's subscriptions reach 2 through 1. Broker 0 is restarted on its
    address (a new broker there): 1 renews it. Dropping what came from the old one at once
    withdrew its side up the tree, and 2 routed that side's events nowhere until the new
    one's subscriptions came round. Now 2 still routes them to 1 meanwhile; once the new
    broker synced 1, what it did not send again is withdrawn."""
    r1 = ContentRouter(1, {0, 2})
    r2 = ContentRouter(2, {1})
    ups = r1.on_message(0, Subscribe((0, "a"), parse("x > 50"), 7), 0.0)
    ups += r1.on_message(0, Subscribe((0, "b"), parse("x < 10"), 8), 0.0)
    for e in ups:
        if isinstance(e, Send) and e.dst == 2:
            r2.on_message(1, e.msg, 0.0)
    renewed = r1.renew(0)
    assert not [e for e in renewed if isinstance(e, Send) and e.dst == 2]  # (nothing withdrawn up the tree)
    assert [x.dst for x in r2.publish({"x": 60}) if isinstance(x, Send)] == [1]
    again = r1.on_message(0, Subscribe((0, "a"), parse("x > 50"), 1), 0.0)  # (the new one's seq: afresh)
    assert again == [] and r1.directions((0, "a")) == {0}
    gone = r1.synced(0)
    assert [
        (e.dst, e.msg.origin) for e in gone if isinstance(e, Send) and isinstance(e.msg, Unsubscribe)
    ] == [(2, (0, "b"))]
    assert r1.directions((0, "b")) == frozenset() and r1.directions((0, "a")) == {0}
