"""A broker's own subscriptions indexed by space and by one equality each, their other
literals written out as one Python function per index entry: where the events a flow's
owner derives go when none of them can leave the broker, and where a small batch of events
goes without a matcher pass (sans-IO; a part of :class:`~flowbus.routing.ring_flows.FlowSide`).

How it works: an owner routes what its folds derive (``compressed``, ``alarms``...) as a
publisher would, through the router's matcher, whose every pass has a fixed cost (the batch
encoded into arrays, the interval indexes, the kernel: ~55 us for one event with the stock
flow's 400 subscriptions) that a paced step of a few events pays in full. When no neighbour
has a subscription in the routing tables (a broker alone, or whose neighbours subscribe to
nothing), every effect of routing an event is a local delivery, and :class:`OwnIndex` gives
them without the matcher:

* **Built from the local table** whenever the tables change (``ContentRouter.changes``): each
  conjunction of each filter goes to the bucket of the space its first ``__space = "..."``
  names (none: the bucket every space reads), under its first ``field = "text"`` literal
  (none: with the bucket's others). Per bucket and text value, the conjunctions filed there
  become one generated function testing their remaining literals in turn: a comparison of a
  number field with a number, or of a text field with a text, inline; any other value, and
  any other literal, by the literal's compiled test.
* **An event** of space ``s`` reads the buckets of ``s`` and of every space: per field indexed
  there, the function of the event's value for it (when that value is a text; any other value
  tests every conjunction of the field in full), and the function of the unindexed ones. The
  tests are those the router's own index uses for the filters its matcher cannot take
  (:func:`~flowbus.routing.memo.compiled`, equal to the matcher: ``tests/matching``), the
  inline comparisons what those tests do for those types; so the deliveries are the
  router's, to the same subscriptions, in the order they were subscribed here
  (``tests/routing/test_flows_index.py`` compares the two on random filters and events).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from flowbus.core import DeliverAll, Effect
from flowbus.filters import Filter
from flowbus.filters.ast import Conjunction, Literal, Op, Predicate, value_class
from flowbus.filters.codegen import SOURCE, define
from flowbus.meta import SPACE
from flowbus.routing.memo import compiled

__all__ = ["OwnIndex"]

Event = Mapping[str, Any]
MatchFn = Callable[[Event, list[int]], None]  # adds the places of the conjunctions that hold
_INLINE = frozenset({Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ})  # (compared inline: see _inline)


class _Bucket:
    """The conjunctions of one space: per indexed field and text value, and the others."""

    def __init__(self, space_lit: Literal | None) -> None:
        self.space_lit = space_lit  # (true of every event read here: not tested again)
        self.by_field: dict[str, dict[str, list[tuple[int, Conjunction, Literal]]]] = {}
        self.rest: list[tuple[int, Conjunction, Literal | None]] = []
        self.fns: dict[str, dict[str, MatchFn]] = {}  # field -> text -> its conjunctions' function
        self.full: dict[str, list[tuple[int, Callable[[Event], bool]]]] = {}  # field -> every test
        self.rest_fn: MatchFn | None = None

    def add(self, i: int, c: Conjunction) -> None:
        for lit in c.literals:
            if _indexable(lit):
                assert isinstance(lit, Predicate) and isinstance(lit.value, str)
                self.by_field.setdefault(lit.attr, {}).setdefault(lit.value, []).append((i, c, lit))
                return
        self.rest.append((i, c, None))

    def build(self) -> None:
        for attr, by_value in self.by_field.items():
            self.fns[attr] = {v: _function(entries, self.space_lit) for v, entries in by_value.items()}
            every = [(i, c) for entries in by_value.values() for i, c, _ in entries]
            self.full[attr] = [(i, compiled(Filter((c,)))) for i, c in every]
        self.rest_fn = _function(self.rest, self.space_lit) if self.rest else None

    def match(self, event: Event, found: list[int]) -> None:
        for attr, fns in self.fns.items():
            v = event.get(attr)
            if type(v) is str:
                fn = fns.get(v)
                if fn is not None:
                    fn(event, found)
            else:  # (not a text: the index says nothing, every one is tested in full)
                found.extend(i for i, test in self.full[attr] if test(event))
        if self.rest_fn is not None:
            self.rest_fn(event, found)


def _indexable(lit: Literal) -> bool:
    return (
        type(lit) is Predicate
        and lit.op is Op.EQ
        and not lit.negated
        and type(lit.value) is str
        and lit.attr != SPACE
    )


Entries = Sequence[tuple[int, Conjunction, Literal | None]]


def _function(entries: Entries, space_lit: Literal | None) -> MatchFn:
    """One function adding to ``found`` the place of each of ``entries`` whose conjunction
    holds, its indexed literal and the bucket's space literal taken as true (see the module note)."""
    scope: dict[str, Any] = {}
    reads: dict[str, int] = {}
    body: list[str] = []
    for i, c, indexed in entries:
        conds = [_inline(lit, reads, scope) for lit in c.literals if lit != indexed and lit != space_lit]
        body.append(f"    if {' and '.join(conds) or 'True'}: found.append({i})")
    lines = ["def match(event, found):"]
    for attr, k in reads.items():
        lines.append(f"    v{k} = event.get({attr!r}); t{k} = type(v{k})")
        lines.append(f"    n{k} = t{k} is int or t{k} is float")
    fn: MatchFn = define("match", [*lines, *body, "    return None"], scope, where="<own index>")
    return fn


def _inline(lit: Literal, reads: dict[str, int], scope: dict[str, Any]) -> str:
    """An expression saying whether ``lit`` holds of ``event``: a number field compared with a
    number constant, or a text field with a text constant, inline (as the compiled test does
    for those types); else the literal's compiled test."""
    test = f"T{len(scope)}"
    scope[test] = compiled(Filter((Conjunction((lit,)),)))
    call = f"{test}(event)"
    if type(lit) is not Predicate or lit.op not in _INLINE:
        return call
    c = lit.value
    if lit.op is Op.EQ and type(c) is str:
        kind = "t{k} is str"
    elif value_class(c) == 1:
        kind = "n{k}"
    else:
        return call
    k = reads.setdefault(lit.attr, len(reads))
    const = f"C{len(scope)}"
    scope[const] = c
    holds = f"v{k} {SOURCE[lit.op]} {const}"
    if lit.negated:
        holds = f"not ({holds})"
    return f"(({holds}) if {kind.format(k=k)} else {call})"


class OwnIndex:
    """The local table of a broker's router, indexed (see the module note)."""

    def __init__(self) -> None:
        self.version: Any = None  # the tables' version the index is of
        self.alone = False  # whether no neighbour has a subscription in the tables
        self._subs: list[Hashable] = []  # the local subscriptions, in the order subscribed
        self._spaces: dict[str, _Bucket] = {}
        self._every = _Bucket(None)  # conjunctions that name no space

    def update(self, version: Any, me: int, sizes: Callable[[], Mapping[int, int]],
               table: Callable[[], Mapping[Any, Filter]]) -> None:  # fmt: skip
        """The tables are at ``version``: ``sizes`` gives each direction's filter count,
        ``table`` the local filters by origin ``(me, subscription)``, in the order subscribed."""
        if version == self.version:
            return
        self.version = version
        self.alone = not any(n for d, n in sizes().items() if d != me)
        self._subs, self._spaces, self._every = [], {}, _Bucket(None)
        if not self.alone:
            return
        for i, (origin, f) in enumerate(table().items()):
            self._subs.append(origin[1])
            for c in f.disjuncts:
                self._bucket(c).add(i, c)
        for bucket in (*self._spaces.values(), self._every):
            bucket.build()

    def _bucket(self, c: Conjunction) -> _Bucket:
        for lit in c.literals:
            if type(lit) is Predicate and lit.attr == SPACE and lit.op is Op.EQ and not lit.negated:
                if type(lit.value) is not str:
                    continue
                bucket = self._spaces.get(lit.value)
                if bucket is None:
                    bucket = self._spaces[lit.value] = _Bucket(lit)
                return bucket
        return self._every

    def route(self, events: Sequence[Event]) -> list[Effect] | None:
        """What routing ``events`` gives (a ``DeliverAll`` per event with subscribers here, as
        the router's ``route_batch`` with ``grouped``); None if the index cannot tell (not
        alone, or an event whose space is not a text)."""
        if not self.alone:
            return None
        spaces, every, subs = self._spaces, self._every, self._subs
        everywhere = bool(every.fns or every.rest_fn)
        out: list[Effect] = []
        for event in events:
            space = event.get(SPACE)
            if type(space) is not str:
                return None
            found: list[int] = []
            bucket = spaces.get(space)
            if bucket is not None:
                bucket.match(event, found)
            if everywhere:
                every.match(event, found)
            if found:
                if len(found) > 1:
                    found = sorted(set(found))
                out.append(DeliverAll(tuple([subs[i] for i in found]), event))
        return out
