"""Collapse rules: folding an event into a keyed state (000 document, section 2, "Collapse").

How it works: a :class:`RuleSet` is the paper's pattern rule. Its ``key`` maps
each key component of the state to an expression over the event's fields (for
``[n, p, v], <n: ...>`` the state key ``name`` is the event's ``n``), so the
event selects one row of the keyed relation; a row not seen before starts from
the state's initial values. Its :class:`Rule` s are tried in order: the first
whose guard (``when``, a filter) holds and whose assignments are all defined
fires, and sets some components to expressions of the event's fields and the
row's *old* values (all right-hand sides read the state before the event). When
no rule fires the row is unchanged. The stock example::

    key: {name: name}
    rules:
      - when: price > maxP          # [n, p], <n: p > maxP, curP>  =>  <n: p, p>
        set: {maxP: price, curP: price}
      - set: {curP: price}          # [n, p], <n: maxP, curP>      =>  <n: maxP, p>

Inside rules a bare name is an event field, a state component or a key
component; ``event.x`` and ``state.x`` say which when a name is both (a bare
name that is both is refused, unless it is a key read from the same-named
field). :class:`BoundRules` is a rule set bound to an event schema and a state
layout -- checked once, compiled once -- and is what the interpreter's collapse
arcs and the expand search (:mod:`flowbus.flow.expand`) run. For an expand arc
the layout is only the components the rules set (the arc "tracks" those).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flowbus.errors import FlowError, Undefined
from flowbus.filters.ast import BinOp, Const, Expr, ExprPredicate, Field, Filter, Functions, Predicate
from flowbus.filters.codegen import define
from flowbus.filters.compile import ALWAYS, Compiler, ExprFn, TestFn, expressions_of, shared_subexpressions
from flowbus.filters.text import expr_to_text
from flowbus.flow.infer import check_assign, check_expr, check_filter, hint, with_builtins
from flowbus.model import Schema, Value

__all__ = ["BoundRules", "Key", "Row", "Rule", "RuleSet"]

Key = tuple[Value, ...]
Row = tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Rule:
    """``when`` holds (a filter; true by default): set each component to its expression."""

    sets: tuple[tuple[str, Expr], ...]
    when: Filter = field(default_factory=Filter.true)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sets", tuple(self.sets))
        names = [name for name, _ in self.sets]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise FlowError(f"rule sets {', '.join(sorted(dup))} twice")

    def reads(self) -> frozenset[str]:
        """The names the guard and the right-hand sides read."""
        return self.when.fields().union(*(e.fields() for _, e in self.sets))


@dataclass(frozen=True, slots=True)
class RuleSet:
    """A named collapse rule set: state key component -> event expression, and the rules in order."""

    name: str
    key: tuple[tuple[str, Expr], ...]
    rules: tuple[Rule, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "rules", tuple(self.rules))
        if not self.key:
            raise FlowError(f"rule set {self.name!r}: no key (which event field selects the state row?)")
        if not self.rules:
            raise FlowError(f"rule set {self.name!r}: no rules")

    def sets(self) -> frozenset[str]:
        """The components some rule sets (what an expand arc with these rules tracks)."""
        return frozenset(name for rule in self.rules for name, _ in rule.sets)

    def constants(self) -> list[Value]:
        """Every constant in the guards and right-hand sides (candidate event values for expand)."""
        out: list[Value] = []
        for rule in self.rules:
            for conj in rule.when.disjuncts:
                for lit in conj.literals:
                    out.extend(literal_constants(lit))
            for _, e in rule.sets:
                out.extend(_constants(e))
        return out


def _constants(e: Expr) -> list[Value]:
    if isinstance(e, Const):
        return [e.value]
    if isinstance(e, Field):
        return []
    children = (e.left, e.right) if isinstance(e, BinOp) else e.args
    return [c for child in children for c in _constants(child)]


class BoundRules:
    """A rule set bound to an event schema and a state layout, checked and compiled.

    ``components`` is the row layout (state components in schema order);
    ``initial`` the row a new key starts from. Raises :class:`FlowError` naming
    ``where`` when the rules do not fit.
    """

    def __init__(
        self,
        rules: RuleSet,
        *,
        event: Schema,
        state: Schema,
        key_names: tuple[str, ...],
        components: tuple[str, ...],
        initial: Row,
        functions: Functions,
        where: str,
    ) -> None:
        self.ruleset = rules
        self.event = event
        self.key_names = key_names
        self.components = components
        self.initial = initial
        self.where = where
        self._index = {c: i for i, c in enumerate(components)}
        fns = self.functions = with_builtins(functions)
        types = self._check_key(state, fns)
        self._check_rules(types, state, fns)
        self._compile(fns)

    # ----------------------------------------------------------------- checks

    def _check_key(self, state: Schema, functions: Functions) -> dict[str, type]:
        given = [name for name, _ in self.ruleset.key]
        if sorted(given) != sorted(self.key_names):
            raise FlowError(
                f"{self.where}: rule set {self.ruleset.name!r} keys on {', '.join(given)}, "
                f"the state's key is {', '.join(self.key_names)}"
            )
        event_types = dict(self.event.fields)
        for name, e in self.ruleset.key:
            kinds = check_expr(e, event_types, functions, f"{self.where}: key {name!r}")
            check_assign(kinds, state.type_of(name), f"{self.where}: key {name!r}", e)
        return self._names(state)

    def _names(self, state: Schema) -> dict[str, type]:
        """What a rule may read: bare names that are not ambiguous, and ``event.x`` / ``state.x``."""
        key_exprs = dict(self.ruleset.key)
        own: dict[str, type] = {n: state.type_of(n) for n in (*self.key_names, *self.components)}
        types: dict[str, type] = {}
        self._ambiguous: set[str] = set()
        for name, kind in self.event.fields.items():
            types[f"event.{name}"] = kind
            if name in own and key_exprs.get(name) != Field(name):
                self._ambiguous.add(name)
            else:
                types[name] = kind
        for name, kind in own.items():
            types[f"state.{name}"] = kind
            if name not in self._ambiguous:
                types[name] = kind
        return types

    def _check_rules(self, types: dict[str, type], state: Schema, functions: Functions) -> None:
        for i, rule in enumerate(self.ruleset.rules, 1):
            where = f"{self.where}: rule {i}"
            ambiguous = sorted(rule.reads() & self._ambiguous)
            if ambiguous:
                name = ambiguous[0]
                raise FlowError(
                    f"{where}: {name!r} is both an event field and a state component: "
                    f"write event.{name} or state.{name}"
                )
            try:
                check_filter(rule.when, types, functions, f"{where} (when)")
                for name, e in rule.sets:
                    if name not in self._index:
                        raise FlowError(f"{where}: sets {name!r}, {self._not_component(name, state)}")
                    kinds = check_expr(e, types, functions, f"{where}: {name}")
                    check_assign(kinds, state.type_of(name), f"{where}: {name}", e)
            except FlowError as exc:
                raise self._explain_untracked(exc, rule, state) from None

    def _not_component(self, name: str, state: Schema) -> str:
        if name in self.key_names:
            return "which is the state's key (the event's key selects the row; it is not set)"
        if name in state:
            return "which this arc does not track"
        known = ", ".join(self.components)
        return f"which is not a component of the state{hint(name, self.components)} ({known})"

    def _explain_untracked(self, exc: FlowError, rule: Rule, state: Schema) -> FlowError:
        untracked = [
            n for n in rule.reads() if n in state and n not in self._index and n not in self.key_names
        ]
        if untracked and set(self.components) != set(state) - set(self.key_names):
            return FlowError(
                f"{exc} -- an expand arc tracks only the components its rules set "
                f"({', '.join(self.components)}), and {untracked[0]!r} is not one"
            )
        return exc

    # ---------------------------------------------------------------- compile

    def _compile(self, functions: Functions) -> None:
        keyc = Compiler(functions, shared_subexpressions(e for _, e in self.ruleset.key))
        key_exprs = dict(self.ruleset.key)
        self._key_memo = keyc.memo_factory()
        self._key_fns: list[ExprFn] = [keyc.expr(key_exprs[name]) for name in self.key_names]
        exprs: list[Expr] = []
        for rule in self.ruleset.rules:
            exprs += expressions_of(rule.when) + [e for _, e in rule.sets]
        c = Compiler(functions, shared_subexpressions(exprs), fields=self.read)
        self._new_memo = c.memo_factory()
        self._rules: list[tuple[TestFn, Callable[[Any, Any], Row]]] = [
            (
                c.filter(rule.when),
                _row_builder(len(self.components), [(self._index[n], c.expr(e)) for n, e in rule.sets]),
            )
            for rule in self.ruleset.rules
        ]

    def read(self, name: str) -> ExprFn:
        """How a rule reads ``name`` from its environment ``(event, row, key)``."""
        qualified = name.startswith(("event.", "state."))
        bare = name[6:] if qualified else name
        keys = {k: i for i, k in enumerate(self.key_names)}
        if not name.startswith("event.") and bare in keys:
            i = keys[bare]
            return lambda env, memo: env[2][i]
        if not name.startswith("event.") and bare in self._index:
            j = self._index[bare]
            return lambda env, memo: env[1][j]

        def event_field(env: Any, memo: Any) -> Any:
            try:
                return env[0][bare]
            except KeyError:
                raise Undefined(bare) from None

        return event_field

    # ---------------------------------------------------------------- running

    def key_of(self, event: Mapping[str, Any]) -> Key:
        """The state key ``event`` selects (raises :class:`Undefined` when a key expression is)."""
        memo = self._key_memo()
        return tuple(fn(event, memo) for fn in self._key_fns)

    def step(self, key: Key, row: Row, event: Mapping[str, Any]) -> Row | None:
        """The row after ``event``, or None when no rule fires (the row is then unchanged)."""
        env = (event, row, key)
        memo = self._new_memo()
        for guard, build in self._rules:
            if guard is ALWAYS or guard(env, memo):
                try:
                    return build(env, memo)
                except Undefined:
                    continue
        return None

    def collapse(self, table: dict[Key, Row], event: Mapping[str, Any]) -> tuple[Key, Row, Row] | None:
        """Fold ``event`` into ``table``; ``(key, old row, new row)`` when the row changed, else None."""
        try:
            key = self.key_of(event)
        except Undefined:
            return None
        old = table.get(key, self.initial)
        new = self.step(key, old, event)
        if new is None or new == old:
            return None
        table[key] = new
        return key, old, new

    def describe(self) -> list[str]:
        """The rules as text, one per line (for ``flow explain``)."""
        key = ", ".join(f"{n}={expr_to_text(e)}" for n, e in self.ruleset.key)
        lines = [f"key <{key}>"]
        for rule in self.ruleset.rules:
            sets = ", ".join(f"{n}={expr_to_text(e)}" for n, e in rule.sets) or "(nothing)"
            guard = "" if rule.when == Filter.true() else f"when {rule.when.to_text()}: "
            lines.append(f"{guard}{sets}")
        return lines


def _row_builder(width: int, sets: list[tuple[int, ExprFn]]) -> Callable[[Any, Any], Row]:
    """The new row as one generated tuple display: set columns computed, the others copied."""
    scope: dict[str, Any] = {}
    assigned = dict(sets)
    items = []
    for i in range(width):
        if i in assigned:
            scope[f"f{i}"] = assigned[i]
            items.append(f"f{i}(env, memo)")
        else:
            items.append(f"row[{i}]")
    body = ", ".join(items) + ("," if width == 1 else "")
    lines = ["def build(env, memo):", "    row = env[1]", f"    return ({body})"]
    fn: Callable[[Any, Any], Row] = define("build", lines, scope, where="<row>")
    return fn


def literal_constants(lit: Predicate | ExprPredicate) -> list[Value]:
    """The constants of one literal."""
    if isinstance(lit, Predicate):
        if isinstance(lit.value, tuple):
            return list(lit.value)
        return [] if lit.value is None else [lit.value]
    return _constants(lit.left) + _constants(lit.right)
