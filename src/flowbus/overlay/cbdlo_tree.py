"""CBDLO's upper layer: one attribute topology, a balanced binary tree of virtual nodes.

How it works (the 004 document, section 2 and section 5.2): the value range ``[lo, hi)``
of one attribute is cut at the bounds of the subscriptions' predicates on it into
contiguous, disjoint sub-ranges. Each sub-range is a *virtual node* (:class:`VNode`) that

* has a *node list*: the real nodes with a subscription whose predicate on the attribute
  contains the sub-range (:meth:`AttributeTree.node_list`; a predicate contains the whole
  sub-range or none of it, so these are the predicates holding its lower end -- the tree
  answers from one vectorised index of the predicates rather than copying the lists into
  every virtual node, which would take O(subscriptions x virtual nodes) memory);
* is hosted by one real subscriber node (``host``): the node that created it by bringing
  the bound it starts at, or, after that node left, another member of the topology;
* is a node of an AVL tree ordered by its range (``left``, ``right``, ``parent``),
  which also knows the range its subtree spans (``span_lo``, ``span_hi``), so a message
  can climb up and go down towards any value (:func:`next_hop`).

The tree is the document's "distributed balanced binary tree". We chose an AVL tree (as
BATON does over peers) because its height stays below 1.44 log2(V + 2) whatever the order
of inserts and deletes: subscriptions come and go in any order, and CDM's second stage
costs one hop per level. Every predicate is a half-open interval ``[a, b)``; a bound
strictly inside the range splits the sub-range holding it (unless a virtual node already
starts there), and a bound no longer used by any predicate merges its two sub-ranges
back. So the topology has ``distinct interior bounds + 1`` virtual nodes: at most
``s + 1`` for ``s`` one-sided predicates (``a >= v``, ``a < v``; the document's
``subscriptions + 2`` bound), at most ``2 s + 1`` for two-sided ranges.

Who holds what (the maintenance protocol is :mod:`flowbus.routing.cbdlo_maint`): an
:class:`AttributeTree` is the state of the attribute's *coordinator*, the node that
serialises the topology's inserts and deletes (a backup node replays them on a copy). Each
host holds only the records (:class:`VRec`) of the virtual nodes it hosts -- range, span,
height, and the (virtual node, host) links to its parent and children -- and routes from
them; after every operation :meth:`AttributeTree.changes` lists the records that changed
(the path up from the split or merge, the nodes a rotation moved, a virtual node moved to
another host) and those to drop, grouped by host: one message per host. The predicates
themselves (the node lists' index) stay with the coordinator's tree and are read by the
virtual node a search ends at (:meth:`Topologies.node_list_at`): the one shortcut left.

Bounds are exact numbers: ``a > v`` becomes ``a >= above(v)``, the least int or double
greater than ``v`` (:func:`above`), never ``float(v)``, so ints past 2**53 and beyond the
doubles compare as docs/filters.md says.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowbus.errors import TopologyError
from flowbus.filters import Filter, Op, Predicate
from flowbus.filters.ast import Conjunction
from flowbus.filters.values import ceil_double

__all__ = [
    "AttributeTree",
    "Changes",
    "Link",
    "Number",
    "RangeSubscription",
    "Topologies",
    "TopologyError",
    "VNode",
    "VRec",
    "above",
    "next_hop",
    "record_next",
]

Number = int | float
"""A bound or a value: ints stay ints (exact past 2**53), doubles stay doubles."""


# --------------------------------------------------------------------------- subscriptions


@dataclass(frozen=True, slots=True)
class RangeSubscription:
    """A conjunction of half-open ranges ``lo <= event[attr] < hi``, one per attribute.

    ``sid`` names it at its subscriber ``node``; ``ranges`` is sorted by attribute.
    """

    sid: Hashable
    node: int
    ranges: tuple[tuple[str, Number, Number], ...]

    def __post_init__(self) -> None:
        if not self.ranges:
            raise TopologyError(f"subscription {self.sid!r}: no attribute")
        attrs = [a for a, _, _ in self.ranges]
        if len(set(attrs)) != len(attrs):
            raise TopologyError(f"subscription {self.sid!r}: an attribute appears twice in {attrs}")
        for attr, lo, hi in self.ranges:
            if not lo < hi:
                raise TopologyError(f"subscription {self.sid!r}: empty range [{lo}, {hi}) on {attr!r}")
        object.__setattr__(self, "ranges", tuple(sorted(self.ranges)))

    @property
    def attrs(self) -> tuple[str, ...]:
        return tuple(a for a, _, _ in self.ranges)

    def range_of(self, attr: str) -> tuple[Number, Number] | None:
        for a, lo, hi in self.ranges:
            if a == attr:
                return lo, hi
        return None

    def matches(self, event: Mapping[str, Any]) -> bool:
        """Every attribute present with its value in range (the same answer as :meth:`to_filter`;
        a range without an upper bound holds ``inf`` too)."""
        for attr, lo, hi in self.ranges:
            v = event.get(attr)
            if v is None or not lo <= v or not (v < hi or hi == math.inf):
                return False
        return True

    def to_filter(self) -> Filter:
        """The filter in flowbus's canonical form (``attr >= lo & attr < hi`` per attribute)."""
        lits: list[Predicate] = []
        for attr, lo, hi in self.ranges:
            if lo != -math.inf:
                lits.append(Predicate(attr, Op.GE, lo))
            if hi != math.inf:
                lits.append(Predicate(attr, Op.LT, hi))
        return Filter((Conjunction(tuple(lits)),))

    @classmethod
    def from_filter(cls, sid: Hashable, node: int, filt: Filter) -> RangeSubscription:
        """A filter of one conjunction of numeric ``>=``, ``>``, ``<``, ``<=``, ``=`` predicates
        (``a > v`` becomes ``a >= above(v)``, ``a = v`` the range ``[v, above(v))``: exact)."""
        if len(filt.disjuncts) != 1:
            raise TopologyError(f"subscription {sid!r}: CBDLO takes one conjunction, got {filt}")
        bounds: dict[str, list[Number]] = {}
        for lit in filt.disjuncts[0].literals:
            v = lit.value if isinstance(lit, Predicate) and not lit.negated else None
            if not isinstance(lit, Predicate) or not isinstance(v, int | float) or isinstance(v, bool):
                raise TopologyError(f"subscription {sid!r}: {lit} is not a numeric comparison")
            if lit.op not in _OPS:
                raise TopologyError(f"subscription {sid!r}: {lit} is not a numeric comparison")
            lo, hi = bounds.setdefault(lit.attr, [-math.inf, math.inf])
            lo_new, hi_new = _OPS[lit.op](v)
            bounds[lit.attr] = [max(lo, lo_new), min(hi, hi_new)]
        return cls(sid, node, tuple((a, lo, hi) for a, (lo, hi) in bounds.items()))


def above(v: Number) -> Number:
    """The least int or double greater than ``v``: ``x > v`` iff ``x >= above(v)`` for every
    int and double ``x`` (exact: no rounding through ``float``, no overflow past the doubles)."""
    if isinstance(v, float):
        if not math.isfinite(v):
            return math.nextafter(v, math.inf)
        d: Number = math.nextafter(v, math.inf)
    else:
        c = ceil_double(v)
        d = math.nextafter(c, math.inf) if c == v else c
    n = math.floor(v) + 1
    return n if n < d else d


_OPS: dict[Op, Callable[[Number], tuple[Number, Number]]] = {
    Op.GE: lambda v: (v, math.inf),
    Op.GT: lambda v: (above(v), math.inf),
    Op.LT: lambda v: (-math.inf, v),
    Op.LE: lambda v: (-math.inf, above(v)),
    Op.EQ: lambda v: (v, above(v)),
}


# ---------------------------------------------------------------------------- virtual node


class VNode:
    """One sub-range ``[lo, hi)`` of an attribute's values: a node of the AVL tree."""

    __slots__ = (
        "height",
        "hi",
        "host",
        "left",
        "lo",
        "parent",
        "right",
        "span_hi",
        "span_lo",
        "vid",
    )

    def __init__(self, vid: int, lo: Number, hi: Number, host: int) -> None:
        self.vid = vid
        self.lo = lo
        self.hi = hi
        self.host = host
        self.left: VNode | None = None
        self.right: VNode | None = None
        self.parent: VNode | None = None
        self.height = 1
        self.span_lo = lo
        self.span_hi = hi

    def contains(self, value: Number) -> bool:
        return self.lo <= value < self.hi

    def __repr__(self) -> str:
        return f"VNode({self.vid}, [{self.lo}, {self.hi}), host={self.host})"


def next_hop(v: VNode, value: Number) -> VNode | None:
    """The neighbour of ``v`` one step closer to the virtual node holding ``value``
    (None: ``v`` holds it). Down if ``v``'s subtree spans the value, else up."""
    if v.lo <= value < v.hi:
        return None
    if v.span_lo <= value < v.span_hi:
        return v.left if value < v.lo else v.right
    return v.parent


Link = tuple[int, int]
"""A tree link as a record holds it: (virtual node id, its host)."""


@dataclass(frozen=True, slots=True)
class VRec:
    """A virtual node as its host holds it: what routing in the tree needs, nothing more."""

    attr: str
    vid: int
    lo: Number
    hi: Number
    span_lo: Number
    span_hi: Number
    height: int
    host: int
    parent: Link | None
    left: Link | None
    right: Link | None

    def contains(self, value: Number) -> bool:
        return self.lo <= value < self.hi


def record_next(r: VRec, value: Number) -> Link | None:
    """:func:`next_hop` on a host's record: the link one step closer to ``value`` (None: here)."""
    if r.lo <= value < r.hi:
        return None
    if r.span_lo <= value < r.span_hi:
        return r.left if value < r.lo else r.right
    return r.parent


def _link(v: VNode | None) -> Link | None:
    return None if v is None else (v.vid, v.host)


def _record(attr: str, v: VNode) -> VRec:
    return VRec(attr, v.vid, v.lo, v.hi, v.span_lo, v.span_hi, v.height, v.host,
                _link(v.parent), _link(v.left), _link(v.right))  # fmt: skip


def _linked(link: Link | None, v: VNode | None) -> bool:
    if v is None:
        return link is None
    return link is not None and link[0] == v.vid and link[1] == v.host


def _same(v: VNode, r: VRec) -> bool:
    """``v`` is as its record ``r`` says (:func:`_record` without building one)."""
    return (
        v.height == r.height and v.span_lo == r.span_lo and v.span_hi == r.span_hi and v.hi == r.hi
        and v.lo == r.lo and v.host == r.host and _linked(r.parent, v.parent) and _linked(r.left, v.left)
        and _linked(r.right, v.right)
    )  # fmt: skip


@dataclass(slots=True)
class Changes:
    """What one operation changed, by host: records to (re)write, virtual nodes to drop."""

    updates: dict[int, list[VRec]] = field(default_factory=dict)
    drops: dict[int, list[int]] = field(default_factory=dict)

    def hosts(self) -> list[int]:
        return sorted(set(self.updates) | set(self.drops))


def _set_parent(v: VNode, parent: VNode | None, touched: set[VNode]) -> None:
    """Link ``v`` under ``parent``, marking it changed if that moved it."""
    if v.parent is not parent:
        v.parent = parent
        touched.add(v)


def _h(v: VNode | None) -> int:
    return 0 if v is None else v.height


def _fix(v: VNode, touched: set[VNode]) -> None:
    touched.add(v)
    left, right = v.left, v.right
    v.height = 1 + max(_h(left), _h(right))
    v.span_lo = v.lo if left is None else left.span_lo
    v.span_hi = v.hi if right is None else right.span_hi


def _is_double(x: Number) -> bool:
    """``x`` compares the same as a double (a float, or an int a double holds exactly)."""
    if isinstance(x, float):
        return True
    try:
        return float(x) == x
    except OverflowError:
        return False


# ------------------------------------------------------------------------------- the tree


class AttributeTree:
    """The attribute topology of ``attr`` over the values ``[lo, hi)`` (see the module note)."""

    def __init__(self, attr: str, lo: Number, hi: Number, *, first_host: int) -> None:
        if not lo < hi:
            raise TopologyError(f"attribute {attr!r}: empty value range [{lo}, {hi})")
        self.attr = attr
        self.lo = lo
        self.hi = hi
        self._next_vid = 0
        self._touched: set[VNode] = set()
        self._gone: list[VNode] = []
        self.shipped: dict[int, VRec] = {}  # vid -> the record its host was last sent
        self.coordinator = first_host
        self.backup: int | None = None
        self.root: VNode = self._new(lo, hi, first_host)
        self._touched.add(self.root)
        self.bounds: dict[Number, int] = {}  # interior bound -> predicates ending or starting there
        self.by_vid: dict[int, VNode] = {self.root.vid: self.root}
        self.hosted: dict[int, set[int]] = {first_host: {self.root.vid}}
        self.member_subs: dict[int, int] = {}  # real node -> its subscriptions in this topology
        self.intervals: Counter[tuple[int, Number, Number]] = Counter()  # (node, lo, hi) -> how many
        self.subscriptions = 0
        self._index: tuple[Any, Any, Any] | None = None

    def _new(self, lo: Number, hi: Number, host: int) -> VNode:
        v = VNode(self._next_vid, lo, hi, host)
        self._next_vid += 1
        return v

    # -- queries -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.by_vid)

    def height(self) -> int:
        return self.root.height

    def locate(self, value: Number) -> VNode:
        """The virtual node whose range holds ``value`` (clamped into the value range)."""
        v = self.root
        value = min(max(value, self.lo), math.nextafter(self.hi, -math.inf))
        while not v.lo <= value < v.hi:
            nxt = v.left if value < v.lo else v.right
            assert nxt is not None, "the virtual nodes cover the value range"
            v = nxt
        return v

    def vnodes(self) -> Iterator[VNode]:
        """The virtual nodes in the order of their ranges."""
        stack: list[VNode] = []
        v: VNode | None = self.root
        while stack or v is not None:
            while v is not None:
                stack.append(v)
                v = v.left
            v = stack.pop()
            yield v
            v = v.right

    def vnodes_of(self, host: int) -> list[VNode]:
        """The node's *virtual node list* for this attribute (empty: it hosts none)."""
        return [self.by_vid[i] for i in sorted(self.hosted.get(host, ()))]

    def node_list(self, v: VNode | VRec) -> list[int]:
        """The real nodes with a predicate containing ``v``'s sub-range, in ascending order."""
        return self.node_list_at(v.lo)

    def node_list_at(self, x: Number) -> list[int]:
        """The real nodes with a predicate holding ``x``, in ascending order (bounds compared
        exactly: as doubles while every bound is one, else as Python numbers)."""
        if self._index is None:
            keys = list(self.intervals)
            exact = all(_is_double(k[1]) and _is_double(k[2]) for k in keys)
            kind: Any = float if exact else object
            self._index = (
                np.array([k[1] for k in keys], dtype=kind),
                np.array([k[2] for k in keys], dtype=kind),
                np.array([k[0] for k in keys], dtype=np.int64),
            )
        lo, hi, node = self._index
        if lo.dtype != object and not _is_double(x):  # an int no double holds: compare exactly
            lo, hi = lo.astype(object), hi.astype(object)
        return [int(n) for n in np.unique(node[(lo <= x) & (x < hi)])]

    def changes(self) -> Changes:
        """The records changed since the last call, by host (see the module note); each is
        taken as sent."""
        out = Changes()
        cand = self._touched
        for v in self._gone:
            old = self.shipped.pop(v.vid, None)
            if old is not None:
                out.drops.setdefault(old.host, []).append(v.vid)
        for v in sorted(cand, key=lambda v: v.vid):  # every node whose record may have changed
            if self.by_vid.get(v.vid) is not v:
                continue
            old = self.shipped.get(v.vid)
            if old is not None and _same(v, old):
                continue
            rec = _record(self.attr, v)
            if old is not None and old.host != rec.host:
                out.drops.setdefault(old.host, []).append(v.vid)
            self.shipped[v.vid] = rec
            out.updates.setdefault(rec.host, []).append(rec)
        self._touched.clear()
        self._gone.clear()
        return out

    def settle(self) -> None:
        """Take every change as sent without listing it (a backup replaying operations)."""
        self._touched.clear()
        self._gone.clear()

    def resync(self) -> None:
        """Take the records as they are now as what the hosts hold (a backup taking over)."""
        self.settle()
        self.shipped = self.records()

    def records(self) -> dict[int, VRec]:
        """Every virtual node's record as it is now (what the hosts should hold)."""
        return {v.vid: _record(self.attr, v) for v in self.vnodes()}

    def hosts(self) -> list[int]:
        return sorted(self.hosted)

    def members(self) -> set[int]:
        """The real nodes subscribed to this attribute."""
        return set(self.member_subs)

    # -- subscriptions -------------------------------------------------------------

    def add(self, node: int, lo: Number, hi: Number) -> None:
        """Node ``node`` subscribes with ``lo <= attr < hi``: split at the bounds, then join
        the node list of every sub-range inside."""
        lo, hi = max(lo, self.lo), min(hi, self.hi)
        if not lo < hi:
            raise TopologyError(
                f"{self.attr}: the range [{lo}, {hi}) misses the values [{self.lo}, {self.hi})"
            )
        for b in (lo, hi):
            if self.lo < b < self.hi:
                n = self.bounds.get(b, 0)
                self.bounds[b] = n + 1
                if n == 0:
                    self._split(b, node)
        self.intervals[(node, lo, hi)] += 1
        self._index = None
        self.member_subs[node] = self.member_subs.get(node, 0) + 1
        self.subscriptions += 1

    def remove(self, node: int, lo: Number, hi: Number) -> None:
        """Undo :meth:`add` of the same range: leave the node lists, merge unused bounds."""
        lo, hi = max(lo, self.lo), min(hi, self.hi)
        key = (node, lo, hi)
        if self.intervals.get(key, 0) == 0:
            raise TopologyError(f"{self.attr}: node {node} has no subscription [{lo}, {hi})")
        self.intervals[key] -= 1
        if not self.intervals[key]:
            del self.intervals[key]
        self._index = None
        for b in (lo, hi):
            if self.lo < b < self.hi:
                n = self.bounds[b] - 1
                if n:
                    self.bounds[b] = n
                else:
                    del self.bounds[b]
                    self._merge(b)
        n = self.member_subs[node] - 1
        if n:
            self.member_subs[node] = n
        else:
            del self.member_subs[node]
        self.subscriptions -= 1

    def rehost(self, departed: int, choose: Any = None) -> list[VNode]:
        """Move the virtual nodes hosted by ``departed`` to ``choose(vnode)`` (a real node;
        default: the first other node of its node list, else the least other member);
        return them."""
        choose = choose or self._default_choice(departed)
        moved = self.vnodes_of(departed)
        self.hosted.pop(departed, None)
        for v in moved:
            v.host = choose(v)
            self.hosted.setdefault(v.host, set()).add(v.vid)
            self._touched.update(x for x in (v, v.parent, v.left, v.right) if x is not None)
        return moved

    def release(self, node: int) -> list[VNode]:
        """After ``node`` lost its last predicate here: move its virtual nodes to members."""
        if node in self.member_subs or node not in self.hosted or not self.member_subs:
            return []
        return self.rehost(node)

    def drop_node(self, node: int) -> int:
        """``node`` is gone: remove its predicates (merging the bounds no one else uses) and
        move its virtual nodes; return how many predicates went."""
        mine = [(k, n) for k, n in self.intervals.items() if k[0] == node]
        for (_, lo, hi), n in mine:
            for _ in range(n):
                self.remove(node, lo, hi)
        if self.member_subs:
            self.release(node)
        return sum(n for _, n in mine)

    def _default_choice(self, departed: int) -> Any:
        def choose(v: VNode) -> int:
            others = [n for n in self.node_list(v) if n != departed]
            if others:
                return others[0]
            return min(n for n in self.members() if n != departed)

        return choose

    # -- split and merge -------------------------------------------------------------

    def _split(self, at: Number, host: int) -> None:
        v = self.locate(at)
        if v.lo == at:
            return
        w = self._new(at, v.hi, host)
        v.hi = at
        self._touched.update((v, w))
        self.by_vid[w.vid] = w
        self.hosted.setdefault(host, set()).add(w.vid)
        self.root = self._insert(self.root, w)
        _set_parent(self.root, None, self._touched)

    def _merge(self, at: Number) -> None:
        w = self.locate(at)
        v = self.locate(math.nextafter(at, -math.inf))
        assert w.lo == at and v.hi == at, "merge of non-adjacent sub-ranges"
        self.root = self._delete(self.root, at)  # type: ignore[assignment]
        _set_parent(self.root, None, self._touched)
        v.hi = w.hi
        x: VNode | None = v
        while x is not None:
            _fix(x, self._touched)
            x = x.parent
        del self.by_vid[w.vid]
        self._gone.append(w)
        self._touched.discard(w)
        hosted = self.hosted[w.host]
        hosted.discard(w.vid)
        if not hosted:
            del self.hosted[w.host]

    # -- AVL -----------------------------------------------------------------------

    def _insert(self, t: VNode | None, w: VNode) -> VNode:
        if t is None:
            return w
        if w.lo < t.lo:
            t.left = self._insert(t.left, w)
            _set_parent(t.left, t, self._touched)
        else:
            t.right = self._insert(t.right, w)
            _set_parent(t.right, t, self._touched)
        return _balance(t, self._touched)

    def _delete(self, t: VNode | None, key: Number) -> VNode | None:
        assert t is not None, "deleting a missing virtual node"
        if key < t.lo:
            t.left = self._delete(t.left, key)
            if t.left is not None:
                _set_parent(t.left, t, self._touched)
        elif key > t.lo:
            t.right = self._delete(t.right, key)
            if t.right is not None:
                _set_parent(t.right, t, self._touched)
        else:
            if t.left is None or t.right is None:
                child = t.left if t.left is not None else t.right
                if child is not None:
                    _set_parent(child, t.parent, self._touched)
                return child
            # two children: the successor takes t's place in the tree
            s = t.right
            while s.left is not None:
                s = s.left
            right = self._delete_min(t.right)
            s.left, s.right = t.left, right
            _set_parent(s.left, s, self._touched)
            if right is not None:
                _set_parent(right, s, self._touched)
            _set_parent(s, t.parent, self._touched)
            t = s
        return _balance(t, self._touched)

    def _delete_min(self, t: VNode) -> VNode | None:
        if t.left is None:
            if t.right is not None:
                _set_parent(t.right, t.parent, self._touched)
            return t.right
        t.left = self._delete_min(t.left)
        if t.left is not None:
            _set_parent(t.left, t, self._touched)
        return _balance(t, self._touched)

    # -- checks ----------------------------------------------------------------------

    def check(self) -> None:
        """Assert every invariant: AVL balance and heights, spans, parents, a contiguous
        partition of the value range, bounds counted, hosting index (tests use it)."""
        prev_hi = self.lo
        count = 0
        for v in self.vnodes():
            count += 1
            if v.lo != prev_hi or not v.lo < v.hi:
                raise AssertionError(f"{self.attr}: gap or overlap at {v}")
            if v.lo != self.lo and v.lo not in self.bounds:
                raise AssertionError(f"{self.attr}: {v} starts at a bound no predicate uses")
            prev_hi = v.hi
            for c in (v.left, v.right):
                if c is not None and c.parent is not v:
                    raise AssertionError(f"{self.attr}: bad parent link under {v}")
            if abs(_h(v.left) - _h(v.right)) > 1 or v.height != 1 + max(_h(v.left), _h(v.right)):
                raise AssertionError(f"{self.attr}: unbalanced at {v}")
            lo = v.lo if v.left is None else v.left.span_lo
            hi = v.hi if v.right is None else v.right.span_hi
            if (v.span_lo, v.span_hi) != (lo, hi):
                raise AssertionError(f"{self.attr}: bad span at {v}")
            if v.vid not in self.hosted.get(v.host, ()):
                raise AssertionError(f"{self.attr}: {v} missing from its host's list")
        if prev_hi != self.hi or count != len(self.by_vid) or count != len(self.bounds) + 1:
            raise AssertionError(f"{self.attr}: {count} virtual nodes for {len(self.bounds)} bounds")
        if self.root.parent is not None:
            raise AssertionError(f"{self.attr}: the root has a parent")


def _rotate_right(t: VNode, touched: set[VNode]) -> VNode:
    s = t.left
    assert s is not None
    t.left = s.right
    if t.left is not None:
        _set_parent(t.left, t, touched)
    s.right = t
    _set_parent(s, t.parent, touched)
    _set_parent(t, s, touched)
    _fix(t, touched)
    _fix(s, touched)
    return s


def _rotate_left(t: VNode, touched: set[VNode]) -> VNode:
    s = t.right
    assert s is not None
    t.right = s.left
    if t.right is not None:
        _set_parent(t.right, t, touched)
    s.left = t
    _set_parent(s, t.parent, touched)
    _set_parent(t, s, touched)
    _fix(t, touched)
    _fix(s, touched)
    return s


def _balance(t: VNode, touched: set[VNode]) -> VNode:
    _fix(t, touched)
    b = _h(t.left) - _h(t.right)
    if b > 1:
        assert t.left is not None
        if _h(t.left.left) < _h(t.left.right):
            t.left = _rotate_left(t.left, touched)
        return _rotate_right(t, touched)
    if b < -1:
        assert t.right is not None
        if _h(t.right.right) < _h(t.right.left):
            t.right = _rotate_right(t.right, touched)
        return _rotate_left(t, touched)
    return t


# --------------------------------------------------------------------------- all topologies


class Topologies:
    """Every attribute topology of a network (attribute -> :class:`AttributeTree`), the
    attribute value range ``[lo, hi)`` they share, and the subscriptions they hold.

    Two uses. The maintenance protocol reads it as a directory: each attribute's tree (its
    coordinator's), whose ``coordinator`` and ``backup`` name where operations go, and whose
    predicates answer :meth:`node_list_at`; only the coordinator changes its tree. And
    :meth:`subscribe`, :meth:`unsubscribe`, :meth:`depart` apply subscriptions in one
    process, without messages: the reference the protocol's trees are checked against.
    """

    def __init__(self, lo: Number = 0.0, hi: Number = 1000.0) -> None:
        if not lo < hi:
            raise TopologyError(f"empty value range [{lo}, {hi})")
        self.lo = lo
        self.hi = hi
        self.trees: dict[str, AttributeTree] = {}
        self.subs: dict[tuple[int, Hashable], RangeSubscription] = {}

    def subscribe(self, sub: RangeSubscription) -> None:
        key = (sub.node, sub.sid)
        if key in self.subs:
            raise TopologyError(f"node {sub.node} already has a subscription {sub.sid!r}")
        for attr, lo, hi in sub.ranges:
            if not (max(lo, self.lo) < min(hi, self.hi)):
                raise TopologyError(f"subscription {sub.sid!r}: [{lo}, {hi}) misses the values of {attr!r}")
        for attr, lo, hi in sub.ranges:
            tree = self.trees.get(attr)
            if tree is None:
                tree = self.trees[attr] = AttributeTree(attr, self.lo, self.hi, first_host=sub.node)
            tree.add(sub.node, lo, hi)
        self.subs[key] = sub

    def unsubscribe(self, node: int, sid: Hashable, *, choose: Any = None) -> RangeSubscription:
        """Remove a subscription; a tree left without subscriptions is dropped, and the
        node's virtual nodes of a topology it no longer belongs to move to ``choose(vnode)``
        (default: a member of the virtual node, else the tree's first host)."""
        sub = self.subs.pop((node, sid), None)
        if sub is None:
            raise TopologyError(f"node {node} has no subscription {sid!r}")
        for attr, lo, hi in sub.ranges:
            tree = self.trees[attr]
            tree.remove(node, lo, hi)
            if tree.subscriptions == 0:
                del self.trees[attr]
            elif node not in tree.members() and node in tree.hosted:
                tree.rehost(node, choose)
        return sub

    def depart(self, node: int, *, choose: Any = None) -> list[RangeSubscription]:
        """Node ``node`` left: its subscriptions go, its virtual nodes move to live members."""
        gone = [s for (n, _), s in list(self.subs.items()) if n == node]
        for s in gone:
            self.unsubscribe(node, s.sid, choose=choose)
        for tree in self.trees.values():
            if node in tree.hosted:
                tree.rehost(node, choose)
        return gone

    def node_list_at(self, attr: str, x: Number) -> list[int]:
        """The real nodes with a predicate on ``attr`` holding ``x`` (none: no topology)."""
        tree = self.trees.get(attr)
        return [] if tree is None else tree.node_list_at(x)

    def hosted_attrs(self, node: int) -> tuple[str, ...]:
        """The attributes whose topology ``node`` hosts a virtual node of (what its
        peer-sampling descriptor advertises)."""
        return tuple(sorted(a for a, t in self.trees.items() if node in t.hosted))
