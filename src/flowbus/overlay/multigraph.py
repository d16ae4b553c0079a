"""The weighted broker multigraph: link classes and class-aware path computation (pure).

How it works (the adaptive-overlay paper, "weighted multigraph model", section 3.3, and
"adaptation in the proposed overlay topology", section 3.5):

* Brokers and links (3.3.1, 3.3.2): a broker is an int id; a :class:`Link` joins two
  distinct brokers ``a < b`` and is bi-directional. It is a *multigraph*: two brokers may
  be joined by several parallel links (e.g. a cheap normal one and a separate secure one),
  each with its own key, classes, weight and latency.
* Link classes (3.3.3, 3.3.4): every link is NORMAL (it belongs to En); some are also
  EXPRESS (Eu, guaranteed low latency) and/or SECURE (Es, secure protocols). Both are
  subsets of En, so a link's ``classes`` always contains NORMAL.
* Weights (3.3.5): the paper weights a link by its bandwidth; here ``weight`` is a *cost*
  (lower is better) so that shortest paths make sense. :func:`cost_from_bandwidth` maps a
  bandwidth to a cost, ``reference / bandwidth``: a link twice as wide costs half.
* Routing by class (3.5, "urgent events over express links, secure events over secure
  links"): :meth:`Multigraph.path` runs Dijkstra over the live links usable by the class:
  SECURE uses only links having SECURE, on every hop (never a normal-only link); EXPRESS
  only express links -- with no express path it returns None so the caller decides, or,
  with ``fallback=True``, the NORMAL path (its ``cls`` then says NORMAL); NORMAL uses every
  live link. Ties are broken by (cost, hops, broker sequence, link-key sequence), compared
  lexicographically, so every result is reproducible. :meth:`Multigraph.next_hops` is a
  broker's routing table (``Routetab``, 3.3.1), computed by the same single Dijkstra run,
  so it agrees with :meth:`~Multigraph.path` for every destination.
* Latency bounds (3.3.3: an express link's latency "is guaranteed to be in the range
  designated as the express range"): routing takes an optional ``bound``, and a link whose
  latency is known and above it is left out, so an express space with a bound is routed
  only over links that meet it. :meth:`Multigraph.measure` records a link's measured
  latency (a :class:`~flowbus.overlay.class_router.ClassRouter` measures it from its
  heartbeats); a link that slows past a bound bumps the version and the tables change.
* Failures (3.4, 3.5 "standby links"): :meth:`Multigraph.fail_link` takes a link out of
  routing without forgetting it; :meth:`~Multigraph.restore_link` brings it back. Every
  change bumps :attr:`Multigraph.version`, so callers know when to recompute tables.

:func:`ring_deployment` builds the paper's overlay: a degree-4 chordal ring (i to i+-1 and
i+-2, 3.3) plus chords i to i+k, random weights and a random share of express and secure
links, all drawn from the ``random.Random`` handed in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from heapq import heappop, heappush

from flowbus import wire
from flowbus.errors import OverlayError

__all__ = [
    "Link",
    "LinkClass",
    "Multigraph",
    "OverlayError",
    "Path",
    "cost_from_bandwidth",
    "default_chords",
    "ring_deployment",
]


@wire.message("classes.link_class")
class LinkClass(Enum):
    """What a link guarantees: every link is NORMAL; some are also EXPRESS and/or SECURE."""

    NORMAL = "normal"
    EXPRESS = "express"
    SECURE = "secure"


NORMAL_ONLY: frozenset[LinkClass] = frozenset({LinkClass.NORMAL})


def _is_int(x: object) -> bool:
    return type(x) is int


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def cost_from_bandwidth(bandwidth: float, *, reference: float = 1.0) -> float:
    """The link weight (a cost) of a link of this bandwidth: ``reference / bandwidth``."""
    if not _is_number(bandwidth) or bandwidth <= 0:
        raise OverlayError(f"bandwidth must be a finite number > 0, got {bandwidth!r}")
    if not _is_number(reference) or reference <= 0:
        raise OverlayError(f"reference must be a finite number > 0, got {reference!r}")
    return reference / bandwidth


@dataclass(frozen=True, slots=True)
class Link:
    """One bi-directional overlay link ``a``--``b`` (``a < b``), identified by ``key``."""

    key: int
    a: int
    b: int
    weight: float
    classes: frozenset[LinkClass] = NORMAL_ONLY
    latency: float | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.key) or self.key < 0:
            raise OverlayError(f"link key must be an int >= 0, got {self.key!r}")
        if not (_is_int(self.a) and _is_int(self.b)):
            raise OverlayError(f"link endpoints must be int broker ids, got {self.a!r}, {self.b!r}")
        if self.a == self.b:
            raise OverlayError(f"link {self.key}: self-loop on broker {self.a}")
        if self.a > self.b:
            raise OverlayError(f"link {self.key}: endpoints must be ordered a < b, got {self.a}, {self.b}")
        if not _is_number(self.weight) or self.weight <= 0:
            raise OverlayError(f"link {self.key}: weight must be a finite number > 0, got {self.weight!r}")
        if not isinstance(self.classes, frozenset) or not all(isinstance(c, LinkClass) for c in self.classes):
            raise OverlayError(f"link {self.key}: classes must be a frozenset of LinkClass")
        if LinkClass.NORMAL not in self.classes:
            raise OverlayError(
                f"link {self.key}: classes {sorted(c.value for c in self.classes)} miss NORMAL "
                "(express and secure links are normal links too)"
            )
        if self.latency is not None and (not _is_number(self.latency) or self.latency < 0):
            raise OverlayError(f"link {self.key}: latency must be a finite number >= 0, got {self.latency!r}")

    def other(self, broker: int) -> int:
        """The endpoint that is not ``broker``."""
        if broker == self.a:
            return self.b
        if broker == self.b:
            return self.a
        raise OverlayError(f"broker {broker} is not an endpoint of link {self.key}")


@dataclass(frozen=True, slots=True)
class Path:
    """A route: ``brokers[0]`` is the source, ``links[i]`` joins ``brokers[i]`` and
    ``brokers[i + 1]``. ``latency`` is None when some link's latency is unknown; ``cls`` is
    the class every link of the path has (NORMAL after an express fallback)."""

    brokers: tuple[int, ...]
    links: tuple[int, ...]
    cost: float
    latency: float | None
    cls: LinkClass = LinkClass.NORMAL

    def __post_init__(self) -> None:
        if not self.brokers:
            raise OverlayError("a path has at least one broker")
        if len(self.links) != len(self.brokers) - 1:
            raise OverlayError(f"a path of {len(self.brokers)} brokers has {len(self.brokers) - 1} links")
        if not _is_number(self.cost) or self.cost < 0:
            raise OverlayError(f"path cost must be a finite number >= 0, got {self.cost!r}")

    @property
    def src(self) -> int:
        return self.brokers[0]

    @property
    def dst(self) -> int:
        return self.brokers[-1]

    @property
    def hops(self) -> int:
        return len(self.links)


_Label = tuple[float, int, tuple[int, ...], tuple[int, ...]]
"""Dijkstra's label of a partial path: (cost, hops, brokers, link keys), compared as a tuple."""


def _usable(link: Link, cls: LinkClass) -> bool:
    return cls is LinkClass.NORMAL or cls in link.classes


class Multigraph:
    """Brokers and (parallel) links, with failed links kept aside; mutable, not thread-safe."""

    __slots__ = ("_adj", "_failed", "_links", "_next_key", "_version")

    def __init__(self, brokers: Iterable[int] = ()) -> None:
        self._adj: dict[int, set[int]] = {}
        self._links: dict[int, Link] = {}
        self._failed: set[int] = set()
        self._next_key = 0
        self._version = 0
        for b in brokers:
            self.add_broker(b)

    # ------------------------------------------------------------------------ reading

    @property
    def version(self) -> int:
        """Bumped by every change; a routing table computed at another version is stale."""
        return self._version

    @property
    def brokers(self) -> tuple[int, ...]:
        return tuple(sorted(self._adj))

    @property
    def failed(self) -> frozenset[int]:
        """Keys of the links currently failed."""
        return frozenset(self._failed)

    def __contains__(self, broker: object) -> bool:
        return broker in self._adj

    def link(self, key: int) -> Link:
        try:
            return self._links[key]
        except KeyError:
            raise OverlayError(f"unknown link {key!r}") from None

    def is_live(self, key: int) -> bool:
        return self.link(key).key not in self._failed

    def links(self, *, include_failed: bool = True) -> Iterator[Link]:
        """Every link, by key."""
        for key in sorted(self._links):
            if include_failed or key not in self._failed:
                yield self._links[key]

    def links_between(
        self, a: int, b: int, *, cls: LinkClass | None = None, include_failed: bool = False
    ) -> tuple[Link, ...]:
        """The (live, unless ``include_failed``) links joining ``a`` and ``b`` usable by
        ``cls`` (any class if None), by key."""
        self._check_broker(a)
        self._check_broker(b)
        return tuple(
            link for link in self._incident(a, cls, include_failed=include_failed) if link.other(a) == b
        )

    def neighbours(self, broker: int, cls: LinkClass | None = None) -> tuple[int, ...]:
        """Brokers one live link usable by ``cls`` (any class if None) away, sorted."""
        self._check_broker(broker)
        return tuple(sorted({link.other(broker) for link in self._incident(broker, cls)}))

    def incident(self, broker: int) -> list[Link]:
        """The live links at ``broker``, by key."""
        self._check_broker(broker)
        return self._incident(broker, None)

    def _incident(self, broker: int, cls: LinkClass | None, *, include_failed: bool = False) -> list[Link]:
        keys = sorted(self._adj[broker]) if include_failed else sorted(self._adj[broker] - self._failed)
        return [self._links[k] for k in keys if cls is None or cls in self._links[k].classes]

    def _check_broker(self, broker: int) -> None:
        if broker not in self._adj:
            raise OverlayError(f"unknown broker {broker!r}")

    # ----------------------------------------------------------------------- changing

    def add_broker(self, broker: int) -> None:
        if not _is_int(broker):
            raise OverlayError(f"a broker id is an int, got {broker!r}")
        if broker in self._adj:
            raise OverlayError(f"broker {broker} already exists")
        self._adj[broker] = set()
        self._version += 1

    def remove_broker(self, broker: int) -> None:
        """Remove ``broker`` and every link it has (failed or not)."""
        self._check_broker(broker)
        for key in list(self._adj[broker]):
            self._drop(key)
        del self._adj[broker]
        self._version += 1

    def add_link(
        self,
        a: int,
        b: int,
        *,
        weight: float,
        classes: Iterable[LinkClass] = NORMAL_ONLY,
        latency: float | None = None,
    ) -> Link:
        """Add a new link between ``a`` and ``b`` (in either order) and return it; a pair
        may have several links. Keys are never reused."""
        self._check_broker(a)
        self._check_broker(b)
        lo, hi = (a, b) if a <= b else (b, a)
        link = Link(self._next_key, lo, hi, weight, frozenset(classes), latency)
        self._next_key += 1
        self._links[link.key] = link
        self._adj[lo].add(link.key)
        self._adj[hi].add(link.key)
        self._version += 1
        return link

    def remove_link(self, key: int) -> Link:
        link = self.link(key)
        self._drop(key)
        self._version += 1
        return link

    def _drop(self, key: int) -> None:
        link = self._links.pop(key)
        self._adj[link.a].discard(key)
        self._adj[link.b].discard(key)
        self._failed.discard(key)

    def fail_link(self, key: int) -> bool:
        """Take a link out of routing (kept, see :meth:`restore_link`); False if it was
        already failed (nothing changes)."""
        self.link(key)
        if key in self._failed:
            return False
        self._failed.add(key)
        self._version += 1
        return True

    def measure(self, key: int, latency: float) -> bool:
        """A measured latency for link ``key``; False if it is the one known (nothing changes)."""
        link = self.link(key)
        if link.latency == latency:
            return False
        self._links[key] = replace(link, latency=latency)  # (checked by Link)
        self._version += 1
        return True

    def restore_link(self, key: int) -> bool:
        """Bring a failed link back; False if it was live (nothing changes)."""
        self.link(key)
        if key not in self._failed:
            return False
        self._failed.discard(key)
        self._version += 1
        return True

    def copy(self) -> Multigraph:
        """An independent copy (same keys, failures and version)."""
        other = Multigraph()
        other._adj = {b: set(keys) for b, keys in self._adj.items()}
        other._links = dict(self._links)
        other._failed = set(self._failed)
        other._next_key = self._next_key
        other._version = self._version
        return other

    # ------------------------------------------------------------------------ routing

    def path(
        self,
        src: int,
        dst: int,
        *,
        cls: LinkClass = LinkClass.NORMAL,
        avoid: Collection[int] = frozenset(),
        fallback: bool = False,
        bound: float | None = None,
    ) -> Path | None:
        """The best path from ``src`` to ``dst`` over live links usable by ``cls``, never
        through a broker of ``avoid`` (None if ``src`` or ``dst`` is in it), or None.

        ``fallback=True`` (EXPRESS only) returns the NORMAL path when no express path
        exists; secure traffic never falls back (OverlayError). With a ``bound``, links of a
        known latency above it are left out."""
        self._check_broker(dst)
        if fallback and cls is LinkClass.SECURE:
            raise OverlayError("secure traffic never falls back to non-secure links")
        label = self._dijkstra(src, cls, avoid, target=dst, bound=bound).get(dst)
        if label is not None:
            return self._to_path(label, cls)
        if fallback and cls is LinkClass.EXPRESS:
            return self.path(src, dst, cls=LinkClass.NORMAL, avoid=avoid)
        return None

    def next_hops(
        self,
        src: int,
        *,
        cls: LinkClass = LinkClass.NORMAL,
        avoid: Collection[int] = frozenset(),
        bound: float | None = None,
    ) -> dict[int, tuple[int, int]]:
        """``src``'s routing table for ``cls``: {destination: (next broker, link key)} for
        every other broker reachable, from one Dijkstra run (agrees with :meth:`path`)."""
        settled = self._dijkstra(src, cls, avoid, bound=bound)
        return {dst: (label[2][1], label[3][0]) for dst, label in sorted(settled.items()) if dst != src}

    def paths_from(
        self, src: int, *, cls: LinkClass = LinkClass.NORMAL, avoid: Collection[int] = frozenset()
    ) -> dict[int, Path]:
        """Every best path from ``src`` (itself included, zero hops), from one Dijkstra run."""
        settled = self._dijkstra(src, cls, avoid)
        return {dst: self._to_path(label, cls) for dst, label in sorted(settled.items())}

    def _dijkstra(
        self,
        src: int,
        cls: LinkClass,
        avoid: Collection[int],
        *,
        target: int | None = None,
        bound: float | None = None,
    ) -> dict[int, _Label]:
        """Settled labels; lexicographic (cost, hops, brokers, keys) is isotone under
        extension by a link (positive weight), so Dijkstra yields the least label."""
        self._check_broker(src)
        if not isinstance(cls, LinkClass):
            raise OverlayError(f"cls must be a LinkClass, got {cls!r}")
        settled: dict[int, _Label] = {}
        avoid = frozenset(avoid)
        if src in avoid:
            return settled
        best: dict[int, _Label] = {}
        heap: list[_Label] = [(0.0, 0, (src,), ())]
        while heap:
            label = heappop(heap)
            u = label[2][-1]
            if u in settled:
                continue
            settled[u] = label
            if u == target:
                break
            for key in self._adj[u]:  # any order: the least label wins whatever the order
                link = self._links[key]
                v = link.b if link.a == u else link.a
                if key in self._failed or v in settled or v in avoid or not _usable(link, cls):
                    continue
                if bound is not None and link.latency is not None and link.latency > bound:
                    continue
                cost, old = label[0] + link.weight, best.get(v)
                if old is not None and (cost, label[1] + 1) > old[:2]:
                    continue  # cheap test first: most relaxations lose on (cost, hops)
                cand = (cost, label[1] + 1, (*label[2], v), (*label[3], key))
                if old is None or cand < old:
                    best[v] = cand
                    heappush(heap, cand)
        return settled

    def _to_path(self, label: _Label, cls: LinkClass) -> Path:
        cost, _, brokers, keys = label
        latencies = [self._links[k].latency for k in keys]
        latency = None if None in latencies else sum(x for x in latencies if x is not None)
        return Path(brokers, keys, cost, float(latency) if latency is not None else None, cls)


# ---------------------------------------------------------------------------- deployment


def default_chords(n: int) -> tuple[int, ...]:
    """Chord offsets 4, 8, 16, ... < n: about log2(n) - 2 per broker, each used both ways."""
    chords, k = [], 4
    while k < n:
        chords.append(k)
        k *= 2
    return tuple(chords)


def _ring_pairs(n: int, offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Pairs (i, (i + k) mod n) for every broker and offset, minus self-loops and repeats."""
    pairs = set()
    for k in offsets:
        for i in range(n):
            j = (i + k) % n
            if i != j:
                pairs.add((min(i, j), max(i, j)))
    return sorted(pairs)


def _check_range(name: str, bounds: tuple[float, float], *, low: float) -> None:
    lo, hi = bounds
    if not (_is_number(lo) and _is_number(hi)) or lo < low or lo > hi:
        raise OverlayError(f"{name} must be (lo, hi) with {low} <= lo <= hi, got {bounds!r}")


def ring_deployment(
    n: int,
    *,
    chords: Sequence[int] | None = None,
    express_fraction: float,
    secure_fraction: float,
    rng: random.Random,
    weights: tuple[float, float] = (1.0, 10.0),
    latency: tuple[float, float] = (5.0, 50.0),
    express_latency: tuple[float, float] = (0.5, 5.0),
    parallel_secure: float = 0.0,
) -> Multigraph:
    """Brokers 0..n-1 on a ring with links i--i+-1, i+-2 and chords i--i+k (``chords``,
    default :func:`default_chords`), deduplicated and without self-loops.

    Each link gets a weight uniform in ``weights`` and a latency uniform in ``latency``
    (``express_latency`` for express links). Exactly ``round(fraction * links)`` links,
    drawn independently, are marked EXPRESS and SECURE; then ``round(parallel_secure *
    non-secure pairs)`` non-secure pairs get an extra parallel NORMAL+SECURE link. All
    randomness comes from ``rng``, so a seed gives one deployment."""
    if not _is_int(n) or n < 1:
        raise OverlayError(f"n must be an int >= 1, got {n!r}")
    offsets = default_chords(n) if chords is None else tuple(chords)
    if not all(_is_int(k) and k >= 1 for k in offsets):
        raise OverlayError(f"chords must be ints >= 1, got {offsets!r}")
    for name, f in (
        ("express_fraction", express_fraction),
        ("secure_fraction", secure_fraction),
        ("parallel_secure", parallel_secure),
    ):
        if not _is_number(f) or not 0 <= f <= 1:
            raise OverlayError(f"{name} must be in [0, 1], got {f!r}")
    _check_range("weights", weights, low=math.ulp(0.0))
    _check_range("latency", latency, low=0.0)
    _check_range("express_latency", express_latency, low=0.0)

    pairs = _ring_pairs(n, (1, 2, *offsets))
    express = set(rng.sample(pairs, round(express_fraction * len(pairs))))
    secure = set(rng.sample(pairs, round(secure_fraction * len(pairs))))
    graph = Multigraph(range(n))
    for pair in pairs:
        classes = {LinkClass.NORMAL}
        if pair in express:
            classes.add(LinkClass.EXPRESS)
        if pair in secure:
            classes.add(LinkClass.SECURE)
        lat = rng.uniform(*(express_latency if pair in express else latency))
        graph.add_link(*pair, weight=rng.uniform(*weights), classes=classes, latency=lat)
    plain = [pair for pair in pairs if pair not in secure]
    for pair in sorted(rng.sample(plain, round(parallel_secure * len(plain)))):
        classes = {LinkClass.NORMAL, LinkClass.SECURE}
        graph.add_link(*pair, weight=rng.uniform(*weights), classes=classes, latency=rng.uniform(*latency))
    return graph
