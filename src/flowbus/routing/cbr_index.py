"""Indexes behind the content router (:mod:`flowbus.routing.cbr`): which filters may cover
which, and which filters an event matches, without trying every filter.

* :class:`CoverIndex` -- ``(origin, filter)`` entries, asked "which entries may cover ``g``"
  and "which entries may ``f`` cover". The answer is a *superset* of the true one (the
  caller decides each candidate with the exact test), narrowed by necessary conditions read
  from the attribute sets :mod:`flowbus.filters.covering` decides with. If ``f`` covers a
  satisfiable ``g`` then, attribute by attribute:

  - *points*: where ``f`` allows one value only (``symbol = "S1"``, ``x in {5}``, ``x >= 5 &
    x <= 5``), ``g`` allows that value only (its set is not empty and lies inside ``f``'s);
  - *hulls*: ``g``'s numbers lie within the hull of ``f``'s (no numbers: within any);
  - *strings*: when ``f`` allows finitely many strings, ``g``'s strings are among them.

  Entries with one satisfiable conjunction are rows; the others (several conjunctions, none,
  an unsatisfiable one) are always candidates. A row is filed under one of its points (or
  under none) and again under each of its points: the rows that may cover ``g`` are filed
  under one of ``g``'s points or none, those ``f`` may cover under each of ``f``'s points
  (the fewest rows are looked at). Per bucket, each condition is a test on arrays, a column
  per attribute: the hulls' ends as doubles (rounding keeps ``<=``), a code per point, a
  bitmask of strings (63 distinct strings per attribute get a bit; past that, a set is
  taken as all strings, never wrongly). A query filter with several conjunctions asks with
  what all its satisfiable ones have in common; one with none is covered by anything.
* :class:`Forwarded` -- the roots a router forwarded to one neighbour: a dict in insertion
  order (the protocol's message order comes from it), its :class:`CoverIndex`, and a journal
  of one update's changes, so the update's messages come from what changed, not from a copy.
* :class:`RouteIndex` -- the filters of one direction, for routing events: a
  :class:`~flowbus.matching.Matcher` (one ``match_batch`` per batch of events) from
  :data:`MATCHER_MIN` filters on (or :data:`BATCH_MIN` for a batch), compiled closures
  below. Each origin gets an int key, ascending in insertion order, so the matcher's sorted
  answers are in insertion order. Changes reach the matcher in bulk: a new or changed filter
  is tried as a closure, a gone one masked, until the closures' work pays for an update
  (:data:`FLUSH_WORK`, :data:`FLUSH_MIN`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from flowbus.errors import FilterError, SubscriptionError
from flowbus.filters.ast import Filter, Predicate, value_key
from flowbus.filters.covering import _attribute_sets, _Values
from flowbus.matching import Matcher
from flowbus.routing.memo import compiled

__all__ = [
    "BATCH_MIN",
    "FLUSH_MIN",
    "FLUSH_WORK",
    "MATCHER_MIN",
    "CoverIndex",
    "Forwarded",
    "RouteIndex",
    "Shape",
    "shape",
]

Origin = tuple[int, Hashable]
Entry = tuple[Origin, Filter]
Point = tuple[str, tuple[int, Any, str]]
"""``(attribute, value_key(value))``: an attribute held to one value."""

_INF = math.inf


# ------------------------------------------------------------------------- shapes

_COLUMNS: dict[str, int] = {}
"""Attribute -> column of the hull and point matrices, shared by every index (attribute names
are few: a schema's)."""
NO_POINT = -1
"""A row's point code on an attribute it does not hold to one value."""


def _column(attr: str) -> int:
    c = _COLUMNS.get(attr)
    if c is None:
        c = _COLUMNS[attr] = len(_COLUMNS)
    return c


def _float(x: float) -> float:
    """``x`` as a double, rounding monotonically (huge ints go to +-inf)."""
    try:
        return float(x)
    except OverflowError:
        return _INF if x > 0 else -_INF


def _point(v: _Values) -> tuple[int, Any, str] | None:
    """The ``value_key`` of the one value of ``v`` (string tests ignored), or None."""
    if v.missing or v.nan:
        return None
    nb, nn, ns = len(v.bools), len(v.nums), len(v.strs)
    if nb == 1 and nn == 0 and ns == 0:
        return value_key(next(iter(v.bools)))
    if nb == 0 and nn == 1 and ns == 0:
        lo, lc, hi, hc = v.nums[0]
        return value_key(lo) if lo == hi and lc and hc else None
    if nb == 0 and nn == 0 and ns == 1:
        lo_s, hi_s = v.strs[0]
        return value_key(lo_s) if hi_s == lo_s + "\0" else None
    return None


Hull = tuple[tuple[str, float, float], ...]
"""Per attribute: the hull of its numbers, ``(inf, -inf)`` when there are none; an attribute
not listed is unconstrained, ``(-inf, inf)``."""
Strings = tuple[tuple[str, tuple[str, ...] | None], ...]
"""Per attribute: its strings when they are finitely many, else None; an attribute not listed
is unconstrained (all strings)."""
_Conj = tuple[frozenset[Point], Hull, Strings, bool]


class Shape:
    """What the covering index reads from a filter (see the module note), with its hulls as
    vectors over the columns known when they were last asked for."""

    __slots__ = ("_vec", "hull", "points", "row", "single", "strings", "unsatisfiable")

    def __init__(self, conjs: list[_Conj]) -> None:
        sat = [c for c in conjs if c[3]]
        self.unsatisfiable = not sat
        """No satisfiable conjunction: covered by anything."""
        self.single = len(conjs) == 1
        """One conjunction: ``points``, ``hull`` and ``strings`` are its own."""
        self.row = self.single and not self.unsatisfiable
        """Kept as a row of the index (else an "other", always a candidate)."""
        self.points: frozenset[Point]
        self.hull: Hull
        self.strings: Strings | None = None
        """None: not known (several conjunctions)."""
        if self.single or len(sat) == 1:
            self.points, self.hull, self.strings, _ = sat[0] if sat else conjs[0]
        elif not sat:
            self.points, self.hull = frozenset(), ()
        else:  # what every satisfiable conjunction has: the common points, the union of the hulls
            self.points = frozenset.intersection(*(c[0] for c in sat))
            union: dict[str, tuple[float, float, int]] = {}
            for _, h, _, _ in sat:
                for a, lo, hi in h:
                    was = union.get(a)
                    union[a] = (lo, hi, 1) if was is None else (min(was[0], lo), max(was[1], hi), was[2] + 1)
            self.hull = tuple((a, lo, hi) for a, (lo, hi, k) in union.items() if k == len(sat))
        self._vec: tuple[np.ndarray, np.ndarray] | None = None

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """``hull`` over all columns (read only)."""
        v = self._vec
        cols = len(_COLUMNS)
        if v is None or v[0].size < cols or cols == 0:
            for a, _, _ in self.hull:
                _column(a)
            cols = max(len(_COLUMNS), 1)
            lo, hi = np.full(cols, -_INF), np.full(cols, _INF)
            for a, a_lo, a_hi in self.hull:
                c = _COLUMNS[a]
                lo[c], hi[c] = a_lo, a_hi
            v = self._vec = (lo, hi)
        return v


@lru_cache(maxsize=1 << 18)
def shape(f: Filter) -> Shape:
    conjs: list[_Conj] = []
    for c in f.disjuncts:
        sets, _ = _attribute_sets(c)
        points = []
        hull = []
        strings: list[tuple[str, tuple[str, ...] | None]] = []
        satisfiable = True
        for attr, v in sets.items():
            finite = all(hi == lo + "\0" for lo, hi in v.strs)  # (``hi`` None: not finite)
            strings.append((attr, tuple(lo for lo, _ in v.strs) if finite else None))
            if v.is_empty():
                satisfiable = False
            p = _point(v)
            if p is not None:
                points.append((attr, p))
            if v.nums:
                hull.append((attr, _float(v.nums[0][0]), _float(v.nums[-1][2])))
            else:
                hull.append((attr, _INF, -_INF))
        conjs.append((frozenset(points), tuple(hull), tuple(strings), satisfiable))
    return Shape(conjs)


# -------------------------------------------------------------------- covering index


_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
"""A string mask: all strings (or a set of strings too many to tell apart)."""
_NONE = np.uint64(0)
_UNKNOWN = 1 << 63
"""The bit of strings no entry's finite set holds (no finite set of an entry has it)."""
_BITS = 63
"""Strings per attribute that get a bit of their own (per index, first come)."""


class _Rows:
    """Rows of the index: origins, filters, and per column the hull's ends, the point's code
    and two masks of the row's strings: as a container (every string it may hold) and as a
    content (strings it surely holds, or all of them when they are not finitely many).
    Arrays are ``[column, row]``: a test per column runs along contiguous rows."""

    __slots__ = ("code", "cont", "filters", "hi", "inn", "lo", "n", "origins", "pos")

    def __init__(self) -> None:
        self.origins: list[Origin] = []
        self.filters: list[Filter] = []
        self.pos: dict[Origin, int] = {}
        self.n = 0
        cols = max(len(_COLUMNS), 1)
        self.lo = np.full((cols, 8), -_INF)
        self.hi = np.full((cols, 8), _INF)
        self.code = np.full((cols, 8), NO_POINT, np.int64)
        self.cont = np.full((cols, 8), _ALL, np.uint64)
        self.inn = np.full((cols, 8), _ALL, np.uint64)

    def _arrays(self) -> tuple[tuple[np.ndarray, Any], ...]:
        return (
            (self.lo, -_INF),
            (self.hi, _INF),
            (self.code, NO_POINT),
            (self.cont, _ALL),
            (self.inn, _ALL),
        )

    def _set_arrays(self, arrays: list[np.ndarray]) -> None:
        self.lo, self.hi, self.code, self.cont, self.inn = arrays

    def fit(self, cols: int) -> None:
        have, cap = self.lo.shape
        if have < cols:
            self._set_arrays(
                [np.vstack([a, np.full((cols - have, cap), empty, a.dtype)]) for a, empty in self._arrays()]
            )

    def add(self, o: Origin, f: Filter, *values: np.ndarray) -> None:
        """A row: ``lo, hi, code, cont, inn`` (one value per column)."""
        n = self.n
        if n == self.lo.shape[1]:
            self._set_arrays([np.hstack([a, np.full_like(a, empty)]) for a, empty in self._arrays()])
        for (a, _), v in zip(self._arrays(), values, strict=True):
            a[: v.size, n] = v
        self.origins.append(o)
        self.filters.append(f)
        self.pos[o] = n
        self.n = n + 1

    def remove(self, o: Origin) -> None:
        i = self.pos.pop(o)
        last = self.n - 1
        if i != last:
            moved = self.origins[last]
            self.origins[i] = moved
            self.filters[i] = self.filters[last]
            for a, _ in self._arrays():
                a[:, i] = a[:, last]
            self.pos[moved] = i
        self.origins.pop()
        self.filters.pop()
        for a, empty in self._arrays():
            a[:, last] = empty
        self.n = last

    def _entries(self, mask: Any) -> list[Entry]:
        origins, filters = self.origins, self.filters
        return [(origins[i], filters[i]) for i in np.flatnonzero(mask).tolist()]

    def holding(self, lo: np.ndarray, hi: np.ndarray, code: np.ndarray, inn: np.ndarray) -> list[Entry]:
        """The rows that may cover a filter with this hull, these point codes (``NO_POINT - 1``
        where it has none) and these strings (a content mask): the hull holds it, each point
        of the row is the filter's, the row may hold each string it surely holds."""
        n = self.n
        c = self.code[:, :n]
        mask = (
            (self.lo[:, :n] <= lo[:, None]).all(axis=0)
            & (self.hi[:, :n] >= hi[:, None]).all(axis=0)
            & ((c == NO_POINT) | (c == code[:, None])).all(axis=0)
            & ((inn[:, None] & ~self.cont[:, :n]) == 0).all(axis=0)
        )
        return self._entries(mask)

    def inside(self, lo: np.ndarray, hi: np.ndarray, code: np.ndarray, cont: np.ndarray) -> list[Entry]:
        """The rows a filter with this hull, these point codes (``NO_POINT`` where it has none)
        and these strings (a container mask) may cover: the hull lies inside it, each point of
        the filter is the row's, the filter may hold each string the row surely holds."""
        n = self.n
        mask = (
            (self.lo[:, :n] >= lo[:, None]).all(axis=0)
            & (self.hi[:, :n] <= hi[:, None]).all(axis=0)
            & ((self.inn[:, :n] & ~cont[:, None]) == 0).all(axis=0)
        )
        held = code != NO_POINT
        if held.any():
            mask &= (self.code[held, :n] == code[held][:, None]).all(axis=0)
        return self._entries(mask)


class CoverIndex:
    """``(origin, filter)`` entries, asked for covering candidates (see the module note).

    Each row is filed under one of its points (or none) and again under each of its points:
    the filters that may cover ``g`` have all their points among ``g``'s, so the one they are
    filed under too; those ``f`` may cover have all of ``f``'s points, so the one with the
    fewest rows. Unique by origin; a candidate list is in no useful order."""

    __slots__ = (
        "_bits",
        "_codes",
        "_entries",
        "_filed",
        "_first",
        "_having",
        "_next_code",
        "_others",
        "_points",
        "_uses",
    )

    SCAN_BELOW = 16
    """Below this many entries a query returns them all (cheaper than the arrays)."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self._entries: dict[Origin, Filter] = {}
        self._others: dict[Origin, Filter] = {}
        self._first: dict[Point | None, _Rows] = {}  # rows by one of their points (or none)
        self._filed: dict[Origin, Point | None] = {}  # ... which one
        self._having: dict[Point, _Rows] = {}  # rows by each of their points
        self._points: dict[Origin, frozenset[Point]] = {}
        self._codes: dict[Point, int] = {}  # point -> code, while a row holds it
        self._uses: dict[Point, int] = {}
        self._next_code = 0
        self._bits: dict[str, dict[str, int]] = {}  # attribute -> string -> its bit in masks
        for o, f in entries:
            self.add(o, f)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, o: object) -> bool:
        return o in self._entries

    def items(self) -> Iterable[Entry]:
        return self._entries.items()

    def _code_vector(self, points: Iterable[Point], absent: int) -> np.ndarray:
        code = np.full(max(len(_COLUMNS), 1), absent, np.int64)
        codes = self._codes
        for p in points:
            code[_column(p[0])] = codes.get(p, NO_POINT - 2)  # a point no row holds
        return code

    def _masks(self, strings: Strings | None, *, row: bool, inn: bool) -> np.ndarray:
        """Per column, a container mask (``inn`` False) or a content mask of ``strings``
        (None: not known, a mask that rules nothing out). A row's strings get bits while
        there are some left; a row's string without one makes its container mask all strings
        and is left out of its content mask. A query's string without a bit is in no row's
        finite set: ``_UNKNOWN`` in a content mask, left out of a container mask."""
        cols = max(len(_COLUMNS), 1)
        if strings is None:
            return np.full(cols, _NONE if inn else _ALL, np.uint64)
        out = np.full(cols, _ALL, np.uint64)  # not constrained: every string
        for attr, values in strings:
            if values is None:
                continue  # not finitely many: every string, either way
            bits = self._bits.get(attr)
            if bits is None:
                bits = self._bits[attr] = {}
            m = 0
            for v in values:
                b = bits.get(v)
                if b is None and row and len(bits) < _BITS:
                    b = bits[v] = len(bits)
                if b is not None:
                    m |= 1 << b
                elif row and not inn:
                    m = int(_ALL)
                    break
                elif not row and inn:
                    m |= _UNKNOWN
            out[_column(attr)] = m
        return out

    def add(self, o: Origin, f: Filter) -> None:
        if o in self._entries:
            self.remove(o)
        self._entries[o] = f
        s = shape(f)
        if not s.row:
            self._others[o] = f
            return
        points = s.points
        for p in points:
            if p not in self._codes:
                self._codes[p] = self._next_code
                self._next_code += 1
            self._uses[p] = self._uses.get(p, 0) + 1
        lo, hi = s.vectors()
        values = (
            lo,
            hi,
            self._code_vector(points, NO_POINT),
            self._masks(s.strings, row=True, inn=False),
            self._masks(s.strings, row=True, inn=True),
        )
        # filed under the point with the fewest rows so far (the most telling, as a rule)
        first = min(points, key=lambda p: self._first[p].n if p in self._first else 0) if points else None
        self._filed[o] = first
        tables = [self._first.get(first) or self._first.setdefault(first, _Rows())]
        tables += [self._having.get(p) or self._having.setdefault(p, _Rows()) for p in points]
        for rows in tables:
            rows.fit(lo.size)
            rows.add(o, f, *values)
        self._points[o] = points

    def remove(self, o: Origin) -> None:
        del self._entries[o]
        if self._others.pop(o, None) is not None:
            return
        points = self._points.pop(o)
        first = self._filed.pop(o)
        self._first[first].remove(o)
        if not self._first[first].n:
            del self._first[first]
        for p in points:
            self._having[p].remove(o)
            if not self._having[p].n:
                del self._having[p]
            left = self._uses[p] - 1
            if left:
                self._uses[p] = left
            else:
                del self._uses[p], self._codes[p]

    def covered_by(self, g: Filter) -> list[Entry]:
        """The entries that may cover ``g`` (every one that does, and maybe more)."""
        if len(self._entries) < self.SCAN_BELOW:
            return list(self._entries.items())
        s = shape(g)
        if s.unsatisfiable:
            return list(self._entries.items())  # covered by anything
        lo, hi = s.vectors()
        code = self._code_vector(s.points, NO_POINT - 1)
        inn = self._masks(s.strings, row=False, inn=True)
        out = list(self._others.items())
        for key in (None, *s.points):
            rows = self._first.get(key)
            if rows is not None:
                rows.fit(lo.size)
                out += rows.holding(lo, hi, code, inn)
        return out

    def covering(self, f: Filter) -> list[Entry]:
        """The entries ``f`` may cover (every one it does, and maybe more)."""
        if len(self._entries) < self.SCAN_BELOW:
            return list(self._entries.items())
        s = shape(f)
        if not s.single:
            return list(self._entries.items())
        lo, hi = s.vectors()
        code = self._code_vector(s.points, NO_POINT)
        cont = self._masks(s.strings, row=False, inn=False)
        if s.points:
            having = self._having
            if any(p not in having for p in s.points):
                tables: Iterable[_Rows] = ()
            else:
                tables = (min((having[p] for p in s.points), key=lambda r: r.n),)
        else:
            tables = self._first.values()
        out = list(self._others.items())
        for rows in tables:
            rows.fit(lo.size)
            out += rows.inside(lo, hi, code, cont)
        return out


# ---------------------------------------------------------------- forwarded roots


class Forwarded:
    """The roots forwarded to one neighbour (``map``, in the order they were added), indexed,
    with a journal: :meth:`changes` lists what :meth:`put` and :meth:`pop` did since the
    last call, as a copy taken before them would have shown."""

    __slots__ = ("_journal", "_next", "_pos", "index", "map")

    def __init__(self, roots: Mapping[Origin, Filter] | None = None) -> None:
        self.map: dict[Origin, Filter] = {}
        self.index = CoverIndex()
        self._pos: dict[Origin, int] = {}
        self._next = 0
        self._journal: dict[Origin, tuple[Filter | None, int]] = {}
        for o, f in (roots or {}).items():
            self.put(o, f)
        self._journal.clear()

    def __len__(self) -> int:
        return len(self.map)

    def __contains__(self, o: object) -> bool:
        return o in self.map

    def get(self, o: Origin) -> Filter | None:
        return self.map.get(o)

    def put(self, o: Origin, f: Filter) -> None:
        old = self.map.get(o)
        if o not in self._journal:
            self._journal[o] = (old, self._pos.get(o, -1))
        if old is None:
            self._pos[o] = self._next
            self._next += 1
        self.map[o] = f
        self.index.add(o, f)

    def pop(self, o: Origin) -> None:
        f = self.map.pop(o)
        if o not in self._journal:
            self._journal[o] = (f, self._pos[o])
        del self._pos[o]
        self.index.remove(o)

    def changes(self) -> tuple[tuple[Origin, ...], list[Entry]]:
        """``(gone, added)`` since the last call: the roots no longer here (in their old
        order), and those new or with another filter (in the current order)."""
        gone = [(p, o) for o, (old, p) in self._journal.items() if old is not None and o not in self.map]
        added = [
            (self._pos[o], o, f)
            for o, (old, _) in self._journal.items()
            if (f := self.map.get(o)) is not None and f != old
        ]
        self._journal.clear()
        gone.sort(key=lambda po: po[0])
        added.sort(key=lambda pof: pof[0])
        return tuple(o for _, o in gone), [(o, f) for _, o, f in added]


# -------------------------------------------------------------------- route index

MATCHER_MIN = 32
"""A direction with at least this many filters is matched by a :class:`Matcher` (one event
costs the matcher about as much as trying 30 closures)."""
BATCH_MIN = (8, 1024)
"""... and one with fewer but at least ``BATCH_MIN[0]``, for a batch of events when filters
times events reach ``BATCH_MIN[1]``."""
FLUSH_MIN = 64
"""The matcher takes the changes it lacks once they are more than this many, whatever the
load (or once the filters it masks are more than this many and an eighth of all)."""
FLUSH_WORK = (300, 8)
"""... and before that once the closure calls for new filters since its last update pass
``FLUSH_WORK[0] + FLUSH_WORK[1] * new filters``: about what an update costs it (a fixed part
and a part per filter, counted in closure calls)."""

Test = Callable[[Mapping[str, Any]], bool]


def _columnar(
    items: Sequence[tuple[int, Filter]],
) -> tuple[list[int], np.ndarray, np.ndarray, list[Predicate]] | None:
    """``items`` for :meth:`Matcher.add_conjunctions`, if each is one conjunction of plain predicates."""
    preds: dict[Predicate, int] = {}
    offsets = [0]
    codes: list[int] = []
    for _, f in items:
        if len(f.disjuncts) != 1:
            return None
        lits = f.disjuncts[0].literals
        if not lits:
            return None
        for lit in lits:
            if type(lit) is not Predicate or lit.negated:
                return None
            codes.append(preds.setdefault(lit, len(preds)))
        offsets.append(len(codes))
    return (
        [k for k, _ in items],
        np.asarray(offsets, np.int64),
        np.asarray(codes, np.int64),
        list(preds),
    )


class RouteIndex:
    """The filters of one direction by origin, asked which of them events match."""

    __slots__ = (
        "_filters",
        "_fresh",
        "_installed",
        "_key",
        "_matcher",
        "_next",
        "_origin",
        "_refused",
        "_stale",
        "_work",
    )

    def __init__(self) -> None:
        self._key: dict[Origin, int] = {}
        self._origin: dict[int, Origin] = {}
        self._filters: dict[int, Filter] = {}  # key -> filter, in key order
        self._next = 0
        self._matcher: Matcher | None = None
        self._installed: set[int] = set()  # keys in the matcher
        self._stale: set[int] = set()  # ... whose entry has gone or changed since
        self._fresh: dict[int, None] = {}  # live keys not (yet) in the matcher (compiled only
        # when an event is tried against them: a closure a subscription costs 4.7 KB, and most
        # reach the matcher before any event is, the whole of a bulk subscribe)
        self._refused: dict[int, Test] = {}  # keys the matcher cannot take (always closures)
        self._work = 0  # closure calls for _fresh since it was last emptied

    def __len__(self) -> int:
        return len(self._filters)

    @property
    def uses_matcher(self) -> bool:
        return self._matcher is not None

    def put(self, o: Origin, f: Filter) -> None:
        k = self._key.get(o)
        if k is None:
            k = self._key[o] = self._next
            self._next += 1
            self._origin[k] = o
        elif self._filters[k] == f:
            return
        elif k in self._installed:
            self._stale.add(k)
        self._filters[k] = f
        if self._matcher is not None:
            self._refused.pop(k, None)
            self._fresh[k] = None

    def remove(self, o: Origin) -> None:
        k = self._key.pop(o, None)
        if k is None:
            return
        del self._origin[k], self._filters[k]
        self._fresh.pop(k, None)
        self._refused.pop(k, None)
        if k in self._installed:
            self._stale.add(k)
        if not self._filters:
            self._matcher = None
            self._installed.clear()
            self._stale.clear()
            self._work = 0

    # -- the matcher, kept in step lazily

    def _sync(self, events: int) -> Matcher | None:
        """The matcher to match ``events`` events with, up to date; None: use closures."""
        n = len(self._filters)
        m = self._matcher
        wanted = n >= MATCHER_MIN or (n >= BATCH_MIN[0] and n * events >= BATCH_MIN[1])
        if m is None:
            if wanted:
                m = self._matcher = Matcher()
                self._install(m, list(self._filters.items()))
            return m
        if not wanted:
            return None
        fresh, stale = len(self._fresh), len(self._stale)
        if fresh or stale:
            self._work += fresh * events
            if (
                fresh + stale > FLUSH_MIN
                or stale > max(FLUSH_MIN, n // 8)
                or (fresh and self._work > FLUSH_WORK[0] + FLUSH_WORK[1] * fresh)
            ):
                self._flush(m)
        return m

    def prepare(self) -> None:
        """Bring the matcher up to date now (a quiet moment), as the next events would: they
        then do not wait for it to be built or to take the changes (answers are the same)."""
        if len(self._filters) < MATCHER_MIN:
            return
        m = self._matcher
        if m is None:
            m = self._matcher = Matcher()
            self._install(m, list(self._filters.items()))
        elif self._fresh or self._stale:
            self._flush(m)

    def _flush(self, m: Matcher) -> None:
        for k in self._stale:
            m.remove(k)
        self._installed -= self._stale
        self._stale.clear()
        fresh = [(k, self._filters[k]) for k in self._fresh]
        self._fresh.clear()
        self._work = 0
        self._install(m, fresh)

    def _install(self, m: Matcher, items: list[tuple[int, Filter]]) -> None:
        if not items:
            return
        try:
            cols = _columnar(items)
            if cols is None:
                m.add_many(items)
            else:
                m.add_conjunctions(*cols)
            self._installed.update(k for k, _ in items)
        except (FilterError, SubscriptionError):  # all or nothing: one by one, keep the refused
            for k, f in items:
                try:
                    m.add(k, f)
                    self._installed.add(k)
                except (FilterError, SubscriptionError):
                    self._refused[k] = compiled(f)

    def _keys(self, events: Sequence[Mapping[str, Any]]) -> list[list[int]]:
        """Per event, the keys of the matching filters, ascending."""
        m = self._sync(len(events))
        if m is None:
            tests = [(k, compiled(f)) for k, f in self._filters.items()]
            return [[k for k, t in tests if t(e)] for e in events]
        found = m.match_batch(events)
        stale = self._stale
        filters = self._filters
        extra = [*((k, compiled(filters[k])) for k in self._fresh), *self._refused.items()]
        out: list[list[int]] = []
        for e, ids in zip(events, found, strict=True):
            keys: list[int] = ids.tolist()
            if stale and keys:
                keys = [k for k in keys if k not in stale]
            if extra:
                more = [k for k, t in extra if t(e)]
                if more:
                    keys = sorted(keys + more)
            out.append(keys)
        return out

    def match(self, events: Sequence[Mapping[str, Any]]) -> list[list[Origin]]:
        """Per event, the origins of the filters it matches, in insertion order."""
        origin = self._origin
        return [[origin[k] for k in keys] if keys else [] for keys in self._keys(events)]

    def any_match(self, events: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Per event: does it match any filter?"""
        m = self._sync(len(events))
        if m is None:
            tests = [compiled(f) for f in self._filters.values()]
            return [any(t(e) for t in tests) for e in events]
        found = m.match_batch(events)
        stale = self._stale
        filters = self._filters
        extra = [*(compiled(filters[k]) for k in self._fresh), *self._refused.values()]
        out: list[bool] = []
        for e, ids in zip(events, found, strict=True):
            if ids.size and (not stale or any(k not in stale for k in ids.tolist())):
                out.append(True)
            else:
                out.append(any(t(e) for t in extra))
        return out
