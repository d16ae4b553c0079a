"""Recognising collapse rule sets that are plain per-key aggregates (last, max, min, count, sum).

How it works: :func:`as_aggregates` reads a :class:`~flowbus.flow.collapse.BoundRules`
as a decision list. Every literal of the guards (up to the first unconditional
rule; later rules never fire) becomes an *atom* -- a yes/no fact about the event
and the old row, with ``event.x``/``state.x``/key names resolved and ``maxP <
price`` the same atom as ``price > maxP`` -- and, treating the atoms as
independent, every valuation of them is run through the rules in order: the
first rule whose guard holds fires, each component getting that rule's
expression or keeping its old value (also when no rule fires). Independence
over-approximates (it also tries valuations no event can produce), so what is
recognised from the whole table holds for every real event. A component is

* ``last(X)`` when every valuation sets it to the same event-only ``X``;
* ``count`` / ``sum(X)`` when every valuation sets ``c`` to ``c + 1`` / ``c + X``;
* ``max(X)`` when it is set to ``X`` exactly in the valuations where the atom
  ``X > c`` holds (``X >= c``: ``inclusive``) and kept in all others; ``min``
  likewise with ``<`` / ``<=``.

A component that is anything else (a guard on another component or event field
that changes its outcome, an increment only under a guard, a value read from
another component) makes the whole rule set not an aggregate (None). ``X`` must
be a plain event field (a key read is its event field) or a constant: other
expressions can be undefined, and an undefined right-hand side makes its rule
not fire, which would change the other components' outcomes too. So the
components are independent: each one's new value depends only on the event and
its own old value, which :func:`fold_aggregates` applies component by component.

Precondition (what every space's events meet when they fit their schema): an
event carries the fields the aggregates read, numeric fields hold ``int`` or
``float`` values, and numbers (sums too) stay in the float range. Then, for any starting table
``T0`` and events, folding with ``bound.collapse`` (table ``T``) and with
:func:`fold_aggregates` (table ``R``) agree on every key:
``T.get(k, initial) == R.get(k, initial)``. ``R`` holds a row for every key
seen; ``T`` only for keys whose row changed (the sequential fold stores a row
only when it differs from the old one). :func:`fold_aggregates` raises
:class:`FlowError` on an event that breaks the precondition rather than differ.

For an engine computing the aggregates over a batch of events per key and
merging into the previous row ``old`` (``old`` is the initial row for a new key):
``last`` is the argument of the key's last event in arrival order; ``count`` is
``old + n``; ``sum`` is ``old + x1 + x2 ...`` (a float sum may round differently
in another order); ``max`` is the greatest of ``old`` and the arguments, where
NaN is skipped (it is ordered with nothing, so the fold never takes it) and
numbers compare as IEEE doubles (ints past 2**53 that compare equal: ``inclusive``
takes the later one, otherwise the earlier stays). ``min`` likewise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

from flowbus.errors import FlowError, Undefined
from flowbus.filters.ast import (
    FLIPPED,
    STRING_OPS,
    BinOp,
    Call,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Op,
    Predicate,
    compare,
    value_class,
    value_key,
)
from flowbus.filters.text import expr_to_text, value_to_text
from flowbus.flow.collapse import BoundRules, Key, Row
from flowbus.model import Value

__all__ = ["MAX_ATOMS", "Aggregate", "AggregateKind", "Aggregates", "as_aggregates", "fold_aggregates"]

AggregateKind = Literal["last", "max", "min", "count", "sum"]

MAX_ATOMS = 12
"""Rule sets whose guards hold more distinct literals than this are not analysed (None)."""


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One state component as an aggregate of its key's events.

    ``arg`` is an expression over the event's own field names (a :class:`Field`
    or a :class:`Const`; None for ``count``); ``initial`` the component's value
    in a new row. ``inclusive`` (``max``/``min`` only): the guard was ``>=`` /
    ``<=``, so an argument comparing equal replaces the held value.
    """

    component: str
    kind: AggregateKind
    arg: Field | Const | None
    initial: Value
    inclusive: bool = False

    def describe(self) -> str:
        """``maxP = max(price) from 0``, ``curP = last(price)``, ``n = count from 0``."""
        start = f" from {value_to_text(self.initial)}"
        if self.kind == "count":
            return f"{self.component} = count{start}"
        assert self.arg is not None
        call = f"{self.kind}({expr_to_text(self.arg)})"
        if self.kind == "last":
            return f"{self.component} = {call}"
        ties = " (ties replace)" if self.inclusive else ""
        return f"{self.component} = {call}{start}{ties}"


@dataclass(frozen=True, slots=True)
class Aggregates:
    """A collapse as plain aggregates: the key (state key name -> event field) and one per component.

    ``key`` is in the state's key order and ``components`` in row order, so a
    key and row of :func:`fold_aggregates` line up with those of the bound rules.
    """

    key: tuple[tuple[str, Field], ...]
    components: tuple[Aggregate, ...]

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.key)

    @property
    def key_fields(self) -> tuple[str, ...]:
        """The event fields the key is read from (group by these)."""
        return tuple(f.name for _, f in self.key)

    @property
    def initial(self) -> Row:
        """The row a key not seen before starts from."""
        return tuple(a.initial for a in self.components)

    def describe(self) -> list[str]:
        """The key, then one line per component (for ``flow explain``)."""
        key = ", ".join(f"{n}={f.name}" for n, f in self.key)
        return [f"key <{key}>", *(a.describe() for a in self.components)]


# ------------------------------------------------------------------ analysis


class _Refused(Exception):
    """The rule set is not a set of plain aggregates."""


_Outcome = tuple[str, Expr | None]
"""What one rule does to one component: ("keep", None), ("set", X), ("add", X) or ("other", e)."""
_KEEP: _Outcome = ("keep", None)
_AtomKey = tuple[Any, ...]


class _Names:
    """Resolves the names rules read: ``event.x`` for event fields (keys too), ``state.c`` for components."""

    def __init__(self, bound: BoundRules) -> None:
        self.keys: dict[str, str] = {}
        for name, e in bound.ruleset.key:
            if not isinstance(e, Field):
                raise _Refused(f"key {name!r} is computed, not a plain field")
            self.keys[name] = e.name
        self.components = frozenset(bound.components)

    def name(self, name: str) -> str:
        if name.startswith("event."):
            return name
        bare = name[6:] if name.startswith("state.") else name
        if bare in self.keys:
            return f"event.{self.keys[bare]}"  # a key read is the event field the key is read from
        if bare in self.components:
            return f"state.{bare}"
        if name.startswith("state."):
            raise _Refused(f"{name} is not a component")
        return f"event.{bare}"

    def expr(self, e: Expr) -> Expr:
        if isinstance(e, Field):
            return Field(self.name(e.name))
        if isinstance(e, Const):
            return e
        if isinstance(e, BinOp):
            return BinOp(e.op, self.expr(e.left), self.expr(e.right))
        return Call(e.name, tuple(self.expr(a) for a in e.args))


def _event_only(e: Expr) -> bool:
    return all(n.startswith("event.") for n in e.fields())


def _oriented(left: Expr, op: Op, right: Expr) -> _AtomKey:
    """``left OP right`` as an atom; ``a < b`` and ``b > a`` give the same one (they always agree)."""
    a: _AtomKey = ("x", left, op, right)
    if op in FLIPPED:
        b: _AtomKey = ("x", right, FLIPPED[op], left)
        return min(a, b, key=repr)
    return a


def _atom(lit: Predicate | ExprPredicate, names: _Names) -> tuple[_AtomKey, bool]:
    """The atom of a literal (its positive form) and whether the literal negates it."""
    if isinstance(lit, ExprPredicate):
        return _oriented(names.expr(lit.left), lit.op, names.expr(lit.right)), lit.negated
    attr = Field(names.name(lit.attr))
    value = lit.value
    if value is not None and not isinstance(value, tuple) and (lit.op in FLIPPED or lit.op in STRING_OPS):
        # attr OP constant holds exactly when the expression literal does (the compiler relies on it too)
        return _oriented(attr, lit.op, Const(value)), lit.negated
    vk = tuple(value_key(v) for v in value) if isinstance(value, tuple) else value
    return ("p", attr, lit.op, vk), lit.negated


def _outcome(e: Expr | None, component: str, names: _Names) -> _Outcome:
    if e is None:
        return _KEEP
    own = Field(f"state.{component}")
    ce = names.expr(e)
    if ce == own:
        return _KEEP
    if isinstance(ce, (Field, Const)) and _event_only(ce):
        return ("set", ce)
    if isinstance(ce, BinOp) and ce.op == "+":
        for mine, other in ((ce.left, ce.right), (ce.right, ce.left)):
            if mine == own and isinstance(other, (Field, Const)) and _event_only(other):
                return ("add", other)
    return ("other", ce)


_Guard = list[list[tuple[int, bool]]]
"""A guard over atoms: a disjunction of conjunctions of (atom index, negated)."""


def _holds(guard: _Guard, valuation: int) -> bool:
    return any(all(bool(valuation >> i & 1) != neg for i, neg in conj) for conj in guard)


def as_aggregates(bound: BoundRules) -> Aggregates | None:
    """The collapse ``bound`` as plain aggregates, or None when it is not exactly one (see the module doc)."""
    try:
        return _analyse(bound)
    except _Refused:
        return None


def _analyse(bound: BoundRules) -> Aggregates:
    names = _Names(bound)
    rules = list(bound.ruleset.rules)
    last = next((i for i, r in enumerate(rules) if r.when == Filter.true()), len(rules) - 1)
    rules = rules[: last + 1]
    atoms: dict[_AtomKey, int] = {}
    guards: list[_Guard] = []
    for rule in rules:
        guard: _Guard = []
        for conj in rule.when.disjuncts:
            lits = []
            for lit in conj.literals:
                key, neg = _atom(lit, names)
                lits.append((atoms.setdefault(key, len(atoms)), neg))
            guard.append(lits)
        guards.append(guard)
    if len(atoms) > MAX_ATOMS:
        raise _Refused(f"{len(atoms)} distinct guard literals")
    effects = [{c: _outcome(dict(r.sets).get(c), c, names) for c in bound.components} for r in rules]
    table: list[int | None] = []  # the rule that fires in each valuation
    for valuation in range(1 << len(atoms)):
        table.append(next((i for i, g in enumerate(guards) if _holds(g, valuation)), None))
    keys = list(atoms)
    out = []
    for c, init in zip(bound.components, bound.initial, strict=True):
        outcomes = [_KEEP if i is None else effects[i][c] for i in table]
        out.append(_classify(c, init, outcomes, keys, bound))
    key = tuple((n, Field(names.keys[n])) for n in bound.key_names)
    return Aggregates(key, tuple(out))


_EXTREMES: tuple[tuple[Op, AggregateKind, bool], ...] = (
    (Op.GT, "max", False),
    (Op.GE, "max", True),
    (Op.LT, "min", False),
    (Op.LE, "min", True),
)
"""``X OP c`` guarding ``c = X``: the aggregate, and whether an equal ``X`` replaces ``c``."""


def _classify(
    c: str, init: Value, outcomes: list[_Outcome], atoms: list[_AtomKey], bound: BoundRules
) -> Aggregate:
    kinds = set(outcomes)
    if len(kinds) == 1:
        ((what, x),) = kinds
        if what == "set":
            assert isinstance(x, (Field, Const))
            return Aggregate(c, "last", _bare(x), init)
        if what == "add":
            assert isinstance(x, (Field, Const))
            _need_number(init, c)
            if _kind(x, bound) not in (int, float):
                raise _Refused(f"{c} adds a non-number")
            if x == Const(1):
                return Aggregate(c, "count", None, init)
            return Aggregate(c, "sum", _bare(x), init)
        raise _Refused(f"{c} is not an aggregate")
    if len(kinds) != 2 or _KEEP not in kinds:
        raise _Refused(f"{c} is not an aggregate")
    ((what, x),) = kinds - {_KEEP}
    if what != "set":
        raise _Refused(f"{c} is changed only under a guard")
    assert isinstance(x, (Field, Const))
    own = Field(f"state.{c}")
    for j, atom in enumerate(atoms):
        if any((o != _KEEP) != bool(v >> j & 1) for v, o in enumerate(outcomes)):
            continue
        for op, kind, inclusive in _EXTREMES:
            if atom == _oriented(x, op, own):
                _need_comparable(init, _kind(x, bound), c)
                return Aggregate(c, kind, _bare(x), init, inclusive)
    raise _Refused(f"{c} is set under a guard that is not a comparison with its argument")


def _bare(x: Field | Const) -> Field | Const:
    """The argument over the event's own field names."""
    return Field(x.name[len("event.") :]) if isinstance(x, Field) else x


def _kind(x: Field | Const, bound: BoundRules) -> type:
    if isinstance(x, Const):
        return type(x.value)
    return bound.event.type_of(x.name[len("event.") :])


def _need_number(init: Value, c: str) -> None:
    if type(init) not in (int, float):
        raise _Refused(f"{c} does not start from a number")


def _need_comparable(init: Value, kind: type, c: str) -> None:
    """max/min: the argument and the initial value are both numbers or both strings, not NaN."""
    if type(init) is float and math.isnan(init):
        raise _Refused(f"{c} starts from NaN, which compares with nothing")
    numbers = (int, float)
    if not ((type(init) in numbers and kind in numbers) or (type(init) is str and kind is str)):
        raise _Refused(f"{c}: its argument and initial value do not compare")


# ------------------------------------------------------------------ reference fold


def fold_aggregates(
    aggs: Aggregates, events: Iterable[Mapping[str, Any]], state: Mapping[Key, Row] | None = None
) -> dict[Key, Row]:
    """The table after folding ``events`` into ``state`` (not changed) with ``aggs``, component by component.

    An event without a key field is skipped (as the sequential fold skips an
    event whose key is undefined); every other event gives its key a row. Raises
    :class:`FlowError` on an event that breaks the module's precondition.
    """
    table = dict(state) if state is not None else {}
    fields = aggs.key_fields
    initial = aggs.initial
    steps = list(enumerate(aggs.components))
    for ev in events:
        try:
            key = tuple([ev[f] for f in fields])
        except KeyError:
            continue
        old = table.get(key, initial)
        table[key] = tuple([_step(agg, old[i], ev) for i, agg in steps])
    return table


def _step(agg: Aggregate, held: Value, ev: Mapping[str, Any]) -> Value:
    if agg.kind == "count":
        return _add(held, 1, agg, ev)
    x = _arg(agg, ev)
    if agg.kind == "last":
        return x
    if agg.kind == "sum":
        return _add(held, x, agg, ev)
    try:
        return x if compare(x, _STEP_OPS[agg.kind, agg.inclusive], held) else held
    except OverflowError:  # an int past the float range (the rules' guard fails alike)
        raise FlowError(f"{agg.describe()}: event {_show(ev)}: {x!r} is out of the float range") from None


_STEP_OPS = {("max", False): Op.GT, ("max", True): Op.GE, ("min", False): Op.LT, ("min", True): Op.LE}


def _arg(agg: Aggregate, ev: Mapping[str, Any]) -> Value:
    assert agg.arg is not None
    try:
        value: Value = agg.arg.evaluate(ev, {})
    except Undefined:
        raise FlowError(f"{agg.describe()}: event {_show(ev)} has no field {expr_to_text(agg.arg)}") from None
    return value


def _add(held: Value, x: Value, agg: Aggregate, ev: Mapping[str, Any]) -> Value:
    if value_class(held) != 1 or value_class(x) != 1:
        raise FlowError(f"{agg.describe()}: event {_show(ev)}: {held!r} + {x!r} is not a sum of numbers")
    assert isinstance(held, (int, float)) and isinstance(x, (int, float))
    try:
        total: Value = held + x
    except OverflowError:
        raise FlowError(f"{agg.describe()}: event {_show(ev)}: {held!r} + {x!r} overflows") from None
    return total


def _show(ev: Mapping[str, Any]) -> str:
    items = ", ".join(f"{k}: {v!r}" for k, v in islice(ev.items(), 8))
    return f"{{{items}{', ...' if len(ev) > 8 else ''}}}"
