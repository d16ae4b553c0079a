"""The subscription table: which subscription holds which conjunctions and predicates.

How it works (the 001 document's subscription matching, slides 42-46, with its "sub-pred
association to support deletion"):

* Each subscription has an index (ids and indexes are reused after removal) and a tuple of
  conjunction slots (:mod:`flowbus.matching.slots`); the id table maps indexes back to ids
  for the answers.
* The distinct predicates the conjunctions hold are numbered densely and counted
  (:class:`PredicateIds`, the document's predicate vector); a predicate is in the
  :class:`~flowbus.matching.indexes.PredicateIndexes` while some conjunction holds it.
* Stage 2's lists, per predicate id: the conjunctions that hold it (counting) or, under each
  access predicate, the records ``[slot, k, other predicates...]`` of its cluster
  (clustering: the access predicate is the equality-like one with the smallest cluster so
  far), and the conjunctions that hold its negation (both).
* Per slot a removal record (its signed predicate ids, the attributes of its intervals, its
  access predicate), so that removing a subscription touches only the lists of its own
  predicates (amortised O(1) each), never the whole index.

Both ways of adding (:meth:`SubscriptionTable.add` for plans, one Python step per
conjunction; :meth:`SubscriptionTable.add_columns` for columns, with array operations) end
in the same calls: :meth:`ConjunctionSlots.activate`, the ranges' one merge
(:meth:`PredicateIndexes.add_ranges`) and the records (``_write_records``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from flowbus.errors import SubscriptionError
from flowbus.filters.ast import ExprPredicate, Functions, Predicate
from flowbus.matching._types import I32, I64
from flowbus.matching.indexes import CODE_OPS, PredicateIndexes
from flowbus.matching.plans import ConjunctionColumns, Plan, SubId
from flowbus.matching.pool import ListPool, PoolView
from flowbus.matching.slots import ConjunctionSlots

_NO_RANGES: tuple[np.ndarray, list[str]] = (np.empty(0, I64), [])
_Record = tuple[tuple[int, ...], tuple[str, ...], int]
"""A slot's removal record: signed predicate ids (``±(pid + 1)``), interval attributes, access predicate."""


@njit(cache=True, nogil=True)
def _cluster_records(
    offsets: np.ndarray, pids: np.ndarray, code_like: np.ndarray, csize: np.ndarray, slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clustering's access predicate of each conjunction ``i`` (predicates ``pids[offsets[i]:offsets[i+1]]``,
    in literal order), chosen one after the other as :meth:`SubscriptionTable._add_plan` does (equality-like
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


def _signed_rows(pids: np.ndarray, required: np.ndarray) -> list[tuple[int, ...]]:
    """Per row, the tuple of ``pid + 1`` of its ``required[r]`` predicates (``pids``, row after row)."""
    n = required.size
    signed: list[tuple[int, ...]] = [()] * n
    starts = np.concatenate([[0], np.cumsum(required)[:-1]]).astype(I64)
    for k in np.unique(required).tolist():
        if k == 0:
            continue
        rows = np.flatnonzero(required == k)
        columns = (pids[starts[rows][:, None] + np.arange(k, dtype=I64)] + 1).T.tolist()
        tuples = list(zip(*columns, strict=True))  # one tuple per row, made in C
        if rows.size == n:
            return tuples
        for r, t in zip(rows.tolist(), tuples, strict=True):
            signed[r] = t
    return signed


class PredicateIds:
    """The distinct predicates held, numbered densely and counted; each is entered in ``indexes``
    on its first reference and taken out after its last."""

    def __init__(self, indexes: PredicateIndexes) -> None:
        self._indexes = indexes
        self._ids: dict[Predicate, int] = {}
        self._preds: list[Predicate | None] = []
        self._refs = np.empty(0, I64)
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, pid: int) -> Predicate:
        p = self._preds[pid]
        assert p is not None
        return p

    @property
    def capacity(self) -> int:
        """Every id is below this."""
        return int(self._refs.size)

    def intern(self, p: Predicate, *, refs: int = 1) -> int:
        """The id of ``p``, with ``refs`` more references."""
        pid = self._ids.get(p)
        if pid is not None:
            self._refs[pid] += refs
            return pid
        pid = self._free.pop() if self._free else len(self._preds)
        if pid == len(self._preds):
            self._preds.append(None)
            if pid >= self._refs.size:
                grown = np.zeros(max(64, 2 * self._refs.size), I64)
                grown[: self._refs.size] = self._refs
                self._refs = grown
        self._preds[pid] = p
        self._ids[p] = pid
        self._refs[pid] = refs
        self._indexes.add(pid, p)
        return pid

    def release(self, pid: int) -> None:
        """One reference less to ``pid``."""
        self._refs[pid] -= 1
        if self._refs[pid] > 0:
            return
        p = self[pid]
        self._indexes.remove(pid, p)
        del self._ids[p]
        self._preds[pid] = None
        self._free.append(pid)

    def nbytes(self) -> int:
        return int(self._refs.nbytes) + 120 * len(self._ids)


class SubscriptionIds:
    """Subscription id -> index -> conjunction slots, the free indexes, and the id table (index ->
    id: an ``int64`` array while every id is an int) the answers are read from."""

    def __init__(self) -> None:
        self._index: dict[SubId, int] = {}
        self._slots: list[tuple[int, ...]] = []  # index -> its conjunctions' slots, () when free
        self._free: list[int] = []
        self._table: np.ndarray = np.zeros(64, I64)
        self._multi = 0  # subscriptions of more than one conjunction

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._index

    def isdisjoint(self, ids: Iterable[SubId]) -> bool:
        return self._index.keys().isdisjoint(ids)

    def take_one(self) -> int:
        """A free index (the last freed first, as :meth:`take` takes them)."""
        if self._free:
            return self._free.pop()
        self._slots.append(())
        return len(self._slots) - 1

    def take(self, n: int) -> np.ndarray:
        """``n`` free indexes."""
        reused = [self._free.pop() for _ in range(min(n, len(self._free)))]
        start = len(self._slots)
        fresh = n - len(reused)
        self._slots.extend([()] * fresh)
        return np.concatenate([np.asarray(reused, I64), np.arange(start, start + fresh, dtype=I64)])

    def assign_one(self, s: int, sub_id: SubId, slots: tuple[int, ...]) -> None:
        self._index[sub_id] = s
        self._slots[s] = slots
        if len(slots) > 1:
            self._multi += 1
        if type(sub_id) is not int and self._table.dtype != object:
            self._table = self._table.astype(object)
        self._fit(s + 1)
        self._table[s] = sub_id

    def column(self, ids: list[SubId], types: frozenset[type]) -> np.ndarray | list[SubId]:
        """``ids`` as the id table will take them (raises for an int beyond int64, before any change)."""
        if self._table.dtype != object and types <= {int}:
            return np.asarray(ids, I64)
        return ids

    def assign(
        self, s: np.ndarray, ids: list[SubId], column: np.ndarray | list[SubId], slots: np.ndarray
    ) -> None:
        """Subscription ``ids[i]`` (one conjunction, in ``slots[i]``) at index ``s[i]``; ``column``
        from :meth:`column`."""
        s_list, slot_list = s.tolist(), slots.tolist()
        self._index.update(zip(ids, s_list, strict=True))
        if len(self._slots) == s_list[0] + s.size and _consecutive(s):  # all new indexes
            self._slots[s_list[0] :] = zip(slot_list)
        else:
            for k, slot in zip(s_list, slot_list, strict=True):
                self._slots[k] = (slot,)
        if not isinstance(column, np.ndarray) and self._table.dtype != object:
            self._table = self._table.astype(object)
        self._fit(int(s.max()) + 1)
        if self._table.dtype == object:
            table = self._table
            for k, sid in zip(s_list, column, strict=True):
                table[k] = sid  # element by element: numpy would make a tuple id an array
        else:
            self._table[s] = column

    def _fit(self, top: int) -> None:
        if top > self._table.size:
            grown = np.zeros(max(top, 2 * self._table.size), self._table.dtype)
            grown[: self._table.size] = self._table
            self._table = grown

    def pop(self, sub_id: SubId) -> tuple[int, ...]:
        """Forget ``sub_id``; its conjunctions' slots."""
        try:
            s = self._index.pop(sub_id)
        except (KeyError, TypeError):
            raise SubscriptionError(f"no subscription {sub_id!r}") from None
        slots = self._slots[s]
        if len(slots) > 1:
            self._multi -= 1
        self._slots[s] = ()
        self._free.append(s)
        return slots

    def answers(self, subs: np.ndarray, event_of: np.ndarray, n: int) -> list[np.ndarray]:
        """Per event ``0..n-1``, the sorted ids of the subscriptions ``subs[i]`` matched by ``event_of[i]``
        (``event_of`` sorted; a subscription several of whose conjunctions matched once)."""
        if n == 1:
            return [self._table[self._distinct(subs)]]
        if subs.size > 1:
            key = self._sort_key(subs)
            order = np.lexsort((key, event_of))
            subs, event_of, key = subs[order], event_of[order], key[order]
            if self._multi:
                first = np.ones(subs.size, np.bool_)
                first[1:] = (key[1:] != key[:-1]) | (event_of[1:] != event_of[:-1])
                subs, event_of = subs[first], event_of[first]
        ids = self._table[subs]
        bounds = np.searchsorted(event_of, np.arange(n + 1)).tolist()
        return [ids[bounds[e] : bounds[e + 1]] for e in range(n)]

    def _distinct(self, subs: np.ndarray) -> np.ndarray:
        """One event's ``subs`` in id order, each once (what :meth:`answers` does for one event)."""
        if subs.size <= 1:
            return subs
        key = self._sort_key(subs)
        order = np.argsort(key, kind="stable")
        subs, key = subs[order], key[order]
        if self._multi:
            first = np.ones(subs.size, np.bool_)
            first[1:] = key[1:] != key[:-1]
            subs = subs[first]
        return subs

    def _sort_key(self, subs: np.ndarray) -> np.ndarray:
        """Integers ordered as the subscription ids of ``subs`` (strings after ints, each by value)."""
        if self._table.dtype != object:
            return self._table[subs]  # type: ignore[no-any-return]
        distinct, inverse = np.unique(subs, return_inverse=True)
        ids = self._table[distinct].tolist()
        order = sorted(range(len(ids)), key=lambda k: (type(ids[k]) is str, ids[k]))
        rank = np.empty(len(ids), I64)
        rank[order] = np.arange(len(ids), dtype=I64)
        return rank[inverse]

    def nbytes(self) -> int:
        return 120 * len(self._index)


class _Batch:
    """What a batch of plans writes, gathered so that each structure takes it in one call."""

    __slots__ = (
        "access", "cluster", "neg", "pos", "range_slots", "ranges", "required", "signed", "slots", "subs",
    )  # fmt: skip

    def __init__(self) -> None:
        self.pos: tuple[list[int], list[int]] = ([], [])  # (predicate, slot) pairs of each pool
        self.neg: tuple[list[int], list[int]] = ([], [])
        self.cluster: tuple[list[int], list[int]] = ([], [])
        self.range_slots: list[int] = []
        self.ranges: list[Predicate] = []
        self.slots: list[int] = []
        self.subs: list[int] = []
        self.required: list[int] = []
        self.signed: list[tuple[int, ...]] = []
        self.access: list[int] = []


class SubscriptionTable:
    """Subscriptions, their conjunctions (slots) and predicates, stage 2's lists and the removal
    records, over the predicate indexes of ``indexes`` (see the module's note)."""

    def __init__(self, indexes: PredicateIndexes, *, clustering: bool) -> None:
        self.slots = ConjunctionSlots()
        self._indexes = indexes
        self._clustering = clustering
        self._ids = SubscriptionIds()
        self._preds = PredicateIds(indexes)
        self._csize = np.empty(0, I64)  # cluster size per access predicate
        self._pos_pool = ListPool()  # predicate -> conjunctions holding it (counting)
        self._neg_pool = ListPool()  # predicate -> conjunctions holding its negation
        self._cluster_pool = ListPool()  # access predicate -> records [slot, k, others] (clustering)
        self._records: list[_Record | None] = []
        self._attr_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._exprs: dict[int, tuple[ExprPredicate, ...]] = {}
        self._fit_slots()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._ids

    def isdisjoint(self, ids: Iterable[SubId]) -> bool:
        """Is no id of ``ids`` taken?"""
        return self._ids.isdisjoint(ids)

    @property
    def pred_capacity(self) -> int:
        """Every predicate id is below this."""
        return self._preds.capacity

    # ------------------------------------------------------------------ adding

    def add(self, batch: Sequence[tuple[SubId, tuple[Plan, ...]]]) -> None:
        """Add subscriptions (new ids, checked plans)."""
        b = _Batch()
        for sub_id, plans in batch:
            s = self._ids.take_one()
            self._ids.assign_one(s, sub_id, tuple(self._add_plan(s, plan, b) for plan in plans))
        self._fit_slots()
        slots = np.asarray(b.slots, I64)
        self.slots.activate(slots, np.asarray(b.subs, I64), np.asarray(b.required, I64))
        for pool, (keys, values) in (
            (self._pos_pool, b.pos), (self._neg_pool, b.neg), (self._cluster_pool, b.cluster)
        ):  # fmt: skip
            if keys:
                pool.extend(np.asarray(keys, I64), np.asarray(values, I32))
        ranges = _NO_RANGES
        if b.ranges:
            which = np.arange(len(b.ranges))
            ranges = self._indexes.add_ranges(np.asarray(b.range_slots, I64), which, b.ranges)
        self._write_records(slots, b.signed, b.access, ranges)

    def _add_plan(self, s: int, plan: Plan, b: _Batch) -> int:
        slot = self.slots.take_one()
        signed = tuple((-1 if neg else 1) * (self._preds.intern(p) + 1) for p, neg in plan.preds)
        self._fit_preds()
        positive = [x - 1 for x in signed if x > 0]
        for x in signed:
            if x < 0:
                b.neg[0].append(-x - 1)
                b.neg[1].append(slot)
            elif not self._clustering:
                b.pos[0].append(x - 1)
                b.pos[1].append(slot)
        access = -1
        if self._clustering and positive:
            access = min(positive, key=self._access_cost)
            self._csize[access] += 1
            others = list(signed)
            others.remove(access + 1)
            b.cluster[0].extend([access] * (len(others) + 2))
            b.cluster[1].extend([slot, len(others), *others])
        b.range_slots.extend([slot] * len(plan.ranges))
        b.ranges.extend(plan.ranges)
        b.slots.append(slot)
        b.subs.append(s)
        b.required.append(len(positive))
        b.signed.append(signed)
        b.access.append(access)
        if plan.exprs:
            self._exprs[slot] = plan.exprs
            self.slots.has_expr[slot] = True
        return slot

    def _access_cost(self, pid: int) -> tuple[int, int]:
        """Prefer equality-like access predicates, then the smallest cluster so far."""
        return (0 if self._preds[pid].op in CODE_OPS else 1, int(self._csize[pid]))

    def add_columns(self, cols: ConjunctionColumns) -> None:
        """Add one-conjunction subscriptions given as columns (new ids, checked)."""
        n = len(cols.ids)
        column = self._ids.column(cols.ids, cols.id_types)
        s = self._ids.take(n)
        slots = self.slots.take(n)
        self._fit_slots()
        self._ids.assign(s, cols.ids, column, slots)
        uses = np.bincount(cols.p_pred, minlength=len(cols.preds))
        pid_of = np.full(len(cols.preds), -1, I64)
        for k in np.flatnonzero(uses).tolist():
            pid_of[k] = self._preds.intern(cols.preds[k], refs=int(uses[k]))
        self._fit_preds()
        pids = pid_of[cols.p_pred]
        access = np.full(n, -1, I64)
        if not self._clustering:
            self._pos_pool.extend(pids, slots[cols.p_row].astype(I32))
        else:
            code_like = np.zeros(self._csize.size, np.bool_)
            code_like[pids] = np.asarray([p.op in CODE_OPS for p in cols.preds], np.bool_)[cols.p_pred]
            p_offsets = np.concatenate([[0], np.cumsum(cols.required)]).astype(I64)
            access, keys, values = _cluster_records(p_offsets, pids, code_like, self._csize, slots)
            self._cluster_pool.extend(keys, values)
        self.slots.activate(slots, s, cols.required)
        ranges = self._indexes.add_ranges(slots[cols.r_row], cols.r_range, cols.ranges)
        self._write_records(slots, _signed_rows(pids, cols.required), access.tolist(), ranges)

    def _write_records(
        self,
        slots: np.ndarray,
        signed: list[tuple[int, ...]],
        access: list[int],
        ranges: tuple[np.ndarray, list[str]],
    ) -> None:
        """The removal records of new conjunctions (``ranges``: what ``add_ranges`` returned)."""
        slot_list = slots.tolist()
        if not slot_list:
            return
        g_slot, g_names = ranges
        if g_names:
            by_slot: dict[int, list[str]] = {}
            for slot, name in zip(g_slot.tolist(), g_names, strict=True):
                by_slot.setdefault(slot, []).append(name)
            shared = self._attr_tuples  # (one tuple per set of attributes, for every record)
            interval_attrs = [shared.setdefault(t, t) for t in (tuple(by_slot.get(s, ())) for s in slot_list)]
            records = list(zip(signed, interval_attrs, access, strict=True))
        else:
            records = [(x, (), a) for x, a in zip(signed, access, strict=True)]
        if len(records) > 1 and _consecutive(slots):
            self._records[slot_list[0] : slot_list[0] + len(records)] = records
        else:
            for slot, record in zip(slot_list, records, strict=True):
                self._records[slot] = record

    def _fit_slots(self) -> None:
        """Keep the records and the interval indexes as large as the slots."""
        size = self.slots.size
        if len(self._records) < size:
            self._records.extend([None] * (size - len(self._records)))
            self._indexes.resize(size)

    def _fit_preds(self) -> None:
        """Keep stage 2's per-predicate lists as many as the predicate ids."""
        n = self._preds.capacity
        if self._csize.size < n:
            grown = np.zeros(n, I64)
            grown[: self._csize.size] = self._csize
            self._csize = grown
            for pool in (self._pos_pool, self._neg_pool, self._cluster_pool):
                pool.ensure_keys(n)

    # ------------------------------------------------------------------ removing

    def remove(self, sub_id: SubId) -> None:
        """Remove a subscription; :class:`SubscriptionError` if there is none by that id."""
        touched: set[str] = set()
        for slot in self._ids.pop(sub_id):
            touched.update(self._remove_slot(slot))
        self._indexes.tune(touched)

    def _remove_slot(self, slot: int) -> tuple[str, ...]:
        record = self._records[slot]
        assert record is not None
        signed, interval_attrs, access = record
        for x in signed:
            pid = abs(x) - 1
            if x < 0:
                self._neg_pool.remove(np.array([pid]), np.array([slot]))
            elif not self._clustering:
                self._pos_pool.remove(np.array([pid]), np.array([slot]))
        if access >= 0:
            self._cluster_pool.remove_record(access, slot)
            self._csize[access] -= 1
        for x in signed:
            self._preds.release(abs(x) - 1)
        self._indexes.remove_ranges(slot, interval_attrs)
        self._exprs.pop(slot, None)
        self.slots.release(slot)
        self._records[slot] = None
        return interval_attrs

    # ------------------------------------------------------------------ matching

    def kernel_args(self) -> tuple[PoolView, PoolView]:
        """What the kernels' stage 2 reads: the counting or clustering lists, and the negations."""
        return (self._cluster_pool if self._clustering else self._pos_pool).view(), self._neg_pool.view()

    def has_expressions(self) -> bool:
        return bool(self._exprs)

    def expressions_hold(
        self,
        slots: np.ndarray,
        event_of: np.ndarray,
        rows: Sequence[Mapping[str, Any]],
        functions: Functions,
    ) -> np.ndarray:
        """Per matched conjunction ``slots[i]`` of event ``rows[event_of[i]]``: do its expression
        predicates hold?"""
        keep = np.ones(slots.size, np.bool_)
        for k in np.flatnonzero(self.slots.has_expr[slots]).tolist():
            row = rows[int(event_of[k])]
            keep[k] = all(x.matches(row, functions) for x in self._exprs[int(slots[k])])
        return keep

    def answers(self, slots: np.ndarray, event_of: np.ndarray, n: int) -> list[np.ndarray]:
        """Per event, the sorted ids of the subscriptions whose conjunctions ``slots`` it matched."""
        return self._ids.answers(self.slots.conj_sub[slots], event_of, n)

    def nbytes(self) -> int:
        pools = (self._pos_pool, self._neg_pool, self._cluster_pool)
        total = self.slots.nbytes() + self._preds.nbytes() + self._ids.nbytes()
        total += sum(p.nbytes() for p in pools)
        return total + 80 * sum(1 for r in self._records if r is not None)
