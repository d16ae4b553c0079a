"""Stage 1 for the predicates the compiled loops do not index: an attribute's string and order tests.

How it works: per attribute,

* ``prefix`` predicates sit in a hash table keyed by their constant; an event's
  string value satisfies exactly the entries keyed by one of its own prefixes,
  so a value of length L costs L + 1 look-ups, however many prefix predicates
  there are;
* ordering predicates (``< <= > >=`` on strings, and on numbers when they could
  not become intervals: negated, or on an int beyond int64 that is not a double)
  keep their constants in sorted lists, one per operator and value class: the
  satisfied ones are one slice, found by bisection (numbers compare exactly, as
  Python compares ints and floats);
* ``suffix`` and ``contains`` are tested one by one.

Predicate ids are those of the positive forms (a negated literal shares its
predicate's id and is handled by the counting stage).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from flowbus.filters.ast import Op, Predicate, value_class

_SLICES: dict[Op, Callable[[list[Any], Any], tuple[int, int | None]]] = {
    # constants c with value OP c, as a slice of the sorted constants
    Op.LT: lambda keys, v: (bisect.bisect_right(keys, v), None),
    Op.LE: lambda keys, v: (bisect.bisect_left(keys, v), None),
    Op.GT: lambda keys, v: (0, bisect.bisect_left(keys, v)),
    Op.GE: lambda keys, v: (0, bisect.bisect_right(keys, v)),
}


class StringPredicates:
    """One attribute's predicates evaluated in Python, indexed by kind."""

    __slots__ = ("_order", "_other", "_prefix")

    def __init__(self) -> None:
        self._prefix: dict[str, list[int]] = {}
        # (op, value class) -> (sorted keys, predicate ids in the same order)
        self._order: dict[tuple[Op, int], tuple[list[Any], list[int]]] = {}
        self._other: dict[int, Predicate] = {}

    def __bool__(self) -> bool:
        return bool(self._prefix or self._order or self._other)

    @staticmethod
    def _order_key(p: Predicate) -> tuple[tuple[Op, int], Any]:
        return (p.op, value_class(p.value)), p.value

    def add(self, pid: int, p: Predicate) -> None:
        if p.op is Op.PREFIX:
            self._prefix.setdefault(str(p.value), []).append(pid)
        elif p.op in _SLICES:
            slot, key = self._order_key(p)
            keys, ids = self._order.setdefault(slot, ([], []))
            i = bisect.bisect_right(keys, key)
            keys.insert(i, key)
            ids.insert(i, pid)
        else:
            self._other[pid] = p

    def remove(self, pid: int, p: Predicate) -> None:
        if p.op is Op.PREFIX:
            ids = self._prefix[str(p.value)]
            ids.remove(pid)
            if not ids:
                del self._prefix[str(p.value)]
        elif p.op in _SLICES:
            slot, _ = self._order_key(p)
            keys, ids = self._order[slot]
            i = ids.index(pid)
            del keys[i], ids[i]
            if not ids:
                del self._order[slot]
        else:
            del self._other[pid]

    def satisfied(self, value: Any, row: Any, out: list[int]) -> None:
        """Append to ``out`` the ids of the predicates that ``value`` (canonical, not None), the
        attribute in ``row``, satisfies."""
        cls = value_class(value)
        if cls == 2 and self._prefix:
            table = self._prefix
            for k in range(len(value) + 1):
                ids = table.get(value[:k])
                if ids:
                    out.extend(ids)
        if cls in (1, 2) and value == value:  # NaN is ordered with nothing
            for (op, kind), (keys, ids) in self._order.items():
                if kind == cls:
                    lo, hi = _SLICES[op](keys, value)
                    out.extend(ids[lo:hi])
        for pid, p in self._other.items():
            if p.holds(row):
                out.append(pid)
