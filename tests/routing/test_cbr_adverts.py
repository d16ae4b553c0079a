"""CBR with advertisements: routers wired by direct message passing (FIFO, or any order);
random advertisements, subscriptions and their removals give exact delivery (vs brute force)
and the from-scratch state; subscriptions only go where an overlapping advertisement came
from; late advertisements pull subscriptions in; removed neighbours' advertisements go;
local publishes need a matching local advertisement; with advertising off nothing changes."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable
from typing import Any

import pytest

from flowbus.core import Deliver, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.filters.covering import overlaps
from flowbus.routing.cbr import Advertise, ContentRouter, Publish, Subscribe, Unadvertise

from .trees import Adj, path, random_tree, split_and_rejoin

Keyed = dict[tuple[int, Hashable], Filter]


# ------------------------------------------------------------------------------- helpers


def random_sub(rng: random.Random) -> Filter:
    a = rng.randrange(100)
    y = rng.choice("abcd")
    return parse(
        rng.choice(
            [
                f"x > {a}",
                f"x < {a}",
                f"x >= {a} & x <= {a + rng.randrange(1, 30)}",
                f'y = "{y}"',
                f'x > {a} & y = "{y}"',
                f'x < {a} | y = "{y}"',
            ]
        )
    )


def random_adv(rng: random.Random) -> Filter:
    a = rng.randrange(80)
    y, z = rng.sample("abcd", 2)
    return parse(
        rng.choice(
            [
                f'y = "{y}"',
                f'y in {{"{y}", "{z}"}}',
                f"x >= {a} & x < {a + rng.randrange(5, 30)}",
                f'y = "{y}" & x > {a}',
            ]
        )
    )


def random_event(rng: random.Random, k: int) -> dict[str, Any]:
    return {"id": k, "x": rng.randrange(0, 110), "y": rng.choice("abcd")}


class Net:
    """Routers passing messages directly: FIFO, or (``rng``) in random order across all links.
    Deliveries recorded as (broker, sub, event id); messages counted by type."""

    def __init__(
        self, adj: Adj, *, advertising: bool = True, covering: bool = True, rng: random.Random | None = None
    ) -> None:
        self.routers = {
            b: ContentRouter(b, adj[b], covering=covering, advertising=advertising) for b in sorted(adj)
        }
        self.pending: list[tuple[int, int, Any]] = []
        self.delivered: Counter[tuple[int, Hashable, int]] = Counter()
        self.sent: Counter[str] = Counter()
        self.rng = rng

    def apply(self, b: int, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.pending.append((b, e.dst, e.msg))
                self.sent[type(e.msg).__name__] += 1
            else:
                assert isinstance(e, Deliver)
                self.delivered[(b, e.sub, e.event["id"])] += 1

    def run(self) -> None:
        while self.pending:
            if self.rng is None:
                src, dst, msg = self.pending.pop(0)
            else:
                i = self.rng.randrange(len(self.pending))
                self.pending[i], self.pending[-1] = self.pending[-1], self.pending[i]
                src, dst, msg = self.pending.pop()
            self.apply(dst, self.routers[dst].on_message(src, msg, 0.0))

    def do(self, b: int, call: str, *args: Any) -> None:
        self.apply(b, getattr(self.routers[b], call)(*args))

    def state(self) -> dict[int, Any]:
        return {b: (r.routing_state(), r.advertisements()) for b, r in self.routers.items()}

    def forwarded(self) -> int:
        return sum(sum(r.forwarded_size().values()) for r in self.routers.values())

    def entries(self) -> int:
        return sum(sum(r.table_size().values()) for r in self.routers.values())


def from_scratch(adj: Adj, advs: Keyed, subs: Keyed, seed: int, *, covering: bool = True) -> Net:
    """The final adverts and subs applied to fresh routers, in another (random) order."""
    net = Net(adj, covering=covering)
    ops = [("advertise", k, f) for k, f in advs.items()] + [("subscribe", k, f) for k, f in subs.items()]
    random.Random(seed).shuffle(ops)
    for call, (b, i), f in ops:
        net.do(b, call, i, f)
    net.run()
    return net


def check_delivery(net: Net, advs: Keyed, subs: Keyed, rng: random.Random, n_events: int) -> int:
    """Publish events covered by some advertisement at (one of) its broker(s): each matching
    subscription gets each exactly once. Returns how many were published."""
    net.delivered.clear()
    published = []
    for k in range(n_events):
        ev = random_event(rng, k)
        at = sorted({b for (b, _), f in advs.items() if f.matches(ev)})
        if not at:
            continue
        net.do(rng.choice(at), "publish", ev)
        published.append(ev)
        net.run()
    expected = Counter((b, s, ev["id"]) for ev in published for (b, s), f in subs.items() if f.matches(ev))
    assert net.delivered == expected
    return len(published)


def check_forwarded_overlap(net: Net) -> None:
    """Every filter forwarded to m overlaps some advertisement that came from m."""
    for r in net.routers.values():
        adv = r.advertisements()
        for m, sent in r.routing_state()[1].items():
            for f in sent.values():
                assert any(overlaps(a, f) for a in adv.get(m, {}).values()), (r.broker, m, str(f))


def random_workload(net: Net, brokers: list[int], rng: random.Random, steps: int) -> tuple[Keyed, Keyed]:
    """Random advertise / subscribe / unadvertise / unsubscribe calls in random order, with
    messages delivered in between now and then."""
    advs: Keyed = {}
    subs: Keyed = {}
    for _ in range(steps):
        r = rng.random()
        if r < 0.15 and advs:
            key = rng.choice(sorted(advs, key=repr))
            del advs[key]
            net.do(key[0], "unadvertise", key[1])
        elif r < 0.3 and subs:
            key = rng.choice(sorted(subs, key=repr))
            del subs[key]
            net.do(key[0], "unsubscribe", key[1])
        elif r < 0.5:
            key = (rng.choice(brokers), rng.randrange(6))
            if key not in advs:
                advs[key] = random_adv(rng)
                net.do(key[0], "advertise", key[1], advs[key])
        else:
            key = (rng.choice(brokers), rng.randrange(40))
            if key not in subs:
                subs[key] = random_sub(rng)
                net.do(key[0], "subscribe", key[1], subs[key])
        if rng.random() < 0.3:
            net.run()
    while len(advs) < 3:  # late advertisements, after most subscriptions
        key = (rng.choice(brokers), rng.randrange(6, 12))
        if key not in advs:
            advs[key] = random_adv(rng)
            net.do(key[0], "advertise", key[1], advs[key])
    net.run()
    return advs, subs


# ------------------------------------------------------------------------ exact delivery


@pytest.mark.parametrize("covering", [True, False])
@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize(("shape", "seed"), [("line", 1), ("line", 2), ("tree", 3), ("tree", 4), ("tree", 5)])
def test_random_adverts_and_subs_deliver_exactly_once(
    shape: str, seed: int, reorder: bool, covering: bool
) -> None:
    rng = random.Random(seed)
    adj = path(rng.randrange(5, 10)) if shape == "line" else random_tree(rng.randrange(15, 35), rng)
    net = Net(adj, covering=covering, rng=random.Random(seed) if reorder else None)
    advs, subs = random_workload(net, sorted(adj), rng, 160)
    # the state does not depend on the order of the calls nor of the messages
    assert net.state() == from_scratch(adj, advs, subs, seed, covering=covering).state()
    check_forwarded_overlap(net)
    assert check_delivery(net, advs, subs, rng, 60) > 10
    # no more than without advertisements (the filters here overlap exactly when they may)
    off = Net(adj, advertising=False, covering=covering)
    for (b, s), f in subs.items():
        off.do(b, "subscribe", s, f)
    off.run()
    assert net.forwarded() <= off.forwarded()


@pytest.mark.parametrize("seed", range(3))
def test_topology_changes_converge_to_from_scratch(seed: int) -> None:
    """Cut a tree edge and join the halves elsewhere (several at once): the adverts and subs
    of the removed links are dropped, those of the added ones sent, and the state is the
    from-scratch one of the new tree."""
    rng = random.Random(300 + seed)
    adj = random_tree(rng.randrange(12, 30), rng)
    net = Net(adj)
    advs, subs = random_workload(net, sorted(adj), rng, 120)
    for _ in range(3):
        for _ in range(rng.randrange(1, 3)):
            (u, v), (a, c) = split_and_rejoin(adj, rng)
            adj[u].discard(v)
            adj[v].discard(u)
            adj[a].add(c)
            adj[c].add(a)
        for b in sorted(adj):
            if adj[b] != net.routers[b].neighbours:
                net.do(b, "set_neighbours", set(adj[b]))
        net.run()
        assert net.state() == from_scratch(adj, advs, subs, seed).state()
        check_delivery(net, advs, subs, rng, 30)


# ------------------------------------------------------------------ fewer subscriptions


def test_subscriptions_stay_out_of_branches_without_overlapping_adverts() -> None:
    """Line 0-..-5, the only publisher at 0 advertises ``x < 50``: the ``x > 60`` subscriptions
    at 5 stay there, the ``x < 20`` one goes to 0; without advertisements all of them travel."""
    counts = {}
    for advertising in (False, True):
        net = Net(path(6), advertising=advertising)
        if advertising:
            net.do(0, "advertise", "p", parse("x < 50"))
        for i in range(10):
            net.do(5, "subscribe", i, parse(f'x > {60 + i} & y = "{"ab"[i % 2]}"'))
        net.do(5, "subscribe", "low", parse("x < 20"))
        net.run()
        counts[advertising] = (net.forwarded(), net.entries(), net.sent["Subscribe"])
        if advertising:
            assert [net.routers[b].table_size() for b in range(5)] == [{0: 0, 1: 1}] + [
                {b: 0, b - 1: 0, b + 1: 1} for b in range(1, 5)
            ]
            net.do(0, "publish", {"id": 1, "x": 10})
            net.run()
            assert net.delivered == Counter({(5, "low", 1): 1})
    assert counts[True][0] < counts[False][0]
    assert counts[True][1] < counts[False][1]
    assert counts[True][2] < counts[False][2]


def test_random_tree_with_disjoint_publishers_forwards_strictly_less() -> None:
    rng = random.Random(9)
    adj = random_tree(25, rng)
    leaves = sorted(b for b in adj if len(adj[b]) == 1)[:4]
    advs = {(b, "p"): parse(f'y = "{y}"') for b, y in zip(leaves, "abcd", strict=False)}
    subs = {(rng.randrange(25), k): random_sub(rng) for k in range(60)}
    sizes = {}
    for advertising in (False, True):
        net = Net(adj, advertising=advertising)
        if advertising:
            for (b, a), f in advs.items():
                net.do(b, "advertise", a, f)
        for (b, s), f in subs.items():
            net.do(b, "subscribe", s, f)
        net.run()
        sizes[advertising] = net.forwarded()
        if advertising:
            check_forwarded_overlap(net)
            check_delivery(net, advs, subs, rng, 50)
    assert sizes[True] < sizes[False]


# ------------------------------------------------------------- late adverts, removals


def test_late_advertisement_pulls_subscriptions_and_unadvertise_withdraws_them() -> None:
    net = Net(path(4))
    net.do(3, "subscribe", "hi", parse("x > 10"))
    net.do(3, "subscribe", "a", parse('y = "a"'))
    net.run()
    assert net.forwarded() == 0 and net.sent["Subscribe"] == 0  # no publisher anywhere yet
    net.do(0, "advertise", "p", parse('x > 0 & y = "b"'))
    net.run()
    # "x > 10" overlaps the advertisement, 'y = "a"' does not
    assert net.routers[0].received_from(1) == {(3, "hi"): parse("x > 10")}
    assert net.forwarded() == 3
    net.do(0, "publish", {"id": 7, "x": 20, "y": "b"})
    net.run()
    assert net.delivered == Counter({(3, "hi", 7): 1})
    net.do(0, "unadvertise", "p")
    net.run()
    assert net.forwarded() == 0 and net.routers[0].received_from(1) == {}
    assert all(r.advertisements() == {} for r in net.routers.values())
    with pytest.raises(ProtocolError, match="no local advertisement"):
        net.routers[0].publish({"id": 8, "x": 20, "y": "b"})


def test_removed_neighbour_drops_its_adverts_and_an_added_one_gets_them() -> None:
    net = Net(path(3))
    net.do(0, "advertise", "p", parse("x > 0"))
    net.do(2, "subscribe", "s", parse("x > 5"))
    net.run()
    r1 = net.routers[1]
    assert r1.advertisements() == {0: {(0, "p"): parse("x > 0")}}
    assert r1.received_from(2) == {(2, "s"): parse("x > 5")}
    net.do(1, "set_neighbours", {2})
    net.do(0, "set_neighbours", set())
    out_types = [type(m).__name__ for s, d, m in net.pending if s == 1]
    assert out_types == ["Unadvertise"]
    net.run()
    assert r1.advertisements() == {} and net.routers[2].advertisements() == {}
    assert r1.received_from(2) == {}  # 2 withdrew "s": nobody publishes beyond 1 any more
    net.do(1, "set_neighbours", {0, 2})
    net.do(0, "set_neighbours", {1})
    net.run()
    assert net.routers[2].advertisements() == {1: {(0, "p"): parse("x > 0")}}
    assert net.routers[0].received_from(1) == {(2, "s"): parse("x > 5")}
    net.do(0, "publish", {"id": 1, "x": 6})
    net.run()
    assert net.delivered == Counter({(2, "s", 1): 1})


def test_handover_keeps_adverts_as_coming_from_the_replacement() -> None:
    """Line 0-1-2, 1 dies and 2 takes its place at 0: what came from 1 now comes from 2."""
    net = Net(path(3))
    net.do(2, "advertise", "p", parse("x > 0"))
    net.do(0, "subscribe", "s", parse("x > 5"))
    net.run()
    r0 = net.routers[0]
    out = r0.set_neighbours({2}, handover={1: 2})
    assert r0.advertisements() == {2: {(2, "p"): parse("x > 0")}}
    assert [(type(e.msg).__name__, e.msg.origin) for e in out if isinstance(e, Send)] == [
        ("Subscribe", (0, "s"))
    ]


# ------------------------------------------------------------------- messages, errors


def test_an_overtaking_unadvertise_leaves_a_tombstone() -> None:
    r = ContentRouter(1, [0, 2], advertising=True)
    assert r.on_message(0, Unadvertise((0, "p"), 2), 0.0) == []
    assert r.on_message(0, Advertise((0, "p"), parse("x > 1"), 1), 0.0) == []
    assert r.advertisements() == {}
    out = r.on_message(0, Advertise((0, "p"), parse("x > 1"), 3), 0.0)
    assert [(e.dst, type(e.msg).__name__) for e in out if isinstance(e, Send)] == [(2, "Advertise")]
    assert r.advertisements() == {0: {(0, "p"): parse("x > 1")}}


def test_a_subscription_from_one_side_is_not_sent_back_for_its_own_advert() -> None:
    r = ContentRouter(1, [0, 2], advertising=True)
    r.on_message(0, Advertise((0, "p"), parse("x > 1"), 1), 0.0)
    out = r.on_message(0, Subscribe((0, "s"), parse("x > 5"), 2), 0.0)
    assert out == []  # 2 advertised nothing; 0 is where it came from
    out = r.on_message(2, Advertise((2, "q"), parse("x < 9"), 1), 0.0)
    assert [(e.dst, type(e.msg).__name__) for e in out if isinstance(e, Send)] == [
        (0, "Advertise"),
        (2, "Subscribe"),
    ]


def test_local_publish_needs_a_matching_local_advertisement() -> None:
    r = ContentRouter(1, [0], advertising=True)
    r.advertise("p", parse("x > 1"))
    r.on_message(0, Subscribe((0, "s"), parse("x > 0"), 1), 0.0)
    r.subscribe("t", parse("x > 0"))
    before = r.routing_state()
    with pytest.raises(ProtocolError, match="no local advertisement"):
        r.route_batch([{"x": 5}, {"x": 0}], 1)  # all or nothing
    assert r.routing_state() == before
    assert len(r.route_batch([{"x": 5}, {"x": 3}], 1)) == 4
    # events from neighbours are routed whatever the adverts here
    assert r.on_message(0, Publish({"x": 0}), 0.0) == []


def test_errors_and_advertising_off() -> None:
    r = ContentRouter(1, [0, 2], advertising=True)
    r.advertise("p", parse("x > 1"))
    with pytest.raises(ProtocolError, match="exists already"):
        r.advertise("p", parse("x > 2"))
    with pytest.raises(ProtocolError, match="no advertisement"):
        r.unadvertise("q")
    with pytest.raises(ProtocolError, match="needs a Filter"):
        r.advertise("q", "x > 1")  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="not a neighbour"):
        r.on_message(7, Advertise((7, "p"), parse("x > 1"), 1), 0.0)
    with pytest.raises(ProtocolError, match="origin"):
        Advertise(("b", 1), parse("x > 1"), 1)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="Filter"):
        Advertise((1, 1), "x > 1", 1)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="origin"):
        Unadvertise((1,), 1)  # type: ignore[arg-type]
    off = ContentRouter(1, [0])
    with pytest.raises(ProtocolError, match="advertising is off"):
        off.advertise("p", parse("x > 1"))
    with pytest.raises(ProtocolError, match="advertising is off"):
        off.unadvertise("p")
    with pytest.raises(ProtocolError, match="advertising is off"):
        off.on_message(0, Advertise((0, "p"), parse("x > 1"), 1), 0.0)
    off.subscribe("s", parse("x > 1"))
    assert off.publish({"x": 5}) == [Deliver("s", {"x": 5})]  # no advertisement needed
