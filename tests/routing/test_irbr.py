"""IRBR: filter tables (with the paper's figure 3), pruned source-based publish, covering,
unsubscribe and re-exposure, Lamport ordering; exact delivery on 50-300 node networks."""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from flowbus.core import Deliver, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.overlay.pastry import BITS, NDIGITS, shared_prefix_len
from flowbus.overlay.pastry_static import build_static
from flowbus.routing.irbr import (
    ROOT,
    AddResult,
    FilterTable,
    IrbrNode,
    Publish,
    Subscribe,
    Unsubscribe,
    child_prefix,
    in_prefix,
    prefix_of,
    prefix_text,
)


def hex_id(head: str) -> int:
    """The id whose leading hex digits are ``head``, then zeros."""
    return int(head.ljust(NDIGITS, "0"), 16)


@dataclass
class Net:
    """A tiny message loop over IRBR nodes (keyed by address)."""

    nodes: dict[int, IrbrNode]
    queue: deque[tuple[int, Any]] = field(default_factory=deque)
    delivered: list[tuple[int, Hashable, Mapping[str, Any]]] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)
    shuffle: random.Random | None = None

    def push(self, src: int, effects: Iterable[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.queue.append((e.dst, e.msg))
            elif isinstance(e, Deliver):
                self.delivered.append((src, e.sub, e.event))

    def run(self) -> None:
        while self.queue:
            if self.shuffle is not None:
                self.queue.rotate(-self.shuffle.randrange(len(self.queue)))
            dst, msg = self.queue.popleft()
            self.sent[type(msg).__name__] += 1
            self.push(dst, self.nodes[dst].on_message(-1, msg, 0.0))

    def subscribe(self, addr: int, filt: Filter, sub: Hashable) -> None:
        self.push(addr, self.nodes[addr].subscribe(filt, sub))
        self.run()

    def unsubscribe(self, addr: int, sub: Hashable) -> None:
        self.push(addr, self.nodes[addr].unsubscribe(sub))
        self.run()

    def publish(self, addr: int, event: Mapping[str, Any]) -> Counter[tuple[int, Hashable]]:
        self.delivered.clear()
        self.push(addr, self.nodes[addr].publish(event))
        self.run()
        return Counter((a, s) for a, s, _ in self.delivered)


def make_net(ids: list[int], seed: int, *, covering: bool = True, shuffle: bool = False) -> Net:
    rng = random.Random(seed)
    pastry = build_static(ids, rng)
    nodes = {p.address: IrbrNode(p, covering=covering) for p in pastry}
    return Net(nodes, shuffle=random.Random(seed + 1) if shuffle else None)


def random_ids(n: int, rng: random.Random) -> list[int]:
    return [rng.getrandbits(BITS) for _ in range(n)]


# ------------------------------------------------------------------------------ prefixes


def test_prefix_helpers() -> None:
    me, other = hex_id("213"), hex_id("201")
    assert prefix_of(me, other) == (2, 0x20)
    assert prefix_text(prefix_of(me, other)) == "20"
    assert prefix_of(me, me) == (NDIGITS, me)
    assert child_prefix(me, 0, 3) == (1, 3)
    assert child_prefix(me, 2, 0) == (3, 0x210)
    assert in_prefix(other, (2, 0x20)) and not in_prefix(me, (2, 0x20))
    assert in_prefix(me, ROOT) and prefix_text(ROOT) == ""


# -------------------------------------------------------------------------- filter table


def test_table_add_covered_duplicate_and_match() -> None:
    t = FilterTable(hex_id("213"))
    a, b = hex_id("210"), hex_id("211")
    assert t.add(a, "s", parse("x > 10"), 1) is AddResult.ADDED
    assert t.add(a, "s", parse("x > 10"), 1) is AddResult.IGNORED  # duplicate
    assert t.add(b, "s", parse("x > 100"), 2) is AddResult.ADDED  # other prefix
    assert [e.node for e in t.roots((3, 0x210))] == [a]
    assert t.add(hex_id("2100"), "u", parse("x > 50"), 3) is AddResult.ADDED  # same prefix "210"
    assert [e.sub for e in t.roots((3, 0x210))] == ["s"]  # covered by x > 10: never tried
    assert t.add(hex_id("2101"), "v", parse("x < 5"), 4) is AddResult.ADDED
    assert [e.sub for e in t.roots((3, 0x210))] == ["s", "v"]
    assert t.matching({"x": 60}, below=0) == {(3, 0x210): a}  # a key inside the range
    assert t.matching({"x": 200}, below=0) == {(3, 0x210): a, (3, 0x211): b}
    assert t.matching({"x": 200}, below=3) == {}  # only ranges longer than 3 digits
    assert t.matching({"x": 1}, below=0) == {(3, 0x210): hex_id("2101")}
    assert t.matching({"x": 7}, below=0) == {}
    assert len(t) == 4


def test_table_remove_reexposes_and_tombstones() -> None:
    t = FilterTable(hex_id("213"))
    a, c = hex_id("210"), hex_id("2101")
    t.add(a, "s", parse("x > 10"), 1)
    t.add(c, "s", parse("x > 50"), 2)
    t.add(c, "t", parse("x > 60"), 3)
    removed, exposed = t.remove(a, "s", 4)
    assert removed is not None and removed.filter == parse("x > 10")
    assert [e.sub for e in exposed] == ["s"]  # x > 60 is still covered by x > 50
    assert [e.filter for e in t.roots((3, 0x210))] == [parse("x > 50")]
    # an unsubscribe overtaking its subscribe leaves a tombstone
    assert t.remove(hex_id("3"), "z", 7) == (None, [])
    assert t.add(hex_id("3"), "z", parse("x > 1"), 6) is AddResult.IGNORED
    assert t.add(hex_id("3"), "z", parse("x > 1"), 8) is AddResult.ADDED  # a later re-subscribe
    # an unsubscribe older than the entry does not remove it
    assert t.remove(c, "t", 2) == (None, [])
    assert t.get(c, "t") is not None


def table_view(net: Net, heads: dict[int, str]) -> dict[str, set[tuple[str, str]]]:
    """Each node's FT as the paper draws it: 3-digit prefixes (the own id shortened)."""
    out = {}
    for addr, node in net.nodes.items():
        out[heads[addr]] = {(prefix_text(e.prefix)[:3], e.filter.to_text()) for e in node.table}
    return out


def test_figure_3_subscribe_cut_short_by_covering() -> None:
    heads = ["011", "201", "210", "211", "212", "213"]
    net = make_net([hex_id(h) for h in heads], seed=3)
    names = dict(enumerate(heads))
    f2, f1 = parse("price > 10"), parse("price > 100")
    assert f2.covers(f1)
    # (a) peer 210 defines f2: it reaches every node, filed under 210's range seen from each
    net.subscribe(2, f2, "f2")
    assert net.sent["Subscribe"] == 5
    t2 = f2.to_text()
    assert table_view(net, names) == {
        "011": {("2", t2)},
        "201": {("21", t2)},
        "210": {("210", t2)},
        "211": {("210", t2)},
        "212": {("210", t2)},
        "213": {("210", t2)},
    }
    # (b) peer 213 subscribes f1 covered by (210, f2): only rows >= 2 (210, 211, 212) hear of it
    net.sent.clear()
    net.subscribe(5, f1, "f1")
    assert net.sent["Subscribe"] == 3
    t1 = f1.to_text()
    view = table_view(net, names)
    assert view["011"] == {("2", t2)} and view["201"] == {("21", t2)}
    for h in ("210", "211", "212", "213"):
        assert view[h] == {("210", t2), ("213", t1)}
    # an event for f1 published at 011 still reaches 213 (and 210) exactly once
    assert net.publish(0, {"price": 500}) == Counter({(2, "f2"): 1, (5, "f1"): 1})
    # 210 unsubscribes: 213 re-exposes f1 to rows 0 and 1 (011 and 201)
    net.sent.clear()
    net.unsubscribe(2, "f2")
    assert net.sent["Unsubscribe"] == 5 and net.sent["Subscribe"] == 2
    view = table_view(net, names)
    assert view["011"] == {("2", t1)} and view["201"] == {("21", t1)}
    assert net.publish(0, {"price": 500}) == Counter({(5, "f1"): 1})


# ------------------------------------------------------------------------------ networks


def random_filter(rng: random.Random) -> Filter:
    kind = rng.random()
    if kind < 0.4:
        return parse(f"x > {rng.randrange(0, 100, 10)}")
    if kind < 0.7:
        lo = rng.randrange(0, 80, 10)
        return parse(f"x >= {lo} & x < {lo + rng.randrange(10, 40, 10)}")
    if kind < 0.9:
        return parse(f'kind = "k{rng.randrange(4)}"')
    return parse(f'kind = "k{rng.randrange(4)}" & x > {rng.randrange(0, 100, 25)}')


def random_event(rng: random.Random) -> dict[str, Any]:
    return {"x": rng.randrange(0, 110), "kind": f"k{rng.randrange(5)}"}


def check_exact(net: Net, subs: dict[tuple[int, Hashable], Filter], rng: random.Random, events: int) -> None:
    addrs = list(net.nodes)
    for _ in range(events):
        event = random_event(rng)
        got = net.publish(rng.choice(addrs), event)
        want = {k for k, f in subs.items() if f.matches(event)}
        assert set(got) == want
        assert all(c == 1 for c in got.values())


@pytest.mark.parametrize(("n", "seed", "shuffle"), [(50, 1, False), (120, 2, True), (300, 3, False)])
def test_exactly_once_then_unsubscribe(n: int, seed: int, shuffle: bool) -> None:
    rng = random.Random(seed)
    net = make_net(random_ids(n, rng), seed, shuffle=shuffle)
    addrs = list(net.nodes)
    subs: dict[tuple[int, Hashable], Filter] = {}
    for i in range(n // 2):
        addr, f = rng.choice(addrs), random_filter(rng)
        net.subscribe(addr, f, i)
        subs[(addr, i)] = f
    check_exact(net, subs, rng, 30)
    for key in rng.sample(sorted(subs, key=repr), len(subs) // 2):
        net.unsubscribe(*key)
        del subs[key]
    check_exact(net, subs, rng, 30)
    for i in range(n // 2, n // 2 + n // 5):  # subscribe again on top of the leftovers
        addr, f = rng.choice(addrs), random_filter(rng)
        net.subscribe(addr, f, i)
        subs[(addr, i)] = f
    check_exact(net, subs, rng, 30)


def test_concurrent_subscribes_and_unsubscribes_settle() -> None:
    """Operations issued before earlier ones have spread, delivered in random order."""
    rng = random.Random(9)
    net = make_net(random_ids(80, rng), 9, shuffle=True)
    addrs = list(net.nodes)
    subs: dict[tuple[int, Hashable], Filter] = {}
    for i in range(60):
        addr, f = rng.choice(addrs), parse(f"x > {rng.randrange(0, 50, 10)}")
        net.push(addr, net.nodes[addr].subscribe(f, i))
        subs[(addr, i)] = f
        if i % 3 == 2:
            key = rng.choice(sorted(subs, key=repr))
            net.push(key[0], net.nodes[key[0]].unsubscribe(key[1]))
            del subs[key]
        for _ in range(rng.randrange(5)):
            if net.queue:
                dst, msg = net.queue.popleft()
                net.push(dst, net.nodes[dst].on_message(-1, msg, 0.0))
    net.run()
    check_exact(net, subs, rng, 40)


def test_publish_prunes_uninterested_subtrees() -> None:
    rng = random.Random(4)
    net = make_net(random_ids(100, rng), 4)
    assert net.publish(0, {"x": 5}) == Counter() and net.sent["Publish"] == 0
    net.subscribe(7, parse("x > 50"), "a")
    net.sent.clear()
    assert net.publish(0, {"x": 5}) == Counter() and net.sent["Publish"] == 0
    got = net.publish(0, {"x": 60})
    assert got == Counter({(7, "a"): 1})
    # one message per tree level at most: the path down to node 7's range
    me, target = net.nodes[0].node_id, net.nodes[7].node_id
    assert 1 <= net.sent["Publish"] <= NDIGITS - shared_prefix_len(me, target)


def subscribe_messages(covering: bool) -> int:
    rng = random.Random(5)
    net = make_net(random_ids(150, rng), 5, covering=covering)
    addrs = list(net.nodes)
    for i in range(100):
        net.subscribe(rng.choice(addrs), parse(f"x > {rng.randrange(0, 100, 10)}"), i)
    return net.sent["Subscribe"]


def test_covering_reduces_subscribe_messages() -> None:
    with_cover, without = subscribe_messages(True), subscribe_messages(False)
    assert without == 100 * 149
    assert with_cover < without / 2


def test_covering_network_still_delivers_exactly() -> None:
    rng = random.Random(6)
    net = make_net(random_ids(150, rng), 6)
    addrs = list(net.nodes)
    subs: dict[tuple[int, Hashable], Filter] = {}
    for i in range(100):
        addr, f = rng.choice(addrs), parse(f"x > {rng.randrange(0, 100, 10)}")
        net.subscribe(addr, f, i)
        subs[(addr, i)] = f
    check_exact(net, subs, rng, 20)
    # remove the broad ones first: their covered subscriptions must be re-exposed
    for key in sorted(subs, key=lambda k: subs[k].to_text())[:50]:
        net.unsubscribe(*key)
        del subs[key]
        check_exact(net, subs, rng, 2)


def test_unsubscribe_overtaking_subscribe_leaves_nothing() -> None:
    rng = random.Random(8)
    net = make_net(random_ids(60, rng), 8)
    node = net.nodes[3]
    subscribes = node.subscribe(parse("x > 1"), "s")
    unsubscribes = node.unsubscribe("s")
    assert subscribes and unsubscribes
    net.push(3, unsubscribes)
    net.run()
    net.push(3, subscribes)
    net.run()
    assert all(len(n.table) == 0 for n in net.nodes.values())
    assert net.publish(10, {"x": 5}) == Counter()
    # a later subscription with the same id is newer than the tombstones
    net.subscribe(3, parse("x > 1"), "s")
    assert net.publish(10, {"x": 5}) == Counter({(3, "s"): 1})


def test_errors() -> None:
    rng = random.Random(2)
    net = make_net(random_ids(20, rng), 2)
    node = net.nodes[0]
    with pytest.raises(ProtocolError, match="unknown message"):
        node.on_message(1, "hello", 0.0)
    node.subscribe(parse("x > 1"), "a")
    with pytest.raises(ProtocolError, match="exists already"):
        node.subscribe(parse("x > 2"), "a")
    with pytest.raises(ProtocolError, match="no subscription"):
        node.unsubscribe("b")
    other = net.nodes[1].node_id
    wrong = (NDIGITS, other)
    for msg in (
        Publish({}, wrong, (other, 1)),
        Subscribe(other, "a", parse("x > 1"), 1, wrong),
        Unsubscribe(other, "a", 2, wrong),
    ):
        with pytest.raises(ProtocolError, match="not in range"):
            node.on_message(1, msg, 0.0)
