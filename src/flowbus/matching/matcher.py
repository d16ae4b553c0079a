"""The subscription matcher: many filters, one event, all the filters it satisfies.

How it works (the 001 document's two-stage matching):

1. Predicate matching. Each subscription's filter is a disjunction of conjunctions; every
   conjunction gets a slot, and its literals are sorted (:mod:`flowbus.matching.plans`) into
   predicates shared through an id, numeric ranges merged into one interval per attribute,
   and expression predicates evaluated last. The predicate indexes
   (:mod:`flowbus.matching.indexes`) find, per event, the predicates it satisfies and the
   conjunctions whose intervals it misses.
2. Subscription matching by counting or by clustering (``strategy=``), over the lists of the
   subscription table (:mod:`flowbus.matching.table`), in the compiled loops of
   :mod:`flowbus.matching.kernels`.

:class:`Matcher` is the public face over the two: it checks every input before anything
changes, hands the changes to the table (which keeps the indexes in step), and runs the
matching passes, on threads for large batches.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa

from flowbus.errors import FilterError, InternalError, SubscriptionError, UserError
from flowbus.filters.ast import Conjunction, Filter, Functions, Predicate
from flowbus.filters.parser import parse
from flowbus.matching import kernels
from flowbus.matching._types import I64, U64
from flowbus.matching.indexes import PredicateIndexes
from flowbus.matching.plans import ConjunctionColumns, Plan, SubId, check_columns
from flowbus.matching.table import SubscriptionTable

Strategy = Literal["counting", "clustering"]
EventBatch: TypeAlias = "Sequence[Mapping[str, Any]] | pa.Table | pa.RecordBatch"

_PARALLEL_MIN = 2048
"""Events per thread below which a batch is matched on the calling thread."""
_ALIVE_BYTES = 8 << 20
"""Upper bound on the per-batch bitsets of live conjunctions; larger batches are cut in chunks."""
_NO_ALIVE = np.empty((0, 0), U64)


@dataclass(frozen=True, slots=True)
class _Scratch:
    """The per-event marks a matching pass writes (one set per thread)."""

    counts: np.ndarray
    pmark: np.ndarray
    xmark: np.ndarray


def _too_many(sub_id: SubId) -> FilterError:
    limit = kernels.MAX_REQUIRED
    return FilterError(f"subscription {sub_id!r}: a conjunction holds more than {limit} predicates")


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
            raise UserError(f"unknown matching strategy {strategy!r} (expected counting or clustering)")
        if workers is not None and workers < 1:
            raise UserError(f"workers must be at least 1, got {workers}")
        self.strategy: Strategy = strategy
        self.functions: Functions = dict(functions or {})
        self.workers = workers or os.cpu_count() or 1
        self._indexes = PredicateIndexes()
        self._table = SubscriptionTable(self._indexes, clustering=strategy == "clustering")
        self._executor: ThreadPoolExecutor | None = None
        self._epoch = 0  # events matched so far: each gets its own epoch in the marks below
        self._counts_cleared = 0
        self._pmark = np.empty(0, I64)  # predicate -> last epoch it held (clustering)
        self._xmark = np.empty(0, I64)  # predicate -> last epoch a value code excluded it

    # ------------------------------------------------------------------ changes

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._table

    def add(self, sub_id: SubId, filter: Filter | str | Sequence[Any], /) -> None:
        """Add a subscription; ``filter`` is a :class:`Filter`, text or triples.

        Raises :class:`SubscriptionError` if ``sub_id`` is taken and
        :class:`~flowbus.errors.FilterError` for a filter it cannot use; either way
        nothing changes.
        """
        self.add_many([(sub_id, filter)])

    def add_many(self, items: Iterable[tuple[SubId, Filter | str | Sequence[Any]]]) -> None:
        """Add many subscriptions in one go (same checks as :meth:`add`, all before any change)."""
        batch: list[tuple[SubId, tuple[Plan, ...]]] = []
        seen: set[SubId] = set()
        for sub_id, flt in items:
            self._check_new(sub_id, seen)
            f = flt if isinstance(flt, Filter) else parse(flt)
            plans = tuple(Plan.of(c.literals) for c in f.disjuncts)
            missing = {name for p in plans for x in p.exprs for name in x.calls()} - set(self.functions)
            if missing:
                raise FilterError(
                    f"subscription {sub_id!r} calls unknown function(s) {', '.join(sorted(missing))}"
                )
            if any(p.required > kernels.MAX_REQUIRED for p in plans):
                raise _too_many(sub_id)
            batch.append((sub_id, plans))
        self._table.add(batch)

    def _check_new(self, sub_id: SubId, seen: set[SubId]) -> None:
        """Is ``sub_id`` a usable new id, not in the matcher nor ``seen`` (to which it is added)?"""
        if type(sub_id) not in (int, str):
            raise SubscriptionError(f"subscription id {sub_id!r} must be an int or a str")
        if sub_id in self._table or sub_id in seen:
            raise SubscriptionError(f"subscription {sub_id!r} exists already")
        seen.add(sub_id)

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
        offsets, codes = check_columns(n, offsets, codes, len(predicates))
        if n == 0:
            return
        if any(type(p) is not Predicate or p.negated for p in predicates):
            preds, bounds, flat = list(predicates), offsets.tolist(), codes.tolist()
            self.add_many(
                (sid, Filter((Conjunction(tuple(preds[k] for k in flat[bounds[i] : bounds[i + 1]])),)))
                for i, sid in enumerate(sub_ids)
            )
            return
        cols = ConjunctionColumns.of(sub_ids, offsets, codes, predicates)
        self._check_columns(cols)
        self._table.add_columns(cols)

    def _check_columns(self, cols: ConjunctionColumns) -> None:
        """The checks of :meth:`add_many` for :meth:`add_conjunctions`, the first failing one raised."""
        ids = cols.ids
        too_many = np.flatnonzero(cols.required > kernels.MAX_REQUIRED)
        if (
            cols.id_types <= {int, str}
            and len(set(ids)) == len(ids)
            and self._table.isdisjoint(ids)
            and too_many.size == 0
        ):
            return
        bad = set(too_many.tolist())
        seen: set[SubId] = set()
        for i, sub_id in enumerate(ids):
            self._check_new(sub_id, seen)
            if i in bad:
                raise _too_many(sub_id)
        raise InternalError("add_conjunctions: a check failed, but none for any one subscription")

    def remove(self, sub_id: SubId, /) -> None:
        """Remove a subscription; :class:`SubscriptionError` if there is none by that id."""
        self._table.remove(sub_id)

    # ------------------------------------------------------------------ matching

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
        words = self._table.slots.active.size
        chunk = hi - lo
        if self._indexes.has_intervals():
            chunk = max(1, min(chunk, _ALIVE_BYTES // max(8, 8 * words)))
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
        slots = self._table.slots
        capacity = self._table.pred_capacity
        if self._pmark.size < capacity:
            self._pmark = np.concatenate([self._pmark, np.full(capacity - self._pmark.size, -1, I64)])
            self._xmark = np.concatenate([self._xmark, np.full(capacity - self._xmark.size, -1, I64)])
        if copy:
            counts = slots.counts & np.uint32(kernels.REQ_MASK)
            return _Scratch(counts, np.full_like(self._pmark, -1), np.full_like(self._xmark, -1))
        if epoch0 + n - self._counts_cleared >= kernels.EPOCH_PERIOD:
            slots.clear_counts()
            self._counts_cleared = epoch0
        return _Scratch(slots.counts, self._pmark, self._xmark)

    def _match_chunk(self, events: Any, arrow: bool, epoch0: int, scratch: _Scratch) -> list[np.ndarray]:
        codes, vals, res = self._indexes.encode(events, arrow=arrow)
        n = codes.shape[0]
        rows: Sequence[Mapping[str, Any]] | None = None
        if self._indexes.needs_rows() or self._table.has_expressions():
            rows = events.to_pylist() if arrow else events  # (a null is a None: a missing attribute)
        extra_ptr, extra_ids = self._indexes.extras(rows, n)
        alive = self._indexes.alive(self._table.slots.active, vals, res)
        ptr, slots = self._run_kernel(epoch0, codes, extra_ptr, extra_ids, alive, scratch)
        event_of = np.zeros(slots.size, I64) if n == 1 else np.repeat(np.arange(n, dtype=I64), np.diff(ptr))
        if self._table.has_expressions() and slots.size:
            assert rows is not None
            keep = self._table.expressions_hold(slots, event_of, rows, self.functions)
            slots, event_of = slots[keep], event_of[keep]
        return self._table.answers(slots, event_of, n)

    def _run_kernel(
        self,
        epoch0: int,
        codes: np.ndarray,
        extra_ptr: np.ndarray,
        extra_ids: np.ndarray,
        alive: np.ndarray | None,
        scratch: _Scratch,
    ) -> tuple[np.ndarray, np.ndarray]:
        common = (epoch0, codes, extra_ptr, extra_ids, *self._indexes.kernel_args())
        lists, neg = self._table.kernel_args()
        slots = self._table.slots
        live = (alive is not None, _NO_ALIVE if alive is None else alive)
        zero = (*live, slots.zero_bits, slots.zero_list, slots.zero_n)
        if self.strategy == "counting":
            return kernels.count_match(  # type: ignore[no-any-return]
                *common, lists, neg, *zero, scratch.counts, scratch.xmark
            )
        return kernels.cluster_match(  # type: ignore[no-any-return]
            *common, lists, neg, *zero, scratch.counts, scratch.pmark, scratch.xmark
        )

    # ------------------------------------------------------------------ the rest

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
        marks = int(self._pmark.nbytes + self._xmark.nbytes)
        return self._table.nbytes() + self._indexes.nbytes() + marks


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
