"""A collapse of plain aggregates folded over a key's events at once, with numpy: no Python per event.

How it works: :func:`flowbus.flow.aggregates.as_aggregates` recognises rule sets
whose components are plain aggregates (the stock example's ``max_cur`` is
``maxP = max(price)`` and ``curP = last(price)``). For such a collapse, the
rows after each event of a key's micro-batch are running aggregates of the
events' columns: ``last`` is the column itself, ``max``/``min`` a running
maximum/minimum from the old row's value (``np.maximum.accumulate``),
``count`` the old count plus 1, 2, 3... The row changed at event ``i`` where a
component differs from event ``i - 1``'s. When every expand arc out of the state
replays the collapse (:attr:`~flowbus.flow.local.Deliverer.shortcut`) and had
the row from before the batch, each change sends the subscriber the cause
itself, exactly as :meth:`~flowbus.flow.local.Deliverer.events` does event by
event: so the derived events are the changed events' fields, numbered as
:class:`~flowbus.spark.state.GroupFolder` numbers them.

:meth:`VectorFold.run` returns None -- fold this key's events one by one
instead -- on anything the arrays would not give exactly as the rules do: a
missing field, a NaN (max and min skip it, ``!=`` does not), a subscriber that
did not have the old row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowbus.errors import Undefined
from flowbus.filters.ast import Const, Field
from flowbus.flow.aggregates import Aggregate, Aggregates, as_aggregates
from flowbus.flow.collapse import BoundRules
from flowbus.flow.collapse import Row as StateRow
from flowbus.flow.eventlog import order_key
from flowbus.flow.local import Deliverer

__all__ = ["VectorFold"]

Derived = tuple[int, bytes, dict[str, Any]]


class VectorFold:
    """One collapse of a group folded with numpy (``position``: its place among the group's collapses)."""

    def __init__(
        self,
        name: str,
        aggregates: Aggregates,
        deliverers: Sequence[tuple[Deliverer, int, list[str], list[type]]],
        position: int,
    ) -> None:
        self.name = name
        self.aggregates = aggregates
        self.deliverers = deliverers
        self.position = position
        self.reads = sorted({a.arg.name for a in aggregates.components if isinstance(a.arg, Field)})
        keys = {f.name for _, f in aggregates.key}  # an event without them is skipped, one by one
        self.fields = sorted({n for _, _, names, _ in deliverers for n in names} | set(self.reads) | keys)

    @staticmethod
    def of(
        name: str,
        bound: BoundRules,
        deliverers: Sequence[tuple[Deliverer, int, list[str], list[type]]],
        position: int,
    ) -> VectorFold | None:
        """The numpy fold of collapse ``name`` (rules ``bound``, expands ``deliverers``), or None."""
        found = as_aggregates(bound)
        space = dict(bound.event.fields)
        if found is None or not all(_vectorisable(a, space) for a in found.components):
            return None
        for deliverer, _target, names, _kinds in deliverers:
            if not deliverer.shortcut or not set(names) <= set(deliverer.fields):
                return None
        return VectorFold(name, found, deliverers, position)

    def run(
        self,
        key_of: Any,
        rows: dict[str, StateRow],
        last: dict[str, StateRow],
        events: Sequence[tuple[bytes, dict[str, Any]]],
        initial: StateRow,
    ) -> list[Derived] | None:
        """Fold ``events`` (in ``_order``) into ``rows``/``last``; the derived events, or None (fold them
        one by one: nothing was changed)."""
        try:
            columns = {f: [ev[f] for _, ev in events] for f in self.fields}
        except KeyError:
            return None
        try:
            key = key_of(events[0][1])
        except Undefined:
            return None
        old = rows.get(self.name, initial)
        for deliverer, _t, _n, _k in self.deliverers:
            if last.get(deliverer.arc.name, deliverer.bound.initial) != deliverer.project(old):
                return None
        values = []
        for a, start in zip(self.aggregates.components, old, strict=True):
            got = _running(a, columns, start, len(events))
            if got is None:
                return None
            values.append(got)
        moved = [np.concatenate(([start], v[:-1])) != v for v, start in zip(values, old, strict=True)]
        out = self._derived(key, moved, columns, events)
        changed = np.logical_or.reduce(moved)
        if changed.any():
            rows[self.name] = tuple(v[-1].item() for v in values)
        for deliverer, _t, _n, _k in self.deliverers:
            if np.logical_or.reduce([moved[i] for i in deliverer.index]).any():
                last[deliverer.arc.name] = deliverer.project(rows[self.name])
        return out

    def _derived(
        self,
        key: Any,
        moved: list[np.ndarray],
        columns: Mapping[str, list[Any]],
        events: Sequence[tuple[bytes, dict[str, Any]]],
    ) -> list[Derived]:
        sends = [np.logical_or.reduce([moved[i] for i in d.index]) for d, _t, _n, _k in self.deliverers]
        out: list[Derived] = []
        for i in np.flatnonzero(np.logical_or.reduce(sends)).tolist():
            k = 0
            for send, (_d, target, names, kinds) in zip(sends, self.deliverers, strict=True):
                if send[i]:
                    values = [columns[n][i] for n in names]
                    typed = zip(names, kinds, values, strict=True)
                    ev = {n: float(v) if t is float else v for n, t, v in typed}
                    out.append((target, events[i][0] + order_key(self.position, k), ev))
                    k += 1
        return out


def _vectorisable(a: Aggregate, space: Mapping[str, type]) -> bool:
    if a.kind == "count":
        return True
    if a.kind not in ("last", "max", "min"):
        return False
    if isinstance(a.arg, Const):
        return type(a.arg.value) is float
    return isinstance(a.arg, Field) and space.get(a.arg.name) is float


def _running(a: Aggregate, columns: Mapping[str, list[Any]], start: Any, n: int) -> np.ndarray | None:
    """Component ``a`` after each of ``n`` events (None on a NaN or a value that is not a float)."""
    if a.kind == "count":
        return np.asarray(start + np.arange(1, n + 1), dtype=np.int64)
    if isinstance(a.arg, Const):
        return np.full(n, a.arg.value, dtype=np.float64)
    assert isinstance(a.arg, Field)
    x = np.asarray(columns[a.arg.name])
    if x.dtype != np.float64 or np.isnan(x).any():
        return None
    if a.kind == "last":
        return x
    if np.isnan(float(start)):
        return None
    acc = np.maximum.accumulate if a.kind == "max" else np.minimum.accumulate
    return acc(np.concatenate(([float(start)], x)))[1:]
