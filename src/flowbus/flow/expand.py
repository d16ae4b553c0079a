"""Expand: the shortest event sequence taking one state to another, by A* (000 document, section 4.2).

How it works. Rows of different keys are independent (an event touches the row
its key selects), so a multi-key expansion is one search per key whose row
differs, the sequences concatenated in key order. For one key:

* **Graph.** Vertices are rows (the components the rule set sets); an edge is
  one event, of unit cost. Candidate events carry the key, and for every other
  field a value taken from the start row, the goal row, the key and the rules'
  constants (of the field's type) -- the values the paper's search draws from.
* **One step first.** If one candidate event takes the start to the goal, that
  is the answer (the start differs from the goal, so none is shorter).
* **A\\*.** Forward from the start, ordered by ``f = g + h`` (ties: smaller
  ``h``, then first generated); the goal is recognised when popped, so the path
  is shortest whenever ``h`` never overestimates.
* **The estimator** is the exact solution of a relaxed problem, as in the
  paper. Each rule changes a fixed set of columns; forgetting guards and
  values (the *unconstrained* extension, extra edges only), reaching the goal
  needs a last event whose rule can produce the goal's values -- a rule that
  replaces two columns by one parameter cannot end in a goal where they differ
  (the paper's "the first row is blocked"), nor a constant column end in another
  value -- and before it, a cover of the other differing columns by rules'
  column sets. ``h(s) = min over such last rules r of 1 + cover(D(s) - cols(r))``,
  with ``D(s)`` the columns where ``s`` differs from the goal. Each real event
  changes at most one rule's columns, so ``h`` is admissible and consistent; in
  *uniform unconstrained* form (every rule replaces ``k`` columns by distinct
  parameters, every ``k`` columns have a rule) it is exactly ``ceil(m / k)``.
  For the paper's example the start ``<160, 140>`` gets 2, ``<200, 200>`` gets
  1, and A* expands two states.
* **No answer.** When no rule can produce the goal, or the search exhausts the
  (finite, for replacement rules) rows reachable with the candidate values, or
  no sequence fits ``max_cost``, or ``max_states`` rows were expanded,
  :class:`ExpandError` says so.
* **With a backlog** (:func:`shorten`). After a disconnect the events actually
  published (or what the subscriber would have been sent) take the start to the
  goal, so an answer exists -- possibly only with values no row holds (rules
  ``y <- v when x > 100 & v < 10; x <- v when v < 200``: ``[150, 7, 50]`` takes
  ``<0, 0>`` to ``<50, 7>``, and no candidate is between 100 and 200). The
  backlog bounds the search: one of its events alone, or one read off the goal;
  else A* over the usual candidates for something shorter than the backlog;
  then, unless that met the lower bound ``h(start)``, A* again with each read
  field's values from the backlog's events as well (when that combines into
  more than ``MAX_CANDIDATES`` events, the usual ones and the backlog's events
  as they are), for something shorter still. Each search stops after
  ``MAX_STEPS`` rule applications or ``max_states`` states. What is left is the
  best found, else the backlog: never longer than the backlog, never an error,
  and the shortest over those values whenever the searches complete.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus.errors import ExpandError, FlowError
from flowbus.filters.ast import Const, Expr, Field, Filter, value_key
from flowbus.flow.collapse import BoundRules, Key, Row
from flowbus.flow.rulecode import goal_function
from flowbus.model import Value

__all__ = [
    "Expansion",
    "KeyExpansion",
    "analyse",
    "candidate_events",
    "expand",
    "expand_key",
    "rows_from_json",
    "shorten",
]

MAX_STATES = 200_000
MAX_CANDIDATES = 50_000
MAX_STEPS = 1_000_000
"""The most rule applications (states expanded x candidate events) one search of :func:`shorten` makes."""


# ------------------------------------------------------------------ analysis


@dataclass(frozen=True, slots=True)
class Form:
    """What the paper calls the rule set's form, and ``k`` (most columns one rule replaces)."""

    kind: str  # "uniform unconstrained", "unconstrained", "constrained" or "general"
    k: int


def _fits(kind: type, value: Value) -> bool:
    if kind is float:
        return type(value) in (int, float)
    return type(value) is kind


TYPES_ZERO: dict[type, Value] = {str: "", int: 0, float: 0.0, bool: False}


def _as(kind: type, value: Value) -> Value:
    return float(value) if kind is float and type(value) is int else value


def _typed(pool: Iterable[Value], kind: type) -> list[Value]:
    seen: dict[Any, Value] = {}
    for v in pool:
        if _fits(kind, v):
            v = _as(kind, v)
            seen.setdefault(value_key(v), v)
    if kind is bool:
        seen.setdefault(value_key(True), True)
        seen.setdefault(value_key(False), False)
    return [seen[k] for k in sorted(seen)]


@dataclass(frozen=True, slots=True)
class _Shape:
    """One rule seen as a row of the paper's replacement table."""

    mask: int  # the columns it sets
    params: tuple[tuple[int, str, type], ...]  # column <- a free event field (of that type)
    consts: tuple[tuple[int, Value], ...]  # column <- a constant
    keyed: tuple[tuple[int, int], ...]  # column <- the key's component at that position
    other: bool  # some column <- an expression of the state or arithmetic


class Expander:
    """What a rule set's searches share: its analysis, column masks, constants and set covers."""

    def __init__(self, bound: BoundRules) -> None:
        self.bound = bound
        self.index = {c: i for i, c in enumerate(bound.components)}
        exprs = dict(bound.ruleset.key)
        self.keyed = {e.name: i for i, n in enumerate(bound.key_names) if isinstance(e := exprs[n], Field)}
        self.key_fields = [(n, k, self.keyed[n]) for n, k in bound.event.fields.items() if n in self.keyed]
        self.shapes = [self._shape(r.sets) for r in bound.ruleset.rules]
        self.masks = sorted({sh.mask for sh in self.shapes} - {0})
        reads = frozenset().union(*(r.reads() for r in bound.ruleset.rules))
        self.read = {n for n in bound.event if n in reads or f"event.{n}" in reads}
        self.constants = bound.ruleset.constants()
        self.form = self._analyse()
        self._cover: dict[int, float] = {0: 0}
        plan = self._off_goal()
        self.goal_event = None if plan is None else goal_function(plan)
        """``(key, goal) -> event``: the one event read off ``goal`` when the first rule writes
        any row in one event (see :meth:`_off_goal`) -- what :func:`expand_key` finds first from any
        other row (:meth:`direct`'s first event, which that rule takes to the goal), without the
        search; None from it: search. None: the rules have no such first rule."""

    def event_field(self, e: Expr) -> str | None:
        """The event field ``e`` reads, if ``e`` is just that field (``price`` or ``event.price``)."""
        if not isinstance(e, Field):
            return None
        name = e.name[6:] if e.name.startswith("event.") else e.name
        if name not in self.bound.event:
            return None
        own = name in self.bound.components or name in self.bound.key_names
        if e.name == name and own and name not in self.keyed:
            return None
        return name

    def _shape(self, sets: tuple[tuple[str, Expr], ...]) -> _Shape:
        params, consts, keyed, other = [], [], [], False
        for name, e in sets:
            col = self.index[name]
            field = self.event_field(e)
            if isinstance(e, Const):
                consts.append((col, e.value))
            elif field is None:
                other = True
            elif field in self.keyed:
                keyed.append((col, self.keyed[field]))
            else:
                params.append((col, field, self.bound.event.type_of(field)))
        mask = sum(1 << self.index[n] for n, _ in sets)
        return _Shape(mask, tuple(params), tuple(consts), tuple(keyed), other)

    def _analyse(self) -> Form:
        k = max((sh.mask.bit_count() for sh in self.shapes), default=0)
        if any(sh.other for sh in self.shapes):
            return Form("general", k)
        for sh in self.shapes:
            fields = [f for _, f, _ in sh.params]
            if sh.consts or sh.keyed or len(fields) != len(set(fields)):
                return Form("constrained", k)  # a column fixed, or two columns sharing one parameter
        if all(m.bit_count() == k for m in self.masks) and len(self.masks) == math.comb(len(self.index), k):
            return Form("uniform unconstrained", k)
        return Form("unconstrained", k)

    def _off_goal(self) -> tuple[tuple[str, int, type], ...] | None:
        """When the first rule has no guard and sets every column from an event field of its own
        (the key's fields and those make the whole event): each field's source, ``(field, column,
        type)``, with column -1 - i for the key's component i. Else None."""
        first = self.shapes[0] if self.shapes else None
        if first is None or self.bound.ruleset.rules[0].when != Filter.true():
            return None
        fields = [f for _, f, _ in first.params]
        if first.other or first.consts or first.keyed or len(set(fields)) != len(fields):
            return None
        if first.mask != (1 << len(self.index)) - 1 or len(self.key_fields) + len(fields) != len(
            self.bound.event
        ):
            return None
        return (
            *((f, -1 - pos, kind) for f, kind, pos in self.key_fields),
            *((f, col, kind) for col, f, kind in first.params),
        )

    def can_end_in(self, shape: _Shape, key: Key, goal: Row) -> bool:
        """Can the rule of ``shape`` produce the goal's values (guards ignored)?"""
        for col, value in shape.consts:
            if goal[col] != value:
                return False
        for col, pos in shape.keyed:
            if goal[col] != key[pos]:
                return False
        seen: dict[str, Value] = {}
        for col, field, kind in shape.params:
            want = goal[col]
            if not _fits(kind, want) or seen.setdefault(field, want) != want:
                return False
        return True

    def direct(self, key: Key, goal: Row) -> list[dict[str, Value]]:
        """Events read off the goal: for each rule that can end in it and sets a column from every
        event field the rules read, the event carrying those columns' goal values (tried first)."""
        out: list[dict[str, Value]] = []
        for shape in self.shapes:
            if shape.other or not self.can_end_in(shape, key, goal):
                continue
            event = {f: _as(kind, key[pos]) for f, kind, pos in self.key_fields}
            for col, field, kind in shape.params:
                event[field] = _as(kind, goal[col])
            if len(event) == len(self.bound.event) and event not in out:
                out.append(event)
        return out

    def cover(self, mask: int) -> float:
        """The fewest rule column sets covering ``mask`` (exact set cover, memoised)."""
        known = self._cover.get(mask)
        if known is not None:
            return known
        low = mask & -mask
        best = math.inf
        for m in self.masks:
            if m & low:
                best = min(best, 1 + self.cover(mask & ~m))
        self._cover[mask] = best
        return best

    def _values(
        self, key: Key, start: Row, goal: Row, backlog: Sequence[Mapping[str, Value]] = ()
    ) -> list[tuple[str, list[Value]]]:
        """Each event field's candidate values: the key's own, or the pool's (and the backlog's values of
        that field) for a field the rules read, one value for a field they do not."""
        pool = [*start, *goal, *key, *self.constants]
        fields: list[tuple[str, list[Value]]] = []
        for name, kind in self.bound.event.fields.items():
            if name in self.keyed:
                fields.append((name, [_as(kind, key[self.keyed[name]])]))
            elif name in self.read:
                fields.append((name, _typed([*pool, *(ev[name] for ev in backlog if name in ev)], kind)))
            else:
                fields.append((name, _typed(pool, kind)[:1] or [TYPES_ZERO[kind]]))
        return fields

    def _events(self, fields: list[tuple[str, list[Value]]]) -> list[dict[str, Value]]:
        size = math.prod(len(v) for _, v in fields)
        if size > MAX_CANDIDATES:
            raise ExpandError(f"{self.bound.where}: {size} candidate events per state: too many to search")
        names = [n for n, _ in fields]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in fields))]

    def candidates(self, key: Key, start: Row, goal: Row) -> list[dict[str, Value]]:
        """The events tried for ``key``: the key's fields fixed, the others from the value pool."""
        return self._events(self._values(key, start, goal))

    def backlog_candidates(
        self, key: Key, start: Row, goal: Row, backlog: Sequence[Mapping[str, Value]]
    ) -> Sequence[Mapping[str, Value]] | None:
        """The candidates with the backlog's values too (each field's values from the backlog's events);
        when that makes too many, the usual candidates and the backlog's events as they are. None when
        the backlog brings no new value, or even that is too many."""
        usual = self._values(key, start, goal)
        fields = self._values(key, start, goal, backlog)
        if fields == usual:
            return None
        try:
            return self._events(fields)
        except ExpandError:
            pass
        distinct = {tuple(value_key(v) for v in ev.values()): ev for ev in backlog}
        try:
            events = [*self._events(usual), *distinct.values()]
        except ExpandError:
            return None
        return events if len(events) <= MAX_CANDIDATES else None


_EXPANDERS: weakref.WeakKeyDictionary[BoundRules, Expander] = weakref.WeakKeyDictionary()


def expander(bound: BoundRules) -> Expander:
    """The (cached) :class:`Expander` of ``bound``."""
    found = _EXPANDERS.get(bound)
    if found is None:
        found = _EXPANDERS[bound] = Expander(bound)
    return found


def analyse(bound: BoundRules) -> Form:
    """The form of ``bound``'s rules: replacement (every column set to a parameter or a constant) or not."""
    return expander(bound).form


def candidate_events(bound: BoundRules, key: Key, start: Row, goal: Row) -> list[dict[str, Value]]:
    """The events the search tries for ``key``: the key's fields fixed, the others from the value pool."""
    return expander(bound).candidates(key, start, goal)


class Heuristic:
    """``h(row)``: the relaxed problem's exact distance to ``goal`` (see the module notes)."""

    def __init__(self, bound: BoundRules, key: Key, goal: Row) -> None:
        x = expander(bound)
        self.goal = goal
        self._cover = x.cover
        self._last = sorted({sh.mask for sh in x.shapes if x.can_end_in(sh, key, goal)})
        self._h: dict[int, float] = {}

    def __call__(self, row: Row) -> float:
        diff = 0
        for i, (a, b) in enumerate(zip(row, self.goal, strict=True)):
            if a != b:
                diff |= 1 << i
        if diff == 0:
            return 0
        known = self._h.get(diff)
        if known is None:
            known = min((1 + self._cover(diff & ~m) for m in self._last), default=math.inf)
            self._h[diff] = known
        return known


# -------------------------------------------------------------------- search


@dataclass(frozen=True, slots=True)
class KeyExpansion:
    key: Key
    start: Row
    goal: Row
    events: tuple[Mapping[str, Value], ...]
    states_expanded: int
    states_generated: int


@dataclass(frozen=True, slots=True)
class Expansion:
    """The merged sequence for all keys, and what the search cost."""

    events: tuple[Mapping[str, Value], ...]
    keys: tuple[KeyExpansion, ...]
    form: Form
    seconds: float

    @property
    def states_expanded(self) -> int:
        return sum(k.states_expanded for k in self.keys)

    @property
    def states_generated(self) -> int:
        return sum(k.states_generated for k in self.keys)


def row_text(bound: BoundRules, key: Key, row: Row) -> str:
    parts = ", ".join(f"{c}={v!r}" for c, v in zip(bound.components, row, strict=True))
    return f"<{', '.join(repr(k) for k in key)}: {parts}>"


def expand_key(
    bound: BoundRules,
    key: Key,
    start: Row,
    goal: Row,
    *,
    max_cost: int | None = None,
    max_states: int = MAX_STATES,
) -> KeyExpansion:
    """The shortest event sequence taking row ``start`` of ``key`` to ``goal`` (else :class:`ExpandError`)."""
    if start == goal:
        return KeyExpansion(key, start, goal, (), 0, 0)
    for ev in expander(bound).direct(key, goal):  # one event read off the goal: nothing is shorter
        if bound.step(key, start, ev) == goal:
            return KeyExpansion(key, start, goal, (ev,), 1, 1)
    rows = f"{row_text(bound, key, start)} to {row_text(bound, key, goal)}"
    what = f"{bound.where}: no event sequence takes {rows}"
    h = Heuristic(bound, key, goal)
    h0 = h(start)
    if h0 == math.inf:
        raise ExpandError(f"{what}: no rule can produce the goal's values")
    if max_cost is not None and h0 > max_cost:
        raise ExpandError(f"{what} in at most {max_cost} events (at least {int(h0)} are needed)")
    events = candidate_events(bound, key, start, goal)
    for ev in events:  # one step: nothing is shorter
        if bound.step(key, start, ev) == goal:
            return KeyExpansion(key, start, goal, (ev,), 1, len(events))
    found = _astar(bound, key, start, goal, events, h, max_cost, max_states)
    if found.events is not None:
        return KeyExpansion(key, start, goal, found.events, found.expanded, found.generated)
    if found.gave_up:
        raise ExpandError(f"{what}: search gave up after {max_states} states")
    bound_text = f" in at most {max_cost} events" if max_cost is not None else ""
    raise ExpandError(
        f"{what}{bound_text} (events tried: values from the start, the goal, the key and the rules' "
        "constants)"
    )


def shorten(
    bound: BoundRules,
    key: Key,
    start: Row,
    goal: Row,
    backlog: Sequence[Mapping[str, Value]],
    *,
    max_states: int = MAX_STATES,
) -> KeyExpansion:
    """The shortest sequence taking ``start`` to ``goal`` found with the help of ``backlog``, events that
    do (those actually published): never longer than the backlog, and never an error.

    One of the backlog's events alone (the latest), or one read off the goal; else A* over the usual
    candidates, then (unless that met the lower bound ``h``) over candidates with the backlog's values
    too, each looking for something shorter than the best so far (at most :data:`MAX_STEPS` rule
    applications each); else the backlog itself.
    """
    events = tuple(backlog)
    if start == goal or len(events) <= 1:
        return KeyExpansion(key, start, goal, () if start == goal else events, 0, 0)
    x = expander(bound)
    h = Heuristic(bound, key, goal)
    if h(start) <= 1:  # one event may do (h never overestimates): the latest of the backlog's that does
        for ev in (*reversed(events), *x.direct(key, goal)):
            if bound.step(key, start, ev) == goal:
                return KeyExpansion(key, start, goal, (ev,), 0, 0)
    best, expanded, generated = events, 0, 0
    stages: tuple[Callable[[], Sequence[Mapping[str, Value]] | None], ...] = (
        lambda: x.candidates(key, start, goal),
        lambda: x.backlog_candidates(key, start, goal, events),
    )
    for stage in stages:
        if len(best) <= h(start):
            break  # as short as the lower bound: nothing is shorter
        try:
            candidates = stage()
        except ExpandError:
            continue  # too many candidate events
        if not candidates:
            continue
        limit = min(max_states, MAX_STEPS // len(candidates))
        found = _astar(bound, key, start, goal, candidates, h, len(best) - 1, limit)
        expanded, generated = expanded + found.expanded, generated + found.generated
        if found.events is not None:
            best = found.events
    return KeyExpansion(key, start, goal, best, expanded, generated)


@dataclass(frozen=True, slots=True)
class _Search:
    """What one A* run found (``events`` None: nothing within its bounds) and what it cost."""

    events: tuple[Mapping[str, Value], ...] | None
    expanded: int
    generated: int
    gave_up: bool  # stopped after max_states states


def _astar(
    bound: BoundRules,
    key: Key,
    start: Row,
    goal: Row,
    events: Sequence[Mapping[str, Value]],
    h: Heuristic,
    max_cost: int | None,
    max_states: int,
) -> _Search:
    h0 = h(start)
    tie = itertools.count()
    heap: list[tuple[float, float, int, Row]] = [(h0, h0, next(tie), start)]
    best: dict[Row, int] = {start: 0}
    parent: dict[Row, tuple[Row, Mapping[str, Value]]] = {}
    expanded = generated = 0
    while heap:
        f, hv, _, row = heapq.heappop(heap)
        cost = int(f - hv)
        if cost > best[row]:
            continue  # a stale entry
        if row == goal:
            return _Search(_path(parent, start, goal), expanded, generated, False)
        expanded += 1
        if expanded > max_states:
            return _Search(None, expanded - 1, generated, True)
        for ev in events:
            nxt = bound.step(key, row, ev)
            if nxt is None or nxt == row or cost + 1 >= best.get(nxt, math.inf):
                continue
            generated += 1
            hn = h(nxt)
            if hn == math.inf or (max_cost is not None and cost + 1 + hn > max_cost):
                continue
            best[nxt] = cost + 1
            parent[nxt] = (row, ev)
            heapq.heappush(heap, (cost + 1 + hn, hn, next(tie), nxt))
    return _Search(None, expanded, generated, False)


def _path(
    parent: Mapping[Row, tuple[Row, Mapping[str, Value]]], start: Row, goal: Row
) -> tuple[Mapping[str, Value], ...]:
    out: list[Mapping[str, Value]] = []
    row = goal
    while row != start:
        row, ev = parent[row]
        out.append(ev)
    return tuple(reversed(out))


def expand(
    bound: BoundRules,
    start: Mapping[Key, Row],
    goal: Mapping[Key, Row],
    *,
    max_cost: int | None = None,
    max_states: int = MAX_STATES,
) -> Expansion:
    """The shortest sequence taking every key of ``goal`` from its ``start`` row (initial if absent)."""
    t0 = time.perf_counter()
    results: list[KeyExpansion] = []
    used = 0
    for key in sorted(goal, key=lambda k: tuple(value_key(v) for v in k)):
        budget = None if max_cost is None else max_cost - used
        r = expand_key(
            bound, key, start.get(key, bound.initial), goal[key], max_cost=budget, max_states=max_states
        )
        used += len(r.events)
        results.append(r)
    events = tuple(ev for r in results for ev in r.events)
    return Expansion(events, tuple(results), analyse(bound), time.perf_counter() - t0)


def rows_from_json(
    bound: BoundRules, state_fields: Mapping[str, type], data: object, what: str
) -> dict[Key, Row]:
    """Rows from ``{"name": "IBM", "maxP": 160, ...}`` or a list of such (the key and tracked components)."""
    items = data if isinstance(data, list) else [data]
    rows: dict[Key, Row] = {}
    for item in items:
        if not isinstance(item, Mapping):
            raise FlowError(
                f'{what}: a state row is an object like {{"{bound.key_names[0]}": ...}}, got {item!r}'
            )
        for name in (*bound.key_names, *bound.components):
            if name not in item:
                raise FlowError(f"{what}: missing {name!r} in {dict(item)!r}")
            kind = state_fields[name]
            if not _fits(kind, item[name]):
                raise FlowError(f"{what}: {name!r} must be {kind.__name__}, got {item[name]!r}")
        unknown = [n for n in item if n not in state_fields]
        if unknown:
            raise FlowError(f"{what}: {unknown[0]!r} is not a field of the state ({', '.join(state_fields)})")
        key = tuple(item[n] for n in bound.key_names)
        rows[key] = tuple(_as(state_fields[c], item[c]) for c in bound.components)
    return rows
