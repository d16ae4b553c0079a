"""What subscriptions become before they change the matcher: their literals sorted by the
structure that takes each.

How it works: a conjunction's literals fall into three kinds (the 001 document's predicate
vector, with two additions of flowbus's own):

* predicates, shared between conjunctions through an id: everything equality-like, string
  tests, ``exists``, and negated literals in their positive form with a flag;
* numeric ranges (``< <= > >=`` on a number, not negated), which the predicate indexes merge
  into one closed interval per conjunction and attribute
  (:meth:`~flowbus.matching.indexes.PredicateIndexes.add_ranges`);
* expression predicates (``price*vol >= 1000000``), evaluated last.

:class:`Plan` does this for one conjunction of any filter (:meth:`Matcher.add_many`);
:class:`ConjunctionColumns` for many one-conjunction subscriptions of plain predicates given
as columns (:meth:`Matcher.add_conjunctions`), with array operations. Both are computed, and
so every check can run, before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from flowbus.errors import InternalError, UserError
from flowbus.filters.ast import ExprPredicate, Predicate
from flowbus.matching._types import I64
from flowbus.matching.numbers import is_range

SubId = int | str

_BY_ATTR = attrgetter("attr")


@dataclass(frozen=True, slots=True)
class Plan:
    """One conjunction: ``preds`` as (positive form, negated), ``ranges`` sorted by attribute (as
    the interval merge needs), ``exprs``."""

    preds: tuple[tuple[Predicate, bool], ...]
    ranges: tuple[Predicate, ...]
    exprs: tuple[ExprPredicate, ...]

    @classmethod
    def of(cls, literals: Iterable[Predicate | ExprPredicate]) -> Plan:
        preds: list[tuple[Predicate, bool]] = []
        ranges: list[Predicate] = []
        exprs: list[ExprPredicate] = []
        for lit in literals:
            if isinstance(lit, ExprPredicate):
                exprs.append(lit)
            elif is_range(lit):
                ranges.append(lit)
            else:
                preds.append((Predicate(lit.attr, lit.op, lit.value) if lit.negated else lit, lit.negated))
        if len(ranges) > 1:
            ranges.sort(key=_BY_ATTR)  # (stable: a Conjunction's literals are in this order already)
        return cls(tuple(preds), tuple(ranges), tuple(exprs))

    @property
    def required(self) -> int:
        """How many positive predicates the conjunction requires."""
        return sum(1 for _, negated in self.preds if not negated)


def check_columns(n: int, offsets: Any, codes: Any, predicates: int) -> tuple[np.ndarray, np.ndarray]:
    """``offsets`` and ``codes`` as arrays, if they describe ``n`` conjunctions over ``predicates``
    predicates (see :meth:`Matcher.add_conjunctions`)."""
    offsets = np.asarray(offsets, I64)
    codes = np.asarray(codes, I64)
    if offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != codes.size:
        raise UserError(f"add_conjunctions: {n} subscriptions need {n + 1} offsets, 0 to len(codes)")
    if (np.diff(offsets) < 0).any() or (codes.size and (codes.min() < 0 or codes.max() >= predicates)):
        raise UserError("add_conjunctions: offsets must not decrease and codes must index predicates")
    return offsets, codes


@dataclass(frozen=True, slots=True)
class ConjunctionColumns:
    """Subscription ``ids[r]`` is the conjunction of ``preds[k]`` for the ``(r, k)`` in
    ``zip(p_row, p_pred)`` and the ranges ``ranges[k]`` for the ``(r, k)`` in ``zip(r_row,
    r_range)``; both run by row, then in literal order, without repeats. ``required[r]``
    counts row ``r``'s predicates; ``id_types`` are the types of the ids."""

    ids: list[SubId]
    id_types: frozenset[type]
    preds: list[Predicate]
    p_row: np.ndarray
    p_pred: np.ndarray
    ranges: list[Predicate]
    r_row: np.ndarray
    r_range: np.ndarray
    required: np.ndarray

    def __post_init__(self) -> None:
        if self.p_row.shape != self.p_pred.shape or self.r_row.shape != self.r_range.shape:
            raise InternalError("conjunction columns: rows and literals differ in length")
        if self.required.shape != (len(self.ids),):
            raise InternalError(f"conjunction columns: {len(self.ids)} ids, {self.required.size} counts")

    @classmethod
    def of(
        cls,
        sub_ids: Sequence[SubId] | np.ndarray,
        offsets: np.ndarray,
        codes: np.ndarray,
        predicates: Sequence[Predicate],
    ) -> ConjunctionColumns:
        """From :meth:`Matcher.add_conjunctions`'s arguments (checked by :func:`check_columns`;
        plain predicates, none negated)."""
        n = len(sub_ids)
        # the distinct predicates (equal ones merged, as a Conjunction does), numbered in literal order
        canon: dict[Predicate, int] = {}
        first = np.asarray([canon.setdefault(p, len(canon)) for p in predicates], I64)
        distinct = list(canon)
        order = sorted(range(len(distinct)), key=lambda k: distinct[k].sort_key())
        ranked = [distinct[k] for k in order]
        rank_of = np.empty(len(distinct), I64)
        rank_of[order] = np.arange(len(distinct), dtype=I64)
        width = max(1, len(ranked))
        lengths = np.diff(offsets)
        row = np.repeat(np.arange(n, dtype=I64), lengths)
        rank = rank_of[first][codes]
        key = row * width + rank
        if key.size > 1 and not (key[1:] > key[:-1]).all():
            key = np.unique(key)  # each conjunction's literals sorted, without repeats
            row, rank = key // width, key % width
            lengths = np.bincount(row, minlength=n)
        ids = sub_ids.tolist() if isinstance(sub_ids, np.ndarray) else list(sub_ids)
        types = frozenset(map(type, ids))
        ranged = np.asarray([is_range(p) for p in ranked], np.bool_)
        if not ranged.any():
            return cls(ids, types, ranked, row, rank, [], row[:0], rank[:0], lengths)
        is_r = ranged[rank]
        p_row, r_row = row[~is_r], row[is_r]
        p_pred = (np.cumsum(~ranged) - 1)[rank[~is_r]]
        r_range = (np.cumsum(ranged) - 1)[rank[is_r]]
        preds = [p for p, r in zip(ranked, ranged.tolist(), strict=True) if not r]
        ranges = [p for p, r in zip(ranked, ranged.tolist(), strict=True) if r]
        required = np.bincount(p_row, minlength=n)
        return cls(ids, types, preds, p_row, p_pred, ranges, r_row, r_range, required)
