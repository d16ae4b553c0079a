"""Broker multigraph: validation, class-aware Dijkstra against brute force, failures, deployments."""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterator

import pytest

from flowbus.errors import FlowbusError
from flowbus.overlay.multigraph import (
    Link,
    LinkClass,
    Multigraph,
    OverlayError,
    Path,
    cost_from_bandwidth,
    default_chords,
    ring_deployment,
)

N, E, S = LinkClass.NORMAL, LinkClass.EXPRESS, LinkClass.SECURE
ALL_CLASSES = (N, E, S)

Label = tuple[float, int, tuple[int, ...], tuple[int, ...]]


# ------------------------------------------------------------------------------- helpers


def random_graph(rng: random.Random, *, integer_weights: bool = True) -> Multigraph:
    """A small random multigraph: parallel links, random classes, some failed links."""
    n = rng.randint(1, 7)
    g = Multigraph(range(n))
    if n < 2:
        return g
    for _ in range(rng.randint(0, 3 * n)):
        a, b = rng.sample(range(n), 2)
        classes = {N} | {c for c in (E, S) if rng.random() < 0.5}
        weight = float(rng.randint(1, 3)) if integer_weights else rng.uniform(0.1, 10.0)
        latency = rng.choice([None, 1.0, 2.5])
        g.add_link(a, b, weight=weight, classes=classes, latency=latency)
    for link in list(g.links()):
        if rng.random() < 0.15:
            g.fail_link(link.key)
    return g


def simple_paths(
    g: Multigraph, src: int, dst: int, cls: LinkClass, avoid: Collection[int]
) -> Iterator[Label]:
    """Every simple path over live links of class ``cls`` avoiding ``avoid``, as a label."""
    if src in avoid or dst in avoid:
        return

    def walk(label: Label) -> Iterator[Label]:
        cost, hops, brokers, keys = label
        u = brokers[-1]
        if u == dst:
            yield label
            return
        for link in g.links(include_failed=False):
            if cls in link.classes and u in (link.a, link.b):
                v = link.other(u)
                if v not in brokers and v not in avoid:
                    yield from walk((cost + link.weight, hops + 1, (*brokers, v), (*keys, link.key)))

    yield from walk((0.0, 0, (src,), ()))


def brute_force(
    g: Multigraph, src: int, dst: int, cls: LinkClass, avoid: Collection[int] = ()
) -> Label | None:
    return min(simple_paths(g, src, dst, cls, avoid), default=None)


def check_path(g: Multigraph, p: Path, cls: LinkClass) -> None:
    """Every hop of ``p`` is a live link of class ``cls`` joining consecutive brokers."""
    assert p.cls is cls
    cost = 0.0
    for i, key in enumerate(p.links):
        link = g.link(key)
        assert g.is_live(key)
        assert cls in link.classes, f"hop {i} uses link {key} without {cls}"
        assert {link.a, link.b} == {p.brokers[i], p.brokers[i + 1]}
        cost += link.weight
    assert len(set(p.brokers)) == len(p.brokers)
    assert p.cost == pytest.approx(cost)


def snapshot(g: Multigraph) -> tuple[object, ...]:
    return (g.version, g.brokers, tuple(g.links()), g.failed)


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"a": 1, "b": 1}, "self-loop"),
        ({"a": 2, "b": 1}, "a < b"),
        ({"a": True, "b": 2}, "int broker ids"),
        ({"weight": 0.0}, "weight"),
        ({"weight": -1.0}, "weight"),
        ({"weight": math.inf}, "weight"),
        ({"weight": math.nan}, "weight"),
        ({"classes": frozenset({S})}, "miss NORMAL"),
        ({"classes": {N}}, "frozenset"),
        ({"latency": -0.5}, "latency"),
        ({"key": -1}, "key"),
    ],
)
def test_link_validation(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"key": 0, "a": 0, "b": 1, "weight": 1.0} | kwargs
    with pytest.raises(OverlayError, match=message):
        Link(**args)  # type: ignore[arg-type]


def test_overlay_error_is_a_flowbus_error() -> None:
    assert issubclass(OverlayError, FlowbusError)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda g: g.add_link(0, 9, weight=1.0), "unknown broker 9"),
        (lambda g: g.add_link(1, 1, weight=1.0), "self-loop"),
        (lambda g: g.add_link(0, 1, weight=0.0), "weight"),
        (lambda g: g.add_link(0, 1, weight=1.0, classes={S, E}), "miss NORMAL"),
        (lambda g: g.add_broker(1), "already exists"),
        (lambda g: g.add_broker("x"), "int"),
        (lambda g: g.remove_broker(7), "unknown broker 7"),
        (lambda g: g.remove_link(42), "unknown link 42"),
        (lambda g: g.fail_link(42), "unknown link 42"),
        (lambda g: g.restore_link(42), "unknown link 42"),
        (lambda g: g.path(0, 9), "unknown broker 9"),
        (lambda g: g.path(9, 0), "unknown broker 9"),
        (lambda g: g.next_hops(9), "unknown broker 9"),
        (lambda g: g.neighbours(9), "unknown broker 9"),
        (lambda g: g.links_between(0, 9), "unknown broker 9"),
        (lambda g: g.path(0, 2, cls=S, fallback=True), "never falls back"),
        (lambda g: g.path(0, 2, cls="secure"), "LinkClass"),
    ],
)
def test_refused_changes_leave_the_graph_unchanged(call: object, message: str) -> None:
    g = Multigraph(range(3))
    g.add_link(0, 1, weight=1.0)
    g.fail_link(g.add_link(1, 2, weight=2.0, classes={N, S}).key)
    before = snapshot(g)
    with pytest.raises(OverlayError, match=message):
        call(g)  # type: ignore[operator]
    assert snapshot(g) == before
    assert g.add_link(0, 2, weight=1.0).key == 2  # no key was consumed by the refusal


def test_cost_from_bandwidth() -> None:
    assert cost_from_bandwidth(4.0) == 0.25
    assert cost_from_bandwidth(100.0, reference=1000.0) == 10.0
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(OverlayError, match="bandwidth"):
            cost_from_bandwidth(bad)


def test_path_validation() -> None:
    with pytest.raises(OverlayError):
        Path((), (), 0.0, None)
    with pytest.raises(OverlayError):
        Path((0, 1), (), 0.0, None)
    with pytest.raises(OverlayError):
        Path((0,), (), -1.0, None)


# ------------------------------------------------------------------------- graph basics


def test_add_link_orders_endpoints_and_neighbours_by_class() -> None:
    g = Multigraph(range(4))
    v0 = g.version
    link = g.add_link(2, 0, weight=1.5, classes=[N, E], latency=3.0)
    assert (link.a, link.b, link.key) == (0, 2, 0)
    g.add_link(0, 1, weight=1.0, classes={N, S})
    g.add_link(0, 3, weight=1.0)
    assert g.version == v0 + 3
    assert g.neighbours(0) == (1, 2, 3)
    assert g.neighbours(0, N) == (1, 2, 3)
    assert g.neighbours(0, E) == (2,)
    assert g.neighbours(0, S) == (1,)
    assert link.other(0) == 2 and link.other(2) == 0
    with pytest.raises(OverlayError):
        link.other(1)


def test_fail_restore_and_remove() -> None:
    g = Multigraph(range(3))
    k01 = g.add_link(0, 1, weight=1.0).key
    k12 = g.add_link(1, 2, weight=1.0).key
    k02 = g.add_link(0, 2, weight=5.0).key
    assert g.path(0, 2) == Path((0, 1, 2), (k01, k12), 2.0, None)
    v = g.version
    assert g.fail_link(k12) is True
    assert g.fail_link(k12) is False  # already failed: no change
    assert g.version == v + 1 and g.failed == {k12} and not g.is_live(k12)
    assert g.neighbours(1) == (0,)
    assert g.links_between(1, 2) == ()
    assert g.links_between(1, 2, include_failed=True) == (g.link(k12),)
    p = g.path(0, 2)
    assert p is not None and p.links == (k02,)
    assert g.restore_link(k12) is True
    assert g.restore_link(k12) is False
    assert g.version == v + 2
    p = g.path(0, 2)
    assert p is not None and p.links == (k01, k12)
    g.remove_broker(1)
    assert g.brokers == (0, 2) and 1 not in g
    assert [link.key for link in g.links()] == [k02]
    p = g.path(0, 2)
    assert p is not None and p.links == (k02,)
    g.remove_link(k02)
    assert g.path(0, 2) is None
    assert g.next_hops(0) == {}


def test_removing_a_broker_forgets_its_failed_links() -> None:
    g = Multigraph(range(3))
    key = g.add_link(0, 1, weight=1.0).key
    g.fail_link(key)
    g.remove_broker(1)
    assert g.failed == frozenset()
    with pytest.raises(OverlayError):
        g.link(key)


def test_copy_is_independent() -> None:
    g = ring_deployment(8, express_fraction=0.5, secure_fraction=0.5, rng=random.Random(1))
    g.fail_link(0)
    h = g.copy()
    assert snapshot(h) == snapshot(g)
    h.remove_broker(3)
    h.restore_link(0)
    h.add_link(0, 4, weight=1.0)
    assert 3 in g and g.failed == {0}
    assert len(list(g.links())) == len(list(h.links())) + len(g.neighbours(3)) - 1
    # Keys stay unique between the two (each continues from the same counter).
    assert g.add_link(0, 4, weight=1.0).key == max(link.key for link in h.links())


# ------------------------------------------------------------------------------ routing


def test_trivial_and_avoided_paths() -> None:
    g = Multigraph(range(3))
    g.add_link(0, 1, weight=1.0, latency=1.0)
    g.add_link(1, 2, weight=1.0, latency=2.0)
    g.add_link(0, 2, weight=5.0, latency=0.5)
    assert g.path(0, 0) == Path((0,), (), 0.0, 0.0, N)
    assert g.path(0, 2) == Path((0, 1, 2), (0, 1), 2.0, 3.0, N)
    assert g.path(0, 2, avoid={1}) == Path((0, 2), (2,), 5.0, 0.5, N)
    assert g.path(0, 2, avoid=[1, 99]) is not None  # unknown brokers in avoid are ignored
    assert g.path(0, 2, avoid={2}) is None
    assert g.path(0, 0, avoid={0}) is None


def test_latency_is_unknown_when_a_hop_has_none() -> None:
    g = Multigraph(range(3))
    g.add_link(0, 1, weight=1.0, latency=1.0)
    g.add_link(1, 2, weight=1.0)
    p = g.path(0, 2)
    assert p is not None and p.latency is None and p.hops == 2 and (p.src, p.dst) == (0, 2)


def test_ties_are_broken_by_hops_then_broker_sequence_then_keys() -> None:
    g = Multigraph(range(5))
    g.add_link(0, 4, weight=2.0)  # key 0: one hop, cost 2
    g.add_link(0, 2, weight=1.0)  # keys 1-4: two-hop paths of cost 2 via 2 and via 1
    g.add_link(2, 4, weight=1.0)
    g.add_link(0, 1, weight=1.0)
    g.add_link(1, 4, weight=1.0)
    p = g.path(0, 4)
    assert p is not None and p.brokers == (0, 4)  # fewer hops wins at equal cost
    g.fail_link(0)
    p = g.path(0, 4)
    assert p is not None and p.brokers == (0, 1, 4)  # smaller broker sequence wins
    g.add_link(1, 4, weight=1.0)  # key 5: parallel to key 4, same weight
    p = g.path(0, 4)
    assert p is not None and p.links == (3, 4)  # smaller key wins


def test_parallel_links_cheapest_usable_per_class() -> None:
    g = Multigraph(range(2))
    cheap = g.add_link(0, 1, weight=1.0)
    secure = g.add_link(0, 1, weight=5.0, classes={N, S})
    secure_cheaper = g.add_link(0, 1, weight=4.0, classes={N, S})
    express = g.add_link(0, 1, weight=3.0, classes={N, E})
    assert len(g.links_between(0, 1)) == 4 and len(g.links_between(1, 0, cls=S)) == 2
    assert g.neighbours(0) == (1,)
    for cls, want in ((N, cheap), (S, secure_cheaper), (E, express)):
        p = g.path(0, 1, cls=cls)
        assert p is not None and p.links == (want.key,) and p.cost == want.weight
        assert g.next_hops(0, cls=cls) == {1: (1, want.key)}
    g.fail_link(secure_cheaper.key)
    p = g.path(1, 0, cls=S)
    assert p is not None and p.links == (secure.key,)


@pytest.mark.parametrize("integer_weights", [True, False])
def test_dijkstra_matches_brute_force(integer_weights: bool) -> None:
    rng = random.Random(2024 + integer_weights)
    checked = 0
    for _ in range(250):
        g = random_graph(rng, integer_weights=integer_weights)
        brokers = g.brokers
        avoid = set(rng.sample(brokers, 1)) if len(brokers) > 3 and rng.random() < 0.3 else set()
        for src in brokers:
            for cls in ALL_CLASSES:
                table = g.next_hops(src, cls=cls, avoid=avoid)
                for dst in brokers:
                    want = brute_force(g, src, dst, cls, avoid)
                    got = g.path(src, dst, cls=cls, avoid=avoid)
                    if want is None:
                        assert got is None and dst not in table
                        continue
                    assert got is not None
                    check_path(g, got, cls)
                    assert not avoid & set(got.brokers)
                    if integer_weights:  # exact sums: the whole tie-breaking label must agree
                        assert (got.cost, got.hops, got.brokers, got.links) == want
                    else:
                        assert got.cost == pytest.approx(want[0])
                    if dst != src:
                        assert table[dst] == (got.brokers[1], got.links[0])
                    checked += 1
    assert checked > 1000


def test_paths_from_and_next_hops_agree_with_path() -> None:
    g = ring_deployment(
        40, express_fraction=0.6, secure_fraction=0.6, rng=random.Random(5), parallel_secure=0.2
    )
    for cls in ALL_CLASSES:
        for src in (0, 7, 39):
            paths = g.paths_from(src, cls=cls)
            table = g.next_hops(src, cls=cls)
            assert set(paths) == set(table) | {src}
            for dst in g.brokers:
                p = g.path(src, dst, cls=cls)
                assert p == paths.get(dst)
                if p is not None and dst != src:
                    assert table[dst] == (p.brokers[1], p.links[0])


def test_hop_by_hop_forwarding_follows_the_source_path() -> None:
    """With exact (integer) weights, following each broker's own table gives the same path."""
    rng = random.Random(11)
    g = ring_deployment(30, express_fraction=0.7, secure_fraction=0.7, rng=rng, weights=(1.0, 1.0))
    for cls in ALL_CLASSES:
        tables = {b: g.next_hops(b, cls=cls) for b in g.brokers}
        for src in g.brokers:
            for dst, _ in tables[src].items():
                p = g.path(src, dst, cls=cls)
                assert p is not None
                here, walked = src, [src]
                while here != dst:
                    here = tables[here][dst][0]
                    walked.append(here)
                assert tuple(walked) == p.brokers


def test_secure_and_express_paths_use_only_their_links_on_every_hop() -> None:
    none_seen = {S: 0, E: 0}
    for seed in range(40):
        rng = random.Random(seed)
        g = ring_deployment(
            rng.randint(5, 24),
            express_fraction=rng.random(),
            secure_fraction=rng.random(),
            rng=rng,
            parallel_secure=rng.random() * 0.3,
        )
        for link in rng.sample(list(g.links()), len(list(g.links())) // 5):
            g.fail_link(link.key)
        for src in g.brokers[::3]:
            for dst in g.brokers:
                for cls in (S, E):
                    p = g.path(src, dst, cls=cls)
                    if p is None:
                        none_seen[cls] += 1
                        assert brute_force_reachable(g, src, dst, cls) is False
                        continue
                    check_path(g, p, cls)
    assert none_seen[S] > 0 and none_seen[E] > 0


def brute_force_reachable(g: Multigraph, src: int, dst: int, cls: LinkClass) -> bool:
    seen, todo = {src}, [src]
    while todo:
        u = todo.pop()
        for v in g.neighbours(u, cls):
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return dst in seen


def test_no_secure_path_means_none_never_a_normal_hop() -> None:
    g = Multigraph(range(3))
    g.add_link(0, 1, weight=1.0, classes={N, S})
    g.add_link(1, 2, weight=1.0)  # normal only: breaks the secure path
    g.add_link(0, 2, weight=9.0, classes={N, E})
    assert g.path(0, 2, cls=S) is None
    assert g.next_hops(0, cls=S) == {1: (1, 0)}
    k = g.add_link(1, 2, weight=7.0, classes={N, S}).key  # a parallel secure link
    p = g.path(0, 2, cls=S)
    assert p is not None and p.links == (0, k) and p.cls is S


def test_express_fallback() -> None:
    g = Multigraph(range(3))
    g.add_link(0, 1, weight=1.0, classes={N, E})
    g.add_link(1, 2, weight=1.0)
    assert g.path(0, 2, cls=E) is None
    p = g.path(0, 2, cls=E, fallback=True)
    assert p is not None and p.cls is N and p.brokers == (0, 1, 2)
    express = g.add_link(0, 2, weight=10.0, classes={N, E})
    p = g.path(0, 2, cls=E, fallback=True)
    assert p is not None and p.cls is E and p.links == (express.key,)
    g.remove_broker(1)
    g.fail_link(express.key)
    assert g.path(0, 2, cls=E, fallback=True) is None  # no path of any class
    assert g.path(0, 2, fallback=True) is None  # fallback is harmless for NORMAL


# --------------------------------------------------------------------------- deployment


def pair_counts(g: Multigraph) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for link in g.links():
        counts[link.a, link.b] = counts.get((link.a, link.b), 0) + 1
    return counts


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 64])
def test_ring_deployment_shape(n: int) -> None:
    g = ring_deployment(n, express_fraction=0.3, secure_fraction=0.5, rng=random.Random(n))
    links = list(g.links())
    assert g.brokers == tuple(range(n))
    assert all(link.a != link.b for link in links)
    assert all(count == 1 for count in pair_counts(g).values())
    ring_degree = min(4, n - 1)
    if n <= 5:  # +-1, +-2 cover everybody; default chords add nothing new
        assert all(len(g.neighbours(b)) == ring_degree for b in g.brokers)
    else:
        chords = default_chords(n)
        assert chords == (4, 8, 16, 32)
        # each offset k gives two chord neighbours (i + k, i - k), one when 2k == n
        want = 4 + sum(1 if 2 * k % n == 0 else 2 for k in chords)
        assert all(len(g.neighbours(b)) == want for b in g.brokers)
        for b in g.brokers:
            assert {(b + d) % n for d in (1, 2, -1, -2)} <= set(g.neighbours(b))
    assert len(g.next_hops(0)) == n - 1  # connected
    express = sum(E in link.classes for link in links)
    secure = sum(S in link.classes for link in links)
    assert express == round(0.3 * len(links)) and secure == round(0.5 * len(links))
    assert all(1.0 <= link.weight <= 10.0 for link in links)
    assert all(link.latency is not None and link.latency <= 5.0 for link in links if E in link.classes)


def test_ring_deployment_explicit_chords_and_parallel_secure() -> None:
    g = ring_deployment(
        20,
        chords=[5, 20, 25],
        express_fraction=0.0,
        secure_fraction=0.0,
        rng=random.Random(3),
        parallel_secure=0.5,
    )
    # 5 and 25 are the same offset mod 20, 20 is a self-loop: both are dropped
    base = [link for link in g.links() if S not in link.classes]
    extra = [link for link in g.links() if S in link.classes]
    assert len(base) == 20 * 3 and len(extra) == 30
    assert all(extra_link.classes == {N, S} for extra_link in extra)
    counts = pair_counts(g)
    assert sum(count == 2 for count in counts.values()) == 30 and max(counts.values()) == 2
    assert all(len(g.neighbours(b)) == 6 for b in g.brokers)


def test_ring_deployment_is_deterministic_per_seed() -> None:
    def build(seed: int) -> list[Link]:
        g = ring_deployment(
            64, express_fraction=0.2, secure_fraction=0.4, rng=random.Random(seed), parallel_secure=0.1
        )
        return list(g.links())

    assert build(7) == build(7)
    assert build(7) != build(8)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n must be"),
        ({"express_fraction": 1.5}, "express_fraction"),
        ({"secure_fraction": -0.1}, "secure_fraction"),
        ({"parallel_secure": 2.0}, "parallel_secure"),
        ({"chords": [0]}, "chords"),
        ({"weights": (0.0, 1.0)}, "weights"),
        ({"weights": (3.0, 1.0)}, "weights"),
        ({"latency": (-1.0, 1.0)}, "latency"),
    ],
)
def test_ring_deployment_validation(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "n": 8,
        "express_fraction": 0.1,
        "secure_fraction": 0.1,
        "rng": random.Random(0),
    } | kwargs
    n = args.pop("n")
    with pytest.raises(OverlayError, match=message):
        ring_deployment(n, **args)  # type: ignore[arg-type]
