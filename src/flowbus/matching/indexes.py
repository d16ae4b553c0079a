"""Stage 1's indexes: per attribute, the predicates an event's value satisfies.

How it works (the 001 document's predicate matching, slides 30-33: a hash table on the
attribute name, then per attribute one structure per kind of operator, and tables for small
finite domains):

* Each attribute some predicate names has an entry (``_Attr``): a hash table from the
  constants its equality-like predicates name to *value codes* (one code space for all
  attributes), the :class:`~flowbus.matching.intervals.IntervalIndex` of its numeric
  ranges, and its :class:`~flowbus.matching.strings.StringPredicates`.
* ``=`` and ``in`` predicates are listed under the codes of the constants they accept, ``!=``
  and ``not in`` under the codes they refuse and under their attribute; an attribute's
  ``exists`` predicate has one cell of an array. These pools and arrays are what the compiled
  loops of :mod:`flowbus.matching.kernels` read, after :mod:`flowbus.matching.encode` has
  turned the events' values into codes.
* Numeric ranges are not predicates here. A conjunction's ranges on one attribute are merged
  into one closed interval of doubles (``> c`` becomes ``>= nextafter(c, inf)``, exact for
  doubles) by :meth:`PredicateIndexes.add_ranges`, the one place this happens for every way
  of adding subscriptions. Per event, the interval indexes clear the conjunctions whose
  interval misses the value from a bitset of live conjunctions.
* String order, ``prefix``, ``suffix``, ``contains`` and negated ranges are evaluated in
  Python, per event, once per distinct predicate (:meth:`PredicateIndexes.extras`).

The indexes know predicates by id and conjunctions by slot. Which subscription holds which
conjunction and predicate is the subscription table's business (:mod:`flowbus.matching.table`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from numba import njit

from flowbus.filters.ast import Op, Predicate
from flowbus.matching import kernels
from flowbus.matching._types import F64, I32, I64
from flowbus.matching.encode import ABSENT, encode_arrow, encode_mappings, table_key
from flowbus.matching.intervals import IntervalIndex
from flowbus.matching.pool import ListPool, PoolView
from flowbus.matching.strings import StringPredicates

CODE_OPS = frozenset({Op.EQ, Op.IN})
"""Equality-like operators: listed under the value codes they accept."""
_EXCLUDE_OPS = frozenset({Op.NE, Op.NOT_IN})
_INF = math.inf
_BOUNDS: dict[Op, Callable[[float], tuple[float, float]]] = {
    # the closed interval of doubles ``x OP c`` allows (exact: no double lies strictly between
    # c and nextafter(c))
    Op.GE: lambda c: (c, _INF),
    Op.GT: lambda c: (math.nextafter(c, _INF), _INF),
    Op.LE: lambda c: (-_INF, c),
    Op.LT: lambda c: (-_INF, math.nextafter(c, -_INF)),
}


def is_range(p: Predicate) -> bool:
    """Is ``p`` a numeric range literal (``< <= > >=`` on a number, not negated), which becomes
    part of an interval instead of a predicate?"""
    tv = type(p.value)
    return p.op in _BOUNDS and not p.negated and (tv is float or tv is int)


def range_bounds(p: Predicate) -> tuple[float, float]:
    """The closed interval of doubles the range literal ``p`` (see :func:`is_range`) allows."""
    return _BOUNDS[p.op](float(p.value))  # type: ignore[arg-type]


@njit(cache=True, nogil=True)
def _merge(
    slots: np.ndarray, aid: np.ndarray, bounds: np.ndarray, n_attrs: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Intersect the intervals ``bounds[i] = (lo, hi)`` of each run of equal ``(slots[i], aid[i])``.

    Returns the merged intervals ``(slot, attribute, lo, hi)`` sorted by attribute (each in input
    order), and the offsets of each attribute's run among them.
    """
    n = slots.size
    g_slot = np.empty(n, np.int32)
    g_aid = np.empty(n, np.int64)
    g_lo = np.empty(n, np.float64)
    g_hi = np.empty(n, np.float64)
    g = 0
    for i in range(n):
        if i == 0 or slots[i] != slots[i - 1] or aid[i] != aid[i - 1]:
            g_slot[g], g_aid[g], g_lo[g], g_hi[g] = slots[i], aid[i], bounds[i, 0], bounds[i, 1]
            g += 1
        else:
            g_lo[g - 1] = max(g_lo[g - 1], bounds[i, 0])
            g_hi[g - 1] = min(g_hi[g - 1], bounds[i, 1])
    cuts = np.zeros(n_attrs + 1, np.int64)
    for j in range(g):
        cuts[g_aid[j] + 1] += 1
    for a in range(n_attrs):
        cuts[a + 1] += cuts[a]
    fill = cuts[:-1].copy()
    o_slot = np.empty(g, np.int32)
    o_aid = np.empty(g, np.int64)
    o_lo = np.empty(g, np.float64)
    o_hi = np.empty(g, np.float64)
    for j in range(g):
        k = fill[g_aid[j]]
        fill[g_aid[j]] += 1
        o_slot[k], o_aid[k], o_lo[k], o_hi[k] = g_slot[j], g_aid[j], g_lo[j], g_hi[j]
    return o_slot, o_aid, o_lo, o_hi, cuts


@dataclass(slots=True)
class _Attr:
    """What the indexes know of one attribute (``index``: its column in the encoded events)."""

    name: str
    index: int
    table: dict[Any, int] = field(default_factory=lambda: {ABSENT: kernels.MISSING})
    typed: bool = False
    intervals: IntervalIndex | None = None
    strings: StringPredicates = field(default_factory=StringPredicates)


class PredicateIndexes:
    """Per attribute: value codes, the predicates each code satisfies or falsifies, intervals and
    string predicates; stage 1 of matching reads them (see the module's note).

    The interval indexes address as many conjunction slots as the subscription table has told
    :meth:`resize`.
    """

    def __init__(self) -> None:
        self._attrs: dict[str, _Attr] = {}
        self._attr_list: list[_Attr] = []
        self._slots = 0
        self._n_codes = 0
        self._exists = np.empty(0, I32)  # attribute -> its exists predicate, -1 for none
        self._code_pool = ListPool()  # value code -> equality-like predicates it satisfies
        self._excl_pool = ListPool()  # value code -> != / not in predicates it falsifies
        self._ne_pool = ListPool()  # attribute -> its != / not in predicates

    # ------------------------------------------------------------------ predicates

    def add(self, pid: int, p: Predicate) -> None:
        """Enter predicate ``p`` (positive form, not a range) under id ``pid``."""
        self._index(pid, p, insert=True)

    def remove(self, pid: int, p: Predicate) -> None:
        """Take predicate ``pid`` (entered as ``p``) out."""
        self._index(pid, p, insert=False)

    def _index(self, pid: int, p: Predicate, *, insert: bool) -> None:
        attr = self._attr(p.attr)
        values = p.value if isinstance(p.value, tuple) else (p.value,)
        if p.op in CODE_OPS or p.op in _EXCLUDE_OPS:
            pool = self._code_pool if p.op in CODE_OPS else self._excl_pool
            codes = np.asarray([self._code(attr, v) for v in values], I64)
            pids = np.full(codes.size, pid, I32)
            if insert:
                pool.extend(codes, pids)
            else:
                pool.remove(codes, pids)
            if p.op in _EXCLUDE_OPS:
                if insert:
                    self._ne_pool.append(attr.index, pid)
                else:
                    self._ne_pool.remove(np.array([attr.index]), np.array([pid]))
        elif p.op is Op.EXISTS:
            self._exists[attr.index] = pid if insert else -1
        elif insert:
            attr.strings.add(pid, p)
        else:
            attr.strings.remove(pid, p)

    def _attr(self, name: str) -> _Attr:
        attr = self._attrs.get(name)
        if attr is None:
            attr = _Attr(name, len(self._attr_list))
            self._attrs[name] = attr
            self._attr_list.append(attr)
            exists = np.full(len(self._attr_list), -1, I32)
            exists[: self._exists.size] = self._exists
            self._exists = exists
            self._ne_pool.ensure_keys(len(self._attr_list))
        return attr

    def _code(self, attr: _Attr, value: Any) -> int:
        key = table_key(value)
        code = attr.table.get(key)
        if code is None:
            code = self._n_codes
            self._n_codes += 1
            attr.table[key] = code
            attr.typed = attr.typed or type(value) is not str
            self._code_pool.ensure_keys(self._n_codes)
            self._excl_pool.ensure_keys(self._n_codes)
        return code

    # ------------------------------------------------------------------ intervals

    def add_ranges(
        self, slots: np.ndarray, which: np.ndarray, literals: Sequence[Predicate]
    ) -> tuple[np.ndarray, list[str]]:
        """Enter range literals (see :func:`is_range`): the ``i``-th is ``literals[which[i]]``, held
        by the conjunction in ``slots[i]``. A conjunction's literals are adjacent and sorted by
        attribute (as a :class:`~flowbus.filters.ast.Conjunction` keeps them); its literals on
        one attribute merge into one interval. Returns the slots and attributes of the merged
        intervals."""
        if which.size == 0:
            return slots[:0], []
        names = sorted({p.attr for p in literals})
        number = {name: i for i, name in enumerate(names)}
        aid = np.asarray([number[p.attr] for p in literals], I64)[which]
        flat = np.fromiter(chain.from_iterable(map(range_bounds, literals)), F64, 2 * len(literals))
        g_slot, g_aid, lo, hi, cuts = _merge(slots, aid, flat.reshape(-1, 2)[which], len(names))
        bounds = cuts.tolist()
        for i, name in enumerate(names):
            a, b = bounds[i], bounds[i + 1]
            if a < b:
                attr = self._attr(name)
                if attr.intervals is None:
                    attr.intervals = IntervalIndex(self._slots)
                attr.intervals.add(g_slot[a:b], lo[a:b], hi[a:b])
                attr.intervals.tune()
        return g_slot, [names[i] for i in g_aid.tolist()]

    def remove_ranges(self, slot: int, names: Iterable[str]) -> None:
        """Take the intervals of the conjunction in ``slot`` out of the attributes ``names``."""
        for name in names:
            iv = self._attrs[name].intervals
            assert iv is not None
            iv.remove(slot)

    def tune(self, names: Iterable[str]) -> None:
        """Let the interval indexes of ``names`` re-decide their layout (see ``IntervalIndex.tune``)."""
        for name in names:
            attr = self._attrs.get(name)
            if attr is not None and attr.intervals is not None:
                attr.intervals.tune()

    def resize(self, slots: int) -> None:
        """The subscription table now has ``slots`` conjunction slots."""
        if slots <= self._slots:
            return
        self._slots = slots
        for attr in self._attr_list:
            if attr.intervals is not None:
                attr.intervals.resize(slots)

    # ------------------------------------------------------------------ matching

    def has_intervals(self) -> bool:
        return any(a.intervals is not None and a.intervals.m > 0 for a in self._attr_list)

    def needs_rows(self) -> bool:
        """Are some predicates evaluated on the events as mappings (see :meth:`extras`)?"""
        return any(a.strings for a in self._attr_list)

    def encode(self, events: Any, *, arrow: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, vals)`` of a chunk of events (see :mod:`flowbus.matching.encode`)."""
        attrs = self._attr_list
        names, tables, typed = [a.name for a in attrs], [a.table for a in attrs], [a.typed for a in attrs]
        return (encode_arrow if arrow else encode_mappings)(events, names, tables, typed, self._ranged())

    def _ranged(self) -> list[bool]:
        return [a.intervals is not None and a.intervals.m > 0 for a in self._attr_list]

    def alive(self, active: np.ndarray, vals: np.ndarray) -> np.ndarray | None:
        """Per event, the bitset of live conjunctions ``active`` less those an interval clears;
        None when no attribute holds an interval."""
        ranged = self._ranged()
        if not any(ranged):
            return None
        alive = np.repeat(active[None, :], vals.shape[0], axis=0)
        for a, is_ranged in zip(self._attr_list, ranged, strict=True):
            if is_ranged:
                assert a.intervals is not None
                a.intervals.apply(np.ascontiguousarray(vals[:, a.index]), alive)
        return alive

    def extras(self, rows: Sequence[Mapping[str, Any]] | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Stage 1 for the predicates evaluated in Python: per event (CSR), the ids of those it satisfies."""
        ptr = np.zeros(n + 1, I64)
        indexes = [(a.name, a.strings) for a in self._attr_list if a.strings]
        if not indexes or rows is None:
            return ptr, np.empty(0, I32)
        ids: list[int] = []
        for e, row in enumerate(rows):
            for name, index in indexes:
                value = row.get(name, ABSENT)
                if value is not ABSENT:
                    index.satisfied(value, row, ids)
            ptr[e + 1] = len(ids)
        return ptr, np.asarray(ids, I32)

    def kernel_args(self) -> tuple[np.ndarray, PoolView, PoolView, PoolView]:
        """What the kernels' stage 1 reads: the exists array and the code, exclusion and ``!=`` pools."""
        return self._exists, self._code_pool.view(), self._excl_pool.view(), self._ne_pool.view()

    def nbytes(self) -> int:
        """Memory held (arrays exactly, the code tables estimated)."""
        total = int(self._exists.nbytes) + 100 * self._n_codes
        total += sum(p.nbytes() for p in (self._code_pool, self._excl_pool, self._ne_pool))
        return total + sum(a.intervals.nbytes() for a in self._attr_list if a.intervals is not None)
