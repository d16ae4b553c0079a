"""The subscription matcher: many filters, one event, all the filters it satisfies.

How it works (the 001 document's two-stage matching):

1. Each subscription's filter is a disjunction of conjunctions; every
   conjunction gets a *slot*. Its literals are sorted into

   * predicates, shared between conjunctions through an id (the document's
     predicate vector): equality-like ones (``=``, ``in``, ``!=``, ``not in``,
     ``exists``) are indexed by a hash table on the attribute's constants;
     the rest (string order, ``prefix``, ``suffix``, ``contains``, negated
     ranges) are evaluated per event, once per distinct predicate;
   * numeric ranges, merged per attribute into one closed interval per
     conjunction and kept in an :class:`~flowbus.matching.intervals.IntervalIndex`
     (sorted buckets and bitsets, see there);
   * expression predicates (``price*vol >= 1000000``), evaluated last and only
     for conjunctions whose other literals all hold.

2. Subscription matching by counting or by clustering (``strategy=``), in the
   compiled loops of :mod:`flowbus.matching.kernels`.

Every change is incremental: adding or removing a subscription touches only
the lists of its own predicates (amortised O(1) each), never the whole index.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa
from numba import njit

from flowbus.errors import FilterError, FlowbusError, SubscriptionError
from flowbus.filters.ast import Conjunction, ExprPredicate, Filter, Functions, Op, Predicate
from flowbus.filters.parser import parse
from flowbus.matching import kernels
from flowbus.matching._types import F64, I32, I64, U64
from flowbus.matching.encode import ABSENT, encode_arrow, encode_mappings, table_key
from flowbus.matching.intervals import IntervalIndex
from flowbus.matching.pool import ListPool
from flowbus.matching.strings import StringPredicates

Strategy = Literal["counting", "clustering"]
SubId = int | str
EventBatch: TypeAlias = "Sequence[Mapping[str, Any]] | pa.Table | pa.RecordBatch"

_CODE_OPS = frozenset({Op.EQ, Op.IN})
_EXCLUDE_OPS = frozenset({Op.NE, Op.NOT_IN})
_RANGE_OPS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})
_PARALLEL_MIN = 2048
"""Events per thread below which a batch is matched on the calling thread."""
_ALIVE_BYTES = 8 << 20
"""Upper bound on the per-batch bitsets of live conjunctions; larger batches are cut in chunks."""


@dataclass(frozen=True, slots=True)
class _Scratch:
    """The per-event marks a matching pass writes (one set per thread)."""

    counts: np.ndarray
    pmark: np.ndarray
    xmark: np.ndarray


@dataclass(slots=True)
class _Attr:
    """What the index knows of one attribute."""

    name: str
    index: int
    table: dict[Any, int] = field(default_factory=lambda: {ABSENT: kernels.MISSING})
    typed: bool = False
    intervals: IntervalIndex | None = None
    strings: StringPredicates = field(default_factory=StringPredicates)


@dataclass(frozen=True, slots=True)
class _Plan:
    """One conjunction, sorted into what each structure needs (computed before any change)."""

    preds: tuple[tuple[Predicate, bool], ...]
    intervals: tuple[tuple[str, float, float], ...]
    exprs: tuple[ExprPredicate, ...]


_INF = math.inf


def _plan(conj_literals: Iterable[Predicate | ExprPredicate]) -> _Plan:
    """Sort a conjunction's literals: numeric ranges merge into one closed interval per attribute
    (``> c`` becomes ``>= nextafter(c, inf)``, exact for doubles)."""
    preds: list[tuple[Predicate, bool]] = []
    bounds: dict[str, list[float]] = {}
    exprs: list[ExprPredicate] = []
    for lit in conj_literals:
        if isinstance(lit, ExprPredicate):
            exprs.append(lit)
            continue
        op = lit.op
        tv = type(lit.value)
        if lit.negated or op not in _RANGE_OPS or not (tv is float or tv is int):
            preds.append((Predicate(lit.attr, op, lit.value) if lit.negated else lit, lit.negated))
            continue
        c = float(lit.value)  # type: ignore[arg-type]
        b = bounds.get(lit.attr)
        if b is None:
            b = bounds[lit.attr] = [-_INF, _INF]
        if op is Op.GE:
            b[0] = max(b[0], c)
        elif op is Op.GT:
            b[0] = max(b[0], math.nextafter(c, _INF))
        elif op is Op.LE:
            b[1] = min(b[1], c)
        else:
            b[1] = min(b[1], math.nextafter(c, -_INF))
    intervals = tuple([(a, b[0], b[1]) for a, b in bounds.items()])
    return _Plan(tuple(preds), intervals, tuple(exprs))


@njit(cache=True, nogil=True)
def _cluster_records(
    offsets: np.ndarray, pids: np.ndarray, code_like: np.ndarray, csize: np.ndarray, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clustering's access predicate of each conjunction ``i`` (predicates ``pids[offsets[i]:offsets[i+1]]``,
    in literal order), chosen one after the other as :meth:`Matcher._install_plan` does (equality-like
    first, then the smallest cluster so far, then the first); ``csize`` is updated. Returns the access
    predicates (-1 for none) and the ``(key, value)`` pairs of the records ``[slot, k, other + 1 ...]``."""
    n = offsets.size - 1
    access = np.full(n, -1, np.int64)
    keys = np.empty(pids.size + n, np.int64)
    values = np.empty(pids.size + n, np.int32)
    pos = 0
    for i in range(n):
        a, b = offsets[i], offsets[i + 1]
        if a == b:
            continue
        best = a
        best_cost = (0 if code_like[pids[a]] else 1, csize[pids[a]])
        for j in range(a + 1, b):
            cost = (0 if code_like[pids[j]] else 1, csize[pids[j]])
            if cost < best_cost:
                best, best_cost = j, cost
        chosen = pids[best]
        csize[chosen] += 1
        access[i] = chosen
        size = b - a + 1
        keys[pos : pos + size] = chosen
        values[pos] = slots[i]
        values[pos + 1] = b - a - 1
        q = pos + 2
        for j in range(a, b):
            if j != best:
                values[q] = pids[j] + 1
                q += 1
        pos += size
    return access, keys[:pos], values[:pos]


def _consecutive(a: np.ndarray) -> bool:
    """Is ``a`` the integers ``a[0], a[0] + 1, ...`` in that order?"""
    return bool(a.size == 0 or (a[-1] - a[0] == a.size - 1 and (np.diff(a) == 1).all()))


class Matcher:
    """Match events against many subscriptions.

    >>> m = Matcher()
    >>> m.add("s1", 'issue = "IBM" & price > 100')
    >>> m.match({"issue": "IBM", "price": 120.0})
    ['s1']

    ``strategy`` picks the subscription-matching algorithm of the 001 document:
    ``"counting"`` (default) or ``"clustering"`` (access predicates). Both return
    the same answers. ``functions`` resolves the named functions and lookup
    tables of expression predicates. A batch of at least ``2 * 2048`` events is
    split across ``workers`` threads (default: one per core; the compiled stages
    release the GIL).

    A matcher is not safe for concurrent use: call it from one thread at a time.
    """

    def __init__(
        self,
        *,
        strategy: Strategy = "counting",
        functions: Functions | None = None,
        workers: int | None = None,
    ) -> None:
        if strategy not in ("counting", "clustering"):
            raise FlowbusError(f"unknown matching strategy {strategy!r} (expected counting or clustering)")
        if workers is not None and workers < 1:
            raise FlowbusError(f"workers must be at least 1, got {workers}")
        self.strategy: Strategy = strategy
        self.functions: Functions = dict(functions or {})
        self.workers = workers or os.cpu_count() or 1
        self._executor: ThreadPoolExecutor | None = None
        self._epoch = 0
        self._counts_cleared = 0
        # subscriptions
        self._subs: dict[SubId, int] = {}
        self._sub_ids: list[SubId | None] = []
        self._sub_slots: list[tuple[int, ...]] = []
        self._free_subs: list[int] = []
        self._id_table: np.ndarray = np.zeros(64, I64)  # subscription index -> id
        self._multi = 0
        # conjunction slots
        self._slots = 0
        self._high = 0
        self._free_slots: list[int] = []
        self._conj_sub = np.empty(0, I32)
        self._req = np.empty(0, I32)
        self._counts = np.empty(0, np.uint32)  # packed epoch | required | count, see kernels.count_match
        self._has_expr = np.empty(0, np.bool_)
        self._active = np.empty(0, U64)
        self._zero_bits = np.empty(0, U64)
        self._zero_list = np.empty(0, I32)
        self._zero_pos = np.empty(0, I32)
        self._zero_n = 0
        self._records: list[tuple[tuple[int, ...], tuple[str, ...], int] | None] = []
        self._exprs: dict[int, tuple[ExprPredicate, ...]] = {}
        # attributes and predicates
        self._attrs: dict[str, _Attr] = {}
        self._attr_list: list[_Attr] = []
        self._exists = np.empty(0, I32)
        self._n_codes = 0
        self._pred_ids: dict[Predicate, int] = {}
        self._preds: list[Predicate | None] = []
        self._pred_ref = np.empty(0, I64)
        self._csize = np.empty(0, I64)  # cluster size per access predicate
        self._free_preds: list[int] = []
        self._pmark = np.empty(0, I64)
        self._xmark = np.empty(0, I64)
        self._code_pool = ListPool()  # value code -> equality-like predicates it satisfies
        self._excl_pool = ListPool()  # value code -> != / not in predicates it falsifies
        self._ne_pool = ListPool()  # attribute -> its != / not in predicates
        self._pos_pool = ListPool()  # predicate -> conjunctions holding it (counting)
        self._neg_pool = ListPool()  # predicate -> conjunctions holding its negation
        self._cluster_pool = (
            ListPool()
        )  # access predicate -> records [slot, k, other predicates] (clustering)
        self._grow_slots(64)

    # ------------------------------------------------------------------ public API

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._subs

    def add(self, sub_id: SubId, filter: Filter | str | Sequence[Any], /) -> None:
        """Add a subscription; ``filter`` is a :class:`Filter`, text or triples.

        Raises :class:`SubscriptionError` if ``sub_id`` is taken and
        :class:`~flowbus.errors.FilterError` for a filter it cannot use; either way
        nothing changes.
        """
        self.add_many([(sub_id, filter)])

    def add_many(self, items: Iterable[tuple[SubId, Filter | str | Sequence[Any]]]) -> None:
        """Add many subscriptions in one go (same checks as :meth:`add`, all before any change)."""
        batch: list[tuple[SubId, tuple[_Plan, ...]]] = []
        seen: set[SubId] = set()
        for sub_id, flt in items:
            if type(sub_id) not in (int, str):
                raise SubscriptionError(f"subscription id {sub_id!r} must be an int or a str")
            if sub_id in self._subs or sub_id in seen:
                raise SubscriptionError(f"subscription {sub_id!r} exists already")
            seen.add(sub_id)
            f = flt if isinstance(flt, Filter) else parse(flt)
            plans = tuple(_plan(c.literals) for c in f.disjuncts)
            calls = {name for p in plans for x in p.exprs for name in x.calls()}
            missing = calls - set(self.functions)
            if missing:
                raise FilterError(
                    f"subscription {sub_id!r} calls unknown function(s) {', '.join(sorted(missing))}"
                )
            if any(sum(1 for _, neg in p.preds if not neg) > kernels.MAX_REQUIRED for p in plans):
                raise FilterError(
                    f"subscription {sub_id!r}: a conjunction holds more than "
                    f"{kernels.MAX_REQUIRED} predicates"
                )
            batch.append((sub_id, plans))
        self._install(batch)

    def add_conjunctions(
        self,
        sub_ids: Sequence[SubId] | np.ndarray,
        offsets: np.ndarray,
        codes: np.ndarray,
        predicates: Sequence[Predicate],
    ) -> None:
        """Add many one-conjunction subscriptions given in columnar form, with array operations.

        Subscription ``sub_ids[i]``'s filter is the conjunction of the predicates
        ``predicates[k]`` for ``k`` in ``codes[offsets[i]:offsets[i + 1]]``: the same
        as :meth:`add_many` of ``Filter((Conjunction(...),))`` for each, with the
        same checks (all before any change) and the same answers afterwards, but
        without a :class:`Filter` or a plan per subscription (a million W1
        subscriptions take 1.5 s instead of 13). Filters with negated or
        expression literals take the :meth:`add_many` path.
        """
        n = len(sub_ids)
        offsets = np.asarray(offsets, I64)
        codes = np.asarray(codes, I64)
        if offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != codes.size:
            raise FlowbusError(f"add_conjunctions: {n} subscriptions need {n + 1} offsets, 0 to len(codes)")
        lengths = np.diff(offsets)
        if (lengths < 0).any() or (codes.size and (codes.min() < 0 or codes.max() >= len(predicates))):
            raise FlowbusError("add_conjunctions: offsets must not decrease and codes must index predicates")
        if n == 0:
            return
        if any(type(p) is not Predicate or p.negated for p in predicates):
            preds, bounds, flat = list(predicates), offsets.tolist(), codes.tolist()
            self.add_many(
                (sid, Filter((Conjunction(tuple(preds[k] for k in flat[bounds[i] : bounds[i + 1]])),)))
                for i, sid in enumerate(sub_ids)
            )
            return
        # the distinct predicates (equal ones merged, as a Conjunction does), numbered in literal order
        canon: dict[Predicate, int] = {}
        first = np.asarray([canon.setdefault(p, len(canon)) for p in predicates], I64)
        distinct = list(canon)
        order = sorted(range(len(distinct)), key=lambda k: distinct[k].sort_key())
        ranked = [distinct[k] for k in order]
        rank_of = np.empty(len(distinct), I64)
        rank_of[order] = np.arange(len(distinct), dtype=I64)
        width = max(1, len(ranked))
        row = np.repeat(np.arange(n, dtype=I64), lengths)
        rank = rank_of[first][codes]
        key = row * width + rank
        if key.size > 1 and not (key[1:] > key[:-1]).all():
            key = np.unique(key)  # each conjunction's literals sorted, without repeats
            row, rank = key // width, key % width
            lengths = np.bincount(row, minlength=n)
        # numeric ranges become one closed interval per conjunction and attribute (see _plan)
        ranged = np.zeros(width, np.bool_)
        lo_of = np.full(width, -_INF, F64)
        hi_of = np.full(width, _INF, F64)
        for k, p in enumerate(ranked):
            tv = type(p.value)
            if p.op in _RANGE_OPS and (tv is int or tv is float):
                c = float(p.value)  # type: ignore[arg-type]
                ranged[k] = True
                if p.op is Op.GE:
                    lo_of[k] = c
                elif p.op is Op.GT:
                    lo_of[k] = math.nextafter(c, _INF)
                elif p.op is Op.LE:
                    hi_of[k] = c
                else:
                    hi_of[k] = math.nextafter(c, -_INF)
        if ranged.any():
            is_range = ranged[rank]
            p_row, p_rank = row[~is_range], rank[~is_range]
            r_row, r_rank = row[is_range], rank[is_range]
            required = np.bincount(p_row, minlength=n)
        else:
            p_row, p_rank, r_row, r_rank, required = row, rank, row[:0], rank[:0], lengths
        ids = sub_ids.tolist() if isinstance(sub_ids, np.ndarray) else list(sub_ids)
        types = self._check_bulk(ids, np.flatnonzero(required > kernels.MAX_REQUIRED))
        id_array: np.ndarray | None = None
        if self._id_table.dtype != object and types <= {int}:
            id_array = np.asarray(ids, I64)  # an int beyond int64 fails here, before any change
        # -- every check passed: install
        s_arr = self._take_subs(n)
        slots = self._take_slots(n)
        s_list, slot_list = s_arr.tolist(), slots.tolist()
        self._subs.update(zip(ids, s_list, strict=True))
        lo = s_list[0]
        if len(self._sub_ids) == lo + n and _consecutive(s_arr):  # all new indexes
            self._sub_ids[lo:] = ids
            self._sub_slots[lo:] = zip(slot_list)
        else:
            for s, sid, slot in zip(s_list, ids, slot_list, strict=True):
                self._sub_ids[s] = sid
                self._sub_slots[s] = (slot,)
        self._set_ids(s_arr, ids if id_array is None else id_array)
        uses = np.bincount(p_rank, minlength=width)
        pid_of = np.full(width, -1, I64)
        for k in np.flatnonzero(uses).tolist():
            pid = self._intern(ranked[k])
            self._pred_ref[pid] += int(uses[k]) - 1
            pid_of[k] = pid
        pids = pid_of[p_rank]
        access = np.full(n, -1, I64)
        if self.strategy == "counting":
            self._pos_pool.extend(pids, slots[p_row].astype(I32))
        else:
            code_like = np.zeros(self._csize.size, np.bool_)
            code_like[pids] = np.asarray([p.op in _CODE_OPS for p in ranked], np.bool_)[p_rank]
            p_offsets = np.concatenate([[0], np.cumsum(required)]).astype(I64)
            access, keys, values = _cluster_records(p_offsets, pids, code_like, self._csize, slots)
            self._cluster_pool.extend(keys, values)
        self._activate(slots, s_arr, required)
        names = self._install_ranges(slots, r_row, r_rank, ranked, lo_of, hi_of)
        self._bulk_records(slots, p_row, pids, required, r_row, r_rank, ranked, access)
        self._tune(names)

    def _check_bulk(self, ids: list[SubId], too_many: np.ndarray) -> set[type]:
        """The checks of :meth:`add_many` for :meth:`add_conjunctions`, the first failing one raised;
        returns the types of the ids."""
        types = set(map(type, ids))
        if (
            types <= {int, str}
            and len(set(ids)) == len(ids)
            and self._subs.keys().isdisjoint(ids)
            and too_many.size == 0
        ):
            return types
        bad = set(too_many.tolist())
        seen: set[SubId] = set()
        for i, sub_id in enumerate(ids):
            if type(sub_id) not in (int, str):
                raise SubscriptionError(f"subscription id {sub_id!r} must be an int or a str")
            if sub_id in self._subs or sub_id in seen:
                raise SubscriptionError(f"subscription {sub_id!r} exists already")
            seen.add(sub_id)
            if i in bad:
                raise FilterError(
                    f"subscription {sub_id!r}: a conjunction holds more than "
                    f"{kernels.MAX_REQUIRED} predicates"
                )
        raise AssertionError("unreachable: some check failed above")

    def _take_subs(self, n: int) -> np.ndarray:
        """``n`` subscription indexes: the free ones first (as :meth:`_install` takes them), then new ones."""
        reused = [self._free_subs.pop() for _ in range(min(n, len(self._free_subs)))]
        start = len(self._sub_ids)
        fresh = n - len(reused)
        self._sub_ids.extend([None] * fresh)
        self._sub_slots.extend([()] * fresh)
        return np.concatenate([np.asarray(reused, I64), np.arange(start, start + fresh, dtype=I64)])

    def _take_slots(self, n: int) -> np.ndarray:
        """``n`` conjunction slots: the free ones first (as :meth:`_alloc_slot` takes them), then new ones."""
        reused = [self._free_slots.pop() for _ in range(min(n, len(self._free_slots)))]
        high = self._high + n - len(reused)
        if high > self._slots:
            size = self._slots
            while size < high:
                size *= 2
            self._grow_slots(size)
        fresh = np.arange(self._high, high, dtype=I64)
        self._high = high
        return np.concatenate([np.asarray(reused, I64), fresh])

    def _set_ids(self, s: np.ndarray, ids: Sequence[SubId] | np.ndarray) -> None:
        """:meth:`_set_id` for many subscriptions."""
        if not isinstance(ids, np.ndarray) and self._id_table.dtype != object:
            self._id_table = self._id_table.astype(object)
        top = int(s.max()) + 1 if s.size else 0
        if top > self._id_table.size:
            grown = np.zeros(max(top, 2 * self._id_table.size), self._id_table.dtype)
            grown[: self._id_table.size] = self._id_table
            self._id_table = grown
        if self._id_table.dtype == object:
            table = self._id_table
            for k, sid in zip(s.tolist(), ids, strict=True):
                table[k] = sid  # element by element: numpy would make a tuple id an array
        else:
            self._id_table[s] = ids

    def _install_ranges(
        self,
        slots: np.ndarray,
        row: np.ndarray,
        rank: np.ndarray,
        ranked: list[Predicate],
        lo_of: np.ndarray,
        hi_of: np.ndarray,
    ) -> set[str]:
        """The numeric ranges of :meth:`add_conjunctions`, merged per conjunction and attribute."""
        if row.size == 0:
            return set()
        attr_names = sorted({ranked[k].attr for k in np.unique(rank).tolist()})
        attr_id = {name: i for i, name in enumerate(attr_names)}
        aid_of = np.asarray([attr_id.get(p.attr, -1) for p in ranked], I64)
        aid = aid_of[rank]
        group = row * len(attr_names) + aid  # non-decreasing: literals sort by attribute first
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        lo = np.maximum.reduceat(lo_of[rank], starts)
        hi = np.minimum.reduceat(hi_of[rank], starts)
        g_aid, g_slot = aid[starts], slots[row[starts]]
        for i, name in enumerate(attr_names):
            attr = self._attr(name)
            if attr.intervals is None:
                attr.intervals = IntervalIndex(self._slots)
            mine = g_aid == i
            attr.intervals.add(g_slot[mine].astype(I32), lo[mine], hi[mine])
        return set(attr_names)

    def _bulk_records(
        self,
        slots: np.ndarray,
        p_row: np.ndarray,
        pids: np.ndarray,
        required: np.ndarray,
        r_row: np.ndarray,
        r_rank: np.ndarray,
        ranked: list[Predicate],
        access: np.ndarray,
    ) -> None:
        """The removal records of :meth:`add_conjunctions` (as :meth:`_install_plan` writes them)."""
        n = slots.size
        signed: list[tuple[int, ...]] = [()] * n
        starts = np.concatenate([[0], np.cumsum(required)[:-1]]).astype(I64)
        for k in np.unique(required).tolist():
            if k == 0:
                continue
            rows = np.flatnonzero(required == k)
            columns = (pids[starts[rows][:, None] + np.arange(k, dtype=I64)] + 1).T.tolist()
            tuples = list(zip(*columns, strict=True))  # one tuple per row, made in C
            if rows.size == n:
                signed = tuples
            else:
                for r, t in zip(rows.tolist(), tuples, strict=True):
                    signed[r] = t
        ranges: list[tuple[str, ...]] = [()] * n
        if r_row.size:
            names = [p.attr for p in ranked]
            per_row: dict[int, list[str]] = {}
            for r, k in zip(r_row.tolist(), r_rank.tolist(), strict=True):
                attrs = per_row.setdefault(r, [])
                if not attrs or attrs[-1] != names[k]:
                    attrs.append(names[k])
            for r, attrs in per_row.items():
                ranges[r] = tuple(attrs)
        records = list(zip(signed, ranges, access.tolist(), strict=True))
        if _consecutive(slots):
            self._records[int(slots[0]) : int(slots[0]) + n] = records
        else:
            for slot, record in zip(slots.tolist(), records, strict=True):
                self._records[slot] = record

    def remove(self, sub_id: SubId, /) -> None:
        """Remove a subscription; :class:`SubscriptionError` if there is none by that id."""
        try:
            s = self._subs.pop(sub_id)
        except (KeyError, TypeError):
            raise SubscriptionError(f"no subscription {sub_id!r}") from None
        slots = self._sub_slots[s]
        if len(slots) > 1:
            self._multi -= 1
        touched: set[str] = set()
        for slot in slots:
            touched.update(self._uninstall_slot(slot))
        self._sub_ids[s] = None
        self._sub_slots[s] = ()
        self._free_subs.append(s)
        self._tune(touched)

    def match(self, event: Mapping[str, Any], /) -> list[SubId]:
        """The ids of the subscriptions ``event`` matches, sorted."""
        return self.match_batch([event])[0].tolist()  # type: ignore[no-any-return]

    def match_batch(self, events: EventBatch, /) -> list[np.ndarray]:
        """One sorted array of subscription ids per event.

        ``events`` is a sequence of mappings or an Arrow table / record batch
        (a null is a missing attribute).
        """
        arrow = isinstance(events, (pa.Table, pa.RecordBatch))
        n = events.num_rows if arrow else len(events)  # type: ignore[union-attr,arg-type]
        if n == 0:
            return []
        epoch0 = self._epoch
        self._epoch += n
        workers = min(self.workers, n // _PARALLEL_MIN)
        if workers <= 1:
            return self._match_range(events, arrow, 0, n, epoch0, self._scratch(epoch0, n))
        bounds = [n * w // workers for w in range(workers + 1)]
        jobs = [
            self._pool().submit(
                self._match_range,
                events,
                arrow,
                lo,
                hi,
                epoch0 + lo,
                self._scratch(epoch0 + lo, hi - lo, copy=True),
            )
            for lo, hi in itertools.pairwise(bounds)
        ]
        return [ids for job in jobs for ids in job.result()]

    def _match_range(
        self, events: Any, arrow: bool, lo: int, hi: int, epoch0: int, scratch: _Scratch
    ) -> list[np.ndarray]:
        """Events ``lo..hi-1``, cut in chunks small enough for the per-event bitsets of live conjunctions."""
        words = self._active.size
        chunk = max(1, min(hi - lo, _ALIVE_BYTES // max(8, 8 * words))) if self._has_intervals() else hi - lo
        out: list[np.ndarray] = []
        for start in range(lo, hi, chunk):
            size = min(chunk, hi - start)
            part = events.slice(start, size) if arrow else events[start : start + size]
            out.extend(self._match_chunk(part, arrow, epoch0 + start - lo, scratch))
        return out

    def _scratch(self, epoch0: int, n: int, *, copy: bool = False) -> _Scratch:
        """Per-event marks for events ``epoch0 .. epoch0+n-1``: the matcher's own, or copies for a thread.

        The counting words keep a 16-bit epoch tag; they are wiped before a tag could repeat.
        """
        if copy:
            counts = self._counts & np.uint32(kernels.REQ_MASK)
            return _Scratch(counts, np.full_like(self._pmark, -1), np.full_like(self._xmark, -1))
        if epoch0 + n - self._counts_cleared >= kernels.EPOCH_PERIOD:
            self._counts &= np.uint32(kernels.REQ_MASK)
            self._counts_cleared = epoch0
        return _Scratch(self._counts, self._pmark, self._xmark)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle everything but the thread pool (made again on first use)."""
        return {**self.__dict__, "_executor": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # the code tables' sentinels unpickle to their singletons (see encode)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="flowbus-match")
        return self._executor

    def nbytes(self) -> int:
        """Approximate memory held by the index (arrays exactly, Python tables estimated)."""
        arrays = (
            self._conj_sub, self._req, self._counts, self._has_expr, self._active,
            self._zero_bits, self._zero_list, self._zero_pos, self._exists, self._pred_ref,
            self._pmark, self._xmark,
        )  # fmt: skip
        pools = (
            self._code_pool, self._excl_pool, self._ne_pool, self._pos_pool,
            self._neg_pool, self._cluster_pool,
        )  # fmt: skip
        total = sum(int(a.nbytes) for a in arrays) + sum(p.nbytes() for p in pools)
        total += sum(a.intervals.nbytes() for a in self._attr_list if a.intervals is not None)
        total += 120 * (len(self._subs) + len(self._pred_ids)) + 100 * self._n_codes
        total += 80 * sum(1 for r in self._records if r is not None)
        return total

    # ------------------------------------------------------------------ matching

    def _has_intervals(self) -> bool:
        return any(a.intervals is not None and a.intervals.m > 0 for a in self._attr_list)

    def _match_chunk(self, events: Any, arrow: bool, epoch0: int, scratch: _Scratch) -> list[np.ndarray]:
        names = [a.name for a in self._attr_list]
        tables = [a.table for a in self._attr_list]
        typed = [a.typed for a in self._attr_list]
        ranged = [a.intervals is not None and a.intervals.m > 0 for a in self._attr_list]
        encode = encode_arrow if arrow else encode_mappings
        codes, vals = encode(events, names, tables, typed, ranged)
        n = codes.shape[0]
        rows: list[Mapping[str, Any]] | None = None
        if any(a.strings for a in self._attr_list) or self._exprs:
            rows = events.to_pylist() if arrow else events
            rows = [{k: v for k, v in r.items() if v is not None} for r in rows] if arrow else rows
        extra_ptr, extra_ids = self._extras(rows, n)
        has_alive = any(ranged)
        alive = np.empty((0, 0), U64)
        if has_alive:
            alive = np.repeat(self._active[None, :], n, axis=0)
            for a, is_ranged in zip(self._attr_list, ranged, strict=True):
                if is_ranged:
                    assert a.intervals is not None
                    a.intervals.apply(np.ascontiguousarray(vals[:, a.index]), alive)
        ptr, slots = self._run_kernel(epoch0, codes, extra_ptr, extra_ids, has_alive, alive, scratch)
        return self._to_ids(ptr, slots, rows, n)

    def _run_kernel(
        self,
        epoch0: int,
        codes: np.ndarray,
        extra_ptr: np.ndarray,
        extra_ids: np.ndarray,
        has_alive: bool,
        alive: np.ndarray,
        scratch: _Scratch,
    ) -> tuple[np.ndarray, np.ndarray]:
        def view(p: ListPool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            return p.start, p.length, p.data

        common = (
            epoch0, codes, extra_ptr, extra_ids, self._exists,
            view(self._code_pool), view(self._excl_pool), view(self._ne_pool),
        )  # fmt: skip
        zero = (self._zero_bits, self._zero_list, self._zero_n)
        if self.strategy == "counting":
            return kernels.count_match(  # type: ignore[no-any-return]
                *common, view(self._pos_pool), view(self._neg_pool),
                has_alive, alive, *zero, scratch.counts, scratch.xmark,
            )  # fmt: skip
        return kernels.cluster_match(  # type: ignore[no-any-return]
            *common, view(self._cluster_pool), view(self._neg_pool),
            has_alive, alive, *zero, scratch.counts, scratch.pmark, scratch.xmark,
        )  # fmt: skip

    def _extras(self, rows: Sequence[Mapping[str, Any]] | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Stage 1 for the predicates evaluated in Python (see :mod:`flowbus.matching.strings`)."""
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

    def _to_ids(
        self, ptr: np.ndarray, slots: np.ndarray, rows: Sequence[Mapping[str, Any]] | None, n: int
    ) -> list[np.ndarray]:
        event_of = np.repeat(np.arange(n, dtype=I64), np.diff(ptr))
        if self._exprs and slots.size:
            keep = np.ones(slots.size, np.bool_)
            for k in np.flatnonzero(self._has_expr[slots]).tolist():
                assert rows is not None
                exprs = self._exprs[int(slots[k])]
                row = rows[int(event_of[k])]
                keep[k] = all(x.matches(row, self.functions) for x in exprs)
            slots, event_of = slots[keep], event_of[keep]
        subs = self._conj_sub[slots]
        if subs.size > 1:
            key = self._sort_key(subs)
            order = np.lexsort((key, event_of))
            subs, event_of, key = subs[order], event_of[order], key[order]
            if self._multi:
                first = np.ones(subs.size, np.bool_)
                first[1:] = (key[1:] != key[:-1]) | (event_of[1:] != event_of[:-1])
                subs, event_of = subs[first], event_of[first]
        ids = self._id_table[subs]
        bounds = np.searchsorted(event_of, np.arange(n + 1)).tolist()
        return [ids[bounds[e] : bounds[e + 1]] for e in range(n)]

    def _sort_key(self, subs: np.ndarray) -> np.ndarray:
        """Integers ordered as the subscription ids of ``subs`` (strings after ints, each by value)."""
        if self._id_table.dtype != object:
            return self._id_table[subs]  # type: ignore[no-any-return]
        distinct, inverse = np.unique(subs, return_inverse=True)
        ids = self._id_table[distinct].tolist()
        order = sorted(range(len(ids)), key=lambda k: (type(ids[k]) is str, ids[k]))
        rank = np.empty(len(ids), I64)
        rank[order] = np.arange(len(ids), dtype=I64)
        return rank[inverse]

    # ------------------------------------------------------------------ changes

    def _install(self, batch: list[tuple[SubId, tuple[_Plan, ...]]]) -> None:
        pools: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in ("pos", "neg", "cluster")}
        ranges: dict[str, tuple[list[int], list[float], list[float]]] = {}
        slot_info: tuple[list[int], list[int], list[int]] = ([], [], [])  # slot, subscription, required
        for sub_id, plans in batch:
            s = self._free_subs.pop() if self._free_subs else len(self._sub_ids)
            if s == len(self._sub_ids):
                self._sub_ids.append(None)
                self._sub_slots.append(())
            slots = tuple(self._install_plan(s, plan, pools, ranges, slot_info) for plan in plans)
            self._subs[sub_id] = s
            self._sub_ids[s] = sub_id
            self._set_id(s, sub_id)
            self._sub_slots[s] = slots
            if len(slots) > 1:
                self._multi += 1
        self._activate(*(np.asarray(x, I64) for x in slot_info))
        targets = {"pos": self._pos_pool, "neg": self._neg_pool, "cluster": self._cluster_pool}
        for name, (keys, values) in pools.items():
            targets[name].extend(np.asarray(keys, I64), np.asarray(values, I32))
        for name, (slots_, los, his) in ranges.items():
            iv = self._attr(name).intervals
            assert iv is not None
            iv.add(np.asarray(slots_, I32), np.asarray(los, F64), np.asarray(his, F64))
        self._tune(set(ranges))

    def _install_plan(
        self,
        s: int,
        plan: _Plan,
        pools: dict[str, tuple[list[int], list[int]]],
        ranges: dict[str, tuple[list[int], list[float], list[float]]],
        slot_info: tuple[list[int], list[int], list[int]],
    ) -> int:
        slot = self._alloc_slot()
        signed = tuple((-1 if neg else 1) * (self._intern(p) + 1) for p, neg in plan.preds)
        positive = [x - 1 for x in signed if x > 0]
        for x in signed:
            if x < 0:
                pools["neg"][0].append(-x - 1)
                pools["neg"][1].append(slot)
            elif self.strategy == "counting":
                pools["pos"][0].append(x - 1)
                pools["pos"][1].append(slot)
        access = -1
        if self.strategy == "clustering" and positive:
            access = min(positive, key=self._access_cost)
            self._csize[access] += 1
            others = list(signed)
            others.remove(access + 1)
            pools["cluster"][0].extend([access] * (len(others) + 2))
            pools["cluster"][1].extend([slot, len(others), *others])
        for name, lo, hi in plan.intervals:
            bucket = ranges.get(name)
            if bucket is None:
                attr = self._attr(name)
                if attr.intervals is None:
                    attr.intervals = IntervalIndex(self._slots)
                bucket = ranges[name] = ([], [], [])
            bucket[0].append(slot)
            bucket[1].append(lo)
            bucket[2].append(hi)
        slot_info[0].append(slot)
        slot_info[1].append(s)
        slot_info[2].append(len(positive))
        if plan.exprs:
            self._exprs[slot] = plan.exprs
            self._has_expr[slot] = True
        self._records[slot] = (signed, tuple(name for name, _, _ in plan.intervals), access)
        return slot

    def _set_id(self, s: int, sub_id: SubId) -> None:
        if type(sub_id) is not int and self._id_table.dtype != object:
            self._id_table = self._id_table.astype(object)
        if s >= self._id_table.size:
            grown = np.zeros(max(s + 1, 2 * self._id_table.size), self._id_table.dtype)
            grown[: self._id_table.size] = self._id_table
            self._id_table = grown
        self._id_table[s] = sub_id

    def _access_cost(self, pid: int) -> tuple[int, int]:
        """Prefer equality-like access predicates, then the smallest cluster so far."""
        p = self._preds[pid]
        assert p is not None
        return (0 if p.op in _CODE_OPS else 1, int(self._csize[pid]))

    def _uninstall_slot(self, slot: int) -> tuple[str, ...]:
        record = self._records[slot]
        assert record is not None
        signed, interval_attrs, access = record
        for x in signed:
            pid = abs(x) - 1
            if x < 0:
                self._neg_pool.remove(np.array([pid]), np.array([slot]))
            elif self.strategy == "counting":
                self._pos_pool.remove(np.array([pid]), np.array([slot]))
        if access >= 0:
            self._cluster_pool.remove_record(access, slot)
            self._csize[access] -= 1
        for x in signed:
            self._release(abs(x) - 1)
        for name in interval_attrs:
            iv = self._attr(name).intervals
            assert iv is not None
            iv.remove(slot)
        if self._req[slot] == 0:
            self._zero_remove(slot)
        self._exprs.pop(slot, None)
        self._counts[slot] = 0
        self._has_expr[slot] = False
        self._set_bit(self._active, slot, False)
        self._conj_sub[slot] = -1
        self._records[slot] = None
        self._free_slots.append(slot)
        return interval_attrs

    def _tune(self, names: Iterable[str]) -> None:
        for name in names:
            iv = self._attrs[name].intervals
            if iv is not None:
                iv.tune()

    # ------------------------------------------------------------------ predicates

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

    def _intern(self, p: Predicate) -> int:
        pid = self._pred_ids.get(p)
        if pid is not None:
            self._pred_ref[pid] += 1
            return pid
        pid = self._free_preds.pop() if self._free_preds else len(self._preds)
        if pid == len(self._preds):
            self._preds.append(None)
            if pid >= self._pred_ref.size:
                self._grow_preds(max(64, 2 * self._pred_ref.size))
        self._preds[pid] = p
        self._pred_ids[p] = pid
        self._pred_ref[pid] = 1
        self._pos_pool.ensure_keys(pid + 1)
        self._neg_pool.ensure_keys(pid + 1)
        self._cluster_pool.ensure_keys(pid + 1)
        self._index_pred(pid, p, insert=True)
        return pid

    def _release(self, pid: int) -> None:
        self._pred_ref[pid] -= 1
        if self._pred_ref[pid] > 0:
            return
        p = self._preds[pid]
        assert p is not None
        self._index_pred(pid, p, insert=False)
        del self._pred_ids[p]
        self._preds[pid] = None
        self._free_preds.append(pid)

    def _index_pred(self, pid: int, p: Predicate, *, insert: bool) -> None:
        """Enter (or take out) a predicate in its attribute's stage-1 structures."""
        attr = self._attr(p.attr)
        values = p.value if isinstance(p.value, tuple) else (p.value,)
        if p.op in _CODE_OPS or p.op in _EXCLUDE_OPS:
            pool = self._code_pool if p.op in _CODE_OPS else self._excl_pool
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

    # ------------------------------------------------------------------ slots

    def _alloc_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        if self._high == self._slots:
            self._grow_slots(2 * self._slots)
        self._high += 1
        return self._high - 1

    def _grow_slots(self, n: int) -> None:
        old = self._slots
        words = (n + 63) // 64

        def grow(arr: np.ndarray, size: int, fill: Any) -> np.ndarray:
            out = np.full(size, fill, arr.dtype)
            out[: arr.size] = arr
            return out

        self._conj_sub = grow(self._conj_sub, n, -1)
        self._req = grow(self._req, n, 0)
        self._has_expr = grow(self._has_expr, n, False)
        self._zero_list = grow(self._zero_list, n, -1)
        self._zero_pos = grow(self._zero_pos, n, -1)
        self._counts = grow(self._counts, n, 0)
        self._active = grow(self._active, words, 0)
        self._zero_bits = grow(self._zero_bits, words, 0)
        self._records.extend([None] * (n - old))
        self._slots = n
        for attr in self._attr_list:
            if attr.intervals is not None:
                attr.intervals.resize(n)

    def _grow_preds(self, n: int) -> None:
        for name in ("_pred_ref", "_csize", "_pmark", "_xmark"):
            arr = getattr(self, name)
            out = np.full(n, -1 if name.endswith("mark") else 0, I64)
            out[: arr.size] = arr
            setattr(self, name, out)

    @staticmethod
    def _set_bit(bits: np.ndarray, slot: int, on: bool) -> None:
        mask = np.uint64(1) << np.uint64(slot & 63)
        if on:
            bits[slot >> 6] |= mask
        else:
            bits[slot >> 6] &= ~mask

    def _activate(self, slots: np.ndarray, subs: np.ndarray, required: np.ndarray) -> None:
        """Mark new slots live (vectorised over a batch of new conjunctions)."""
        self._req[slots] = required
        self._counts[slots] = (required << 8).astype(np.uint32)
        self._conj_sub[slots] = subs
        bits = np.left_shift(np.uint64(1), (slots & 63).astype(np.uint64))
        np.bitwise_or.at(self._active, slots >> 6, bits)
        zero = slots[required == 0]
        n = self._zero_n
        self._zero_list[n : n + zero.size] = zero
        self._zero_pos[zero] = np.arange(n, n + zero.size, dtype=I32)
        self._zero_n = n + zero.size
        np.bitwise_or.at(self._zero_bits, zero >> 6, bits[required == 0])

    def _zero_remove(self, slot: int) -> None:
        i = int(self._zero_pos[slot])
        last = self._zero_n - 1
        moved = int(self._zero_list[last])
        self._zero_list[i] = moved
        self._zero_pos[moved] = i
        self._zero_pos[slot] = -1
        self._zero_n = last
        self._set_bit(self._zero_bits, slot, False)


def warm_up() -> float:
    """Compile the matcher's kernels now (or load them from numba's cache): a process that
    will match under load, such as a broker, calls this before it serves, so that it does
    not stall for seconds on its first subscriptions and events. The seconds it took."""
    start = time.perf_counter()
    m = Matcher(workers=1)
    kinds = (
        'symbol = "S{k}" & price > {k}.5',
        'symbol = "S{k}" & exchange = "LSE" & price < {k}',
        'symbol = "S{k}" & level >= 4 & price >= {k}.25',
        'exchange = "NYSE" & level = {k} & price between {k} and {k}.75',
        'exchange in {{"LSE", "TSE"}} & symbol = "S{k}" & price <= {k}',
        'quantity < {k} & symbol != "S{k}"',
        "price * quantity >= {k}000 | level = {k}",
        'not (symbol = "S{k}") & exists level',
    )
    m.add_many((f"w{k}-{i}", text.format(k=k)) for k in range(40) for i, text in enumerate(kinds))
    events = [
        {"symbol": f"S{k}", "price": k + 0.5 * (k % 3), "quantity": k * 7, "exchange": ex, "level": k % 10}
        for k in range(64)
        for ex in ("LSE", "NYSE")
    ]
    for r in range(2):  # (removing and adding again runs the index's upkeep)
        m.match_batch(events)
        m.match(events[0])
        prefix = "w" if r == 0 else "x"
        for k in range(0, 40, 3):
            for i in range(len(kinds)):
                m.remove(f"{prefix}{k}-{i}")
        m.add_many((f"x{k}-{i}", text.format(k=k)) for k in range(0, 40, 3) for i, text in enumerate(kinds))
    return time.perf_counter() - start
