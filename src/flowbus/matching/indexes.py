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
  into one closed interval of exact numbers (doubles with residuals for the ints past 2**53,
  :mod:`flowbus.matching.numbers`) by :meth:`PredicateIndexes.add_ranges`, the one place this
  happens for every way of adding subscriptions. Per event, the interval indexes clear the
  conjunctions whose interval misses the value from a bitset of live conjunctions.
* String order, ``prefix``, ``suffix``, ``contains``, negated ranges and ranges on an int
  beyond int64 that is not a double are evaluated in Python, per event, once per distinct
  predicate (:meth:`PredicateIndexes.extras`).

The indexes know predicates by id and conjunctions by slot. Which subscription holds which
conjunction and predicate is the subscription table's business (:mod:`flowbus.matching.table`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from numba import njit

from flowbus.filters.ast import Op, Predicate
from flowbus.filters.values import canonical
from flowbus.matching import kernels
from flowbus.matching._types import F64, I32, I64
from flowbus.matching.encode import encode_arrow, encode_mappings, table_key
from flowbus.matching.intervals import IntervalIndex
from flowbus.matching.numbers import range_bounds
from flowbus.matching.pool import ListPool, PoolView
from flowbus.matching.strings import StringPredicates

CODE_OPS = frozenset({Op.EQ, Op.IN})
"""Equality-like operators: listed under the value codes they accept."""
_EXCLUDE_OPS = frozenset({Op.NE, Op.NOT_IN})


@njit(cache=True, nogil=True, inline="always")
def _higher_lower(lo: float, lo_r: float, lo2: float, lo_r2: float) -> bool:
    """Is the lower bound ``(lo, lo_r)`` above ``(lo2, lo_r2)``? (A residual sits below its ``lo``.)"""
    if lo != lo2:
        return lo > lo2
    return lo_r2 > 0 and (lo_r == 0 or lo_r > lo_r2)


@njit(cache=True, nogil=True)
def _merge(
    slots: np.ndarray, aid: np.ndarray, bounds: np.ndarray, which: np.ndarray, n_attrs: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Intersect the intervals ``bounds[which[i]] = (lo, lo_r, hi, hi_r)`` (see
    :mod:`flowbus.matching.numbers`) of each run of equal ``(slots[i], aid[i])``.

    Returns the merged intervals' slots, attributes, ``(lo, hi)`` and ``(lo_r, hi_r)``, sorted by
    attribute (each in input order), and the offsets of each attribute's run among them.
    """
    n = slots.size
    g_slot = np.empty(n, np.int32)
    g_aid = np.empty(n, np.int64)
    g = np.empty((n, 4), np.float64)
    k = 0
    for i in range(n):
        lo, lo_r, hi, hi_r = bounds[which[i]]
        if i == 0 or slots[i] != slots[i - 1] or aid[i] != aid[i - 1]:
            g_slot[k], g_aid[k] = slots[i], aid[i]
            g[k, 0], g[k, 1], g[k, 2], g[k, 3] = lo, lo_r, hi, hi_r
            k += 1
            continue
        if _higher_lower(lo, lo_r, g[k - 1, 0], g[k - 1, 1]):
            g[k - 1, 0], g[k - 1, 1] = lo, lo_r
        if hi < g[k - 1, 2] or (hi == g[k - 1, 2] and hi_r < g[k - 1, 3]):
            g[k - 1, 2], g[k - 1, 3] = hi, hi_r
    cuts = np.zeros(n_attrs + 1, np.int64)
    for j in range(k):
        cuts[g_aid[j] + 1] += 1
    for a in range(n_attrs):
        cuts[a + 1] += cuts[a]
    fill = cuts[:-1].copy()
    o_slot = np.empty(k, np.int32)
    o_aid = np.empty(k, np.int64)
    o_b = np.empty((k, 2), np.float64)
    o_r = np.empty((k, 2), np.int16)
    for j in range(k):
        at = fill[g_aid[j]]
        fill[g_aid[j]] += 1
        o_slot[at], o_aid[at] = g_slot[j], g_aid[j]
        o_b[at, 0], o_r[at, 0], o_b[at, 1], o_r[at, 1] = g[j, 0], g[j, 1], g[j, 2], g[j, 3]
    return o_slot, o_aid, o_b, o_r, cuts


@dataclass(frozen=True, slots=True)
class _Shape:
    """What every match asks of the attributes, worked out once per change of the predicates."""

    names: list[str]
    tables: list[dict[Any, int]]
    typed: list[bool]
    ranged: list[bool]  # carries intervals
    has_intervals: bool
    needs_rows: bool  # some string predicates are evaluated on the rows


@dataclass(slots=True)
class _Attr:
    """What the indexes know of one attribute (``index``: its column in the encoded events)."""

    name: str
    index: int
    table: dict[Any, int] = field(default_factory=lambda: {None: kernels.MISSING})
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
        self._shape: _Shape | None = None  # what each match asks of the attributes (None: to work out)

    # ------------------------------------------------------------------ predicates

    def add(self, pid: int, p: Predicate) -> None:
        """Enter predicate ``p`` (positive form, not a range) under id ``pid``."""
        self._index(pid, p, insert=True)

    def remove(self, pid: int, p: Predicate) -> None:
        """Take predicate ``pid`` (entered as ``p``) out."""
        self._index(pid, p, insert=False)

    def _index(self, pid: int, p: Predicate, *, insert: bool) -> None:
        self._shape = None
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
        """Enter range literals (see :func:`~flowbus.matching.numbers.is_range`): the ``i``-th is
        ``literals[which[i]]``, held by the conjunction in ``slots[i]``. A conjunction's literals
        are adjacent and sorted by attribute (as a :class:`~flowbus.filters.ast.Conjunction` keeps
        them); its literals on one attribute merge into one interval. Returns the slots and
        attributes of the merged intervals."""
        if which.size == 0:
            return slots[:0], []
        self._shape = None
        names = sorted({p.attr for p in literals})
        number = {name: i for i, name in enumerate(names)}
        aid = np.asarray([number[p.attr] for p in literals], I64)[which]
        flat = np.fromiter(chain.from_iterable(map(range_bounds, literals)), F64, 4 * len(literals))
        g_slot, g_aid, b, r, cuts = _merge(slots, aid, flat.reshape(-1, 4), which, len(names))
        residuals = bool(r.any())
        offsets = cuts.tolist()
        for i, name in enumerate(names):
            a, z = offsets[i], offsets[i + 1]
            if a < z:
                attr = self._attr(name)
                if attr.intervals is None:
                    attr.intervals = IntervalIndex(self._slots)
                some = residuals and bool(r[a:z].any())
                attr.intervals.add(g_slot[a:z], b[a:z], r[a:z] if some else None)
                attr.intervals.tune()
        return g_slot, [names[i] for i in g_aid.tolist()]

    def remove_ranges(self, slot: int, names: Iterable[str]) -> None:
        """Take the intervals of the conjunction in ``slot`` out of the attributes ``names``."""
        self._shape = None
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

    def _now(self) -> _Shape:
        shape = self._shape
        if shape is None:
            attrs = self._attr_list
            ranged = [a.intervals is not None and a.intervals.m > 0 for a in attrs]
            shape = self._shape = _Shape(
                names=[a.name for a in attrs],
                tables=[a.table for a in attrs],
                typed=[a.typed for a in attrs],
                ranged=ranged,
                has_intervals=any(ranged),
                needs_rows=any(a.strings for a in attrs),
            )
        return shape

    def has_intervals(self) -> bool:
        return self._now().has_intervals

    def needs_rows(self) -> bool:
        """Are some predicates evaluated on the events as mappings (see :meth:`extras`)?"""
        return self._now().needs_rows

    def encode(self, events: Any, *, arrow: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(codes, vals, res)`` of a chunk of events (see :mod:`flowbus.matching.encode`)."""
        sh = self._now()
        return (encode_arrow if arrow else encode_mappings)(events, sh.names, sh.tables, sh.typed, sh.ranged)

    def _ranged(self) -> list[bool]:
        return self._now().ranged

    def alive(self, active: np.ndarray, vals: np.ndarray, res: np.ndarray | None) -> np.ndarray | None:
        """Per event, the bitset of live conjunctions ``active`` less those an interval clears (the
        values are ``(vals, res)``, ``res`` None when all residuals are 0); None when no attribute
        holds an interval."""
        ranged = self._ranged()
        if not any(ranged):
            return None
        alive = np.repeat(active[None, :], vals.shape[0], axis=0)
        for a, is_ranged in zip(self._attr_list, ranged, strict=True):
            if is_ranged:
                assert a.intervals is not None
                column = None if res is None else np.ascontiguousarray(res[:, a.index])
                a.intervals.apply(np.ascontiguousarray(vals[:, a.index]), column, alive)
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
                value = row.get(name)
                if value is not None:
                    index.satisfied(canonical(value), row, ids)
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
