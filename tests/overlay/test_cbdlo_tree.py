"""CBDLO's attribute topology: virtual nodes split at subscription bounds (at most s + 1 for
one-sided predicates, the document's s + 2), merged back when bounds go, an AVL tree whose
height stays near log2 V under random inserts and deletes, node lists, routing in the tree,
and subscriptions as flowbus filters."""

from __future__ import annotations

import math
import random

import pytest

from flowbus.filters import parse
from flowbus.overlay.cbdlo_tree import AttributeTree, RangeSubscription, Topologies, TopologyError, next_hop


def _pieces(t: AttributeTree) -> list[tuple[float, float]]:
    return [(v.lo, v.hi) for v in t.vnodes()]


def test_bounds_split_the_value_range() -> None:
    t = AttributeTree("price", 0, 100, first_host=1)
    assert _pieces(t) == [(0, 100)]
    t.add(1, 20, 50)
    assert _pieces(t) == [(0, 20), (20, 50), (50, 100)]
    t.add(2, 50, 100)  # 100 is the end of the range, 50 exists already: no new virtual node
    assert _pieces(t) == [(0, 20), (20, 50), (50, 100)]
    t.add(3, 0, 30)
    assert _pieces(t) == [(0, 20), (20, 30), (30, 50), (50, 100)]
    t.check()
    assert [t.node_list(v) for v in t.vnodes()] == [[3], [1, 3], [1], [2]]
    # the new virtual nodes are hosted by the subscriber whose bound made them
    assert {v.lo: v.host for v in t.vnodes()} == {0: 1, 20: 1, 30: 3, 50: 1}


def test_removing_bounds_merges_virtual_nodes_back() -> None:
    t = AttributeTree("a", 0, 100, first_host=1)
    t.add(1, 20, 50)
    t.add(2, 20, 70)
    t.remove(1, 20, 50)
    assert _pieces(t) == [(0, 20), (20, 70), (70, 100)]  # 20 is still 2's bound
    t.remove(2, 20, 70)
    assert _pieces(t) == [(0, 100)] and len(t) == 1 and t.subscriptions == 0
    t.check()
    with pytest.raises(TopologyError, match="no subscription"):
        t.remove(2, 20, 70)


@pytest.mark.parametrize("one_sided", [True, False])
def test_virtual_nodes_at_most_bounds_plus_one(one_sided: bool) -> None:
    rng = random.Random(5)
    t = AttributeTree("a", 0, 1000, first_host=0)
    for s in range(1, 301):
        if one_sided:
            v = rng.uniform(1, 999)
            lo, hi = (0.0, v) if rng.random() < 0.5 else (v, 1000.0)
        else:
            lo = rng.uniform(0, 900)
            hi = lo + rng.uniform(1, 100)
        t.add(s % 37, lo, hi)
        bound = s + 1 if one_sided else 2 * s + 1
        assert len(t) == len(t.bounds) + 1 <= bound
        if one_sided:
            assert len(t) <= s + 2  # the document's max(VN) = subscriptions + 2
    t.check()


def test_tree_stays_balanced_under_random_inserts_and_deletes() -> None:
    rng = random.Random(11)
    t = AttributeTree("a", 0, 1000, first_host=0)
    live: list[tuple[int, float, float]] = []
    worst = 0.0
    for step in range(2500):
        if live and rng.random() < 0.45:
            node, lo, hi = live.pop(rng.randrange(len(live)))
            t.remove(node, lo, hi)
        else:
            lo = round(rng.uniform(0, 950), 1)
            hi = lo + round(rng.uniform(0.5, 50), 1)
            node = rng.randrange(40)
            t.add(node, lo, hi)
            live.append((node, lo, hi))
        v = len(t)
        # AVL: h < 1.4405 log2(V + 2) - 0.3277
        assert t.height() <= 1.4405 * math.log2(v + 2) - 0.3277
        worst = max(worst, t.height() - math.log2(v))
        if step % 250 == 0:
            t.check()
    t.check()
    assert worst <= 3.0  # in practice within a few levels of a perfect tree
    for node, lo, hi in live:
        t.remove(node, lo, hi)
    assert len(t) == 1 and t.height() == 1
    t.check()


def test_node_lists_are_the_subscribers_whose_range_holds_the_piece() -> None:
    rng = random.Random(3)
    t = AttributeTree("a", 0, 100, first_host=0)
    ranges = []
    for node in range(60):
        lo = rng.randrange(0, 90)
        hi = lo + rng.randrange(1, 30)
        t.add(node, lo, hi)
        ranges.append((node, lo, min(hi, 100)))
    for v in t.vnodes():
        want = sorted({n for n, lo, hi in ranges if lo <= v.lo < hi})
        assert t.node_list(v) == want


def test_next_hop_reaches_the_piece_from_any_virtual_node() -> None:
    rng = random.Random(8)
    t = AttributeTree("a", 0, 1000, first_host=0)
    for node in range(200):
        lo = rng.uniform(0, 990)
        t.add(node, lo, lo + rng.uniform(1, 40))
    vnodes = list(t.vnodes())
    for _ in range(300):
        v = rng.choice(vnodes)
        x = rng.uniform(0, 1000)
        hops = 0
        while (n := next_hop(v, x)) is not None:
            v = n
            hops += 1
        assert v.contains(x) and v is t.locate(x)
        assert hops <= 2 * t.height()


def test_subscription_from_and_to_filter_agree_with_the_filter() -> None:
    f = parse("price >= 10 & price < 20.5 & vol > 3 & qty <= 7 & qty >= 1")
    s = RangeSubscription.from_filter("s", 4, f)
    assert s.attrs == ("price", "qty", "vol")
    assert s.range_of("price") == (10.0, 20.5)
    rng = random.Random(2)
    for _ in range(500):
        ev = {"price": rng.choice([9.99, 10, 15, 20.5, 21]), "vol": rng.choice([3, 3.0001, 9]),
              "qty": rng.choice([0, 1, 7, 7.5])}  # fmt: skip
        if rng.random() < 0.1:
            del ev["vol"]
        assert s.matches(ev) == f.matches(ev) == s.to_filter().matches(ev)
    with pytest.raises(TopologyError, match="one conjunction"):
        RangeSubscription.from_filter("s", 0, parse("a > 1 | b > 2"))
    with pytest.raises(TopologyError, match="numeric comparison"):
        RangeSubscription.from_filter("s", 0, parse('sym = "IBM"'))
    with pytest.raises(TopologyError, match="empty range"):
        RangeSubscription("s", 0, (("a", 5.0, 5.0),))


@pytest.mark.parametrize(
    "text",
    ["a > 9007199254740993", "a >= 9007199254740993", "a <= 9007199254740993", "a = 9007199254740993",
     "a < 9007199254740993", "a > 10 ** 400", "a <= -(10 ** 400)", "a > 5", "a = 5", "a > 5.0",
     "a > 2.5", "a <= 1e300", "a > 4611686018427387904.0"],
)  # fmt: skip
def test_bounds_are_exact_numbers_as_the_filters_compare_them(text: str) -> None:
    f = parse(text.replace("10 ** 400", str(10**400)))
    s = RangeSubscription.from_filter("s", 0, f)
    big = 2**53 + 1
    values = [big - 2, big - 1, big, big + 1, big + 2, float(big), float(big) + 2.0, 5, 5.0, 5.5,
              math.nextafter(5.0, 6.0), 6, 2, 3, 2.5, 1e300, math.inf, 10**400, 10**400 + 1, -(10**400),
              2**62, 2**62 + 1, 2.0**62, 2.0**62 + 1024.0]  # fmt: skip
    for v in values:
        assert s.matches({"a": v}) == f.matches({"a": v}), (text, v)
    t = AttributeTree("a", -math.inf, math.inf, first_host=0)
    ((_, lo, hi),) = s.ranges
    t.add(0, lo, hi)
    t.check()
    for v in values:
        if v != math.inf:  # a topology covers [lo, hi): inf is past every one
            assert (t.node_list_at(v) == [0]) == f.matches({"a": v}), (text, v)


def test_topologies_subscribe_unsubscribe_and_depart() -> None:
    topo = Topologies(0, 100)
    topo.subscribe(RangeSubscription("x", 1, (("a", 10, 20), ("b", 0, 50))))
    topo.subscribe(RangeSubscription("y", 2, (("a", 15, 30),)))
    assert sorted(topo.trees) == ["a", "b"]
    assert topo.hosted_attrs(1) == ("a", "b") and topo.hosted_attrs(2) == ("a",)
    with pytest.raises(TopologyError, match="already has"):
        topo.subscribe(RangeSubscription("y", 2, (("a", 15, 30),)))
    with pytest.raises(TopologyError, match="misses"):
        topo.subscribe(RangeSubscription("z", 2, (("a", 150, 300),)))
    gone = topo.depart(1)
    assert [s.sid for s in gone] == ["x"] and "b" not in topo.trees
    tree = topo.trees["a"]
    assert tree.hosts() == [2] and topo.hosted_attrs(1) == ()
    tree.check()
    topo.unsubscribe(2, "y")
    assert topo.trees == {}
    with pytest.raises(TopologyError, match="no subscription"):
        topo.unsubscribe(2, "y")
