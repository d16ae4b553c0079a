"""A bound rule set written out as one Python function, compiled once per deployment.

How it works: :func:`step_function` turns a :class:`~flowbus.flow.collapse.BoundRules`
into the source of one function ``step(key, row, event)`` and ``compile()`` s it: the
rules in order, each guard's literals as nested ``if`` s, each right-hand side as
statements on local variables, and the new row as one tuple display. No closure is
called per sub-expression and no memo list is made per step (arithmetic is pure: an
expression two rules share is computed again, which gives the same value). What the
generated code does is exactly what :meth:`BoundRules.step` does with its closures
(:mod:`flowbus.filters.compile`):

* a name reads the key (``key[i]``), the row (``row[j]``) or the event
  (``event['x']``, undefined when absent), as :meth:`BoundRules.read` says;
* arithmetic on numbers only (``bool`` is not one), undefined otherwise, on division
  by zero and on overflow (Python raises ``ZeroDivisionError`` / ``OverflowError``,
  which the generated ``except`` clauses treat as undefined);
* a literal over an undefined operand is false (true once negated); an ordering of two
  numbers is Python's, anything else goes to :func:`~flowbus.filters.ast.compare`;
* the first rule whose guard holds and whose values are all defined gives the row;
  None when none does.

Function calls and lookups keep the compiler's closures (with its memo, so a shared
call is made once per event, as before): the generated code calls them with the
interpreter's environment ``(event, row, key)``. :func:`key_function` writes out the
key when its components are event fields, read as the filter compiler reads them, and
:func:`goal_function` the event an expand arc reads off a row (``Expander.goal_event``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import count
from typing import Any

from flowbus.errors import Undefined
from flowbus.filters.ast import (
    ORDERING_OPS,
    STRING_OPS,
    BinOp,
    Call,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Literal,
    Op,
    Predicate,
    compare,
    value_class,
)
from flowbus.filters.codegen import SOURCE, define
from flowbus.filters.compile import Compiler, subexpressions
from flowbus.filters.values import canonical
from flowbus.flow.collapse import BoundRules, Key, Row, Rule

__all__ = ["KeyFn", "StepFn", "goal_function", "key_function", "projection", "step_function"]

StepFn = Callable[[Key, Row, Mapping[str, Any]], Row | None]
KeyFn = Callable[[Mapping[str, Any]], Key]

_ERRORS = (Undefined, KeyError, ZeroDivisionError, OverflowError)
_NUMERIC = "(type({0}) is int or type({0}) is float)"


class _Writer:
    """The source of one generated function: its lines, names for values it needs, fresh temporaries."""

    def __init__(self, bound: BoundRules, compiler: Compiler) -> None:
        self.bound = bound
        self.compiler = compiler
        self.lines: list[str] = []
        self.scope: dict[str, Any] = {"_ERRORS": _ERRORS, "_U": Undefined, "compare": compare}
        self._names = count()
        self._keys = {k: i for i, k in enumerate(bound.key_names)}
        self._cols = {c: j for j, c in enumerate(bound.components)}

    def name(self, prefix: str, value: Any = None) -> str:
        n = f"{prefix}{next(self._names)}"
        if value is not None:
            self.scope[n] = value
        return n

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def read(self, name: str) -> str:
        """The Python expression reading ``name`` (as :meth:`BoundRules.read`)."""
        bare = name[6:] if name.startswith(("event.", "state.")) else name
        if not name.startswith("event."):
            if bare in self._keys:
                return f"key[{self._keys[bare]}]"
            if bare in self._cols:
                return f"row[{self._cols[bare]}]"
        return f"event[{bare!r}]"

    def expr(self, e: Expr, indent: int) -> str:
        """Statements computing ``e`` (raising one of ``_ERRORS`` when undefined); its value's name."""
        if isinstance(e, Const):
            return self.name("k", e.value) if e.value is not None else "None"
        if isinstance(e, Field):
            t = self.name("t")
            self.emit(indent, f"{t} = {self.read(e.name)}")
            return t
        if isinstance(e, Call):
            fn = self.name("fn", self.compiler.expr(e))
            t = self.name("t")
            self.emit(indent, f"{t} = {fn}(env, memo)")
            return t
        assert isinstance(e, BinOp)
        a, b = self.expr(e.left, indent), self.expr(e.right, indent)
        checks = [_NUMERIC.format(x) for x, side in ((a, e.left), (b, e.right)) if not _number(side)]
        if checks:
            self.emit(indent, f"if not ({' and '.join(checks)}): raise _U('{e.op} on a non-number')")
        t = self.name("t")
        self.emit(indent, f"{t} = {a} {e.op} {b}")
        return t

    def literal(self, lit: Literal, out: str, indent: int) -> None:
        """Statements setting ``out`` to whether ``lit`` holds (as the filter compiler's tests)."""
        if isinstance(lit, Predicate):
            if lit.op in ORDERING_OPS or lit.op in (Op.EQ, Op.NE) or lit.op in STRING_OPS:
                assert lit.value is not None and not isinstance(lit.value, tuple)
                lit = ExprPredicate(Field(lit.attr), lit.op, Const(lit.value), lit.negated)
            else:
                self._resolved(lit, out, indent)
                return
        neg = "not " if lit.negated else ""
        self.emit(indent, "try:")
        a = self.expr(lit.left, indent + 1)
        right = lit.right
        c = right.value if isinstance(right, Const) else None
        if isinstance(right, Const) and lit.op in ORDERING_OPS and value_class(c) == 1:
            self.emit(indent, "except _ERRORS:")
            self.emit(indent + 1, f"{out} = {lit.negated}")
            self.emit(indent, "else:")
            k = self.name("k", c)
            self.emit(indent + 1, f"{out} = {neg}({_NUMERIC.format(a)} and {a} {SOURCE[lit.op]} {k})")
            return
        if isinstance(right, Const) and lit.op is Op.EQ and value_class(c) in (1, 2):
            self.emit(indent, "except _ERRORS:")
            self.emit(indent + 1, f"{out} = {lit.negated}")
            self.emit(indent, "else:")
            k = self.name("k", c)
            same = _NUMERIC.format(a) if type(c) is not str else f"type({a}) is str"
            self.emit(indent + 1, f"{out} = {neg}({same} and {a} == {k})")
            return
        b = self.expr(right, indent + 1)
        self.emit(indent, "except _ERRORS:")
        self.emit(indent + 1, f"{out} = {lit.negated}")
        self.emit(indent, "else:")
        op = self.name("op", lit.op)
        general = f"compare({a}, {op}, {b})"
        if lit.op in ORDERING_OPS:
            both = f"{_NUMERIC.format(a)} and {_NUMERIC.format(b)}"
            general = f"({a} {SOURCE[lit.op]} {b} if {both} else {general})"
        self.emit(indent + 1, f"{out} = {neg}{general}")

    def _resolved(self, p: Predicate, out: str, indent: int) -> None:
        """A set or ``exists`` predicate on a name (undefined when absent)."""
        neg = "not " if p.negated else ""
        self.emit(indent, "try:")
        self.emit(indent + 1, f"v = {self.read(p.attr)}")
        self.emit(indent, "except _ERRORS:")
        self.emit(indent + 1, f"{out} = {p.negated}")
        self.emit(indent, "else:")
        if p.op is Op.EXISTS:
            self.emit(indent + 1, f"{out} = {not p.negated}")
        else:
            op, c = self.name("op", p.op), self.name("k", p.value)
            self.emit(indent + 1, f"{out} = {neg}compare(v, {op}, {c})")


def _number(e: Expr) -> bool:
    return isinstance(e, Const) and type(e.value) in (int, float)


def step_function(bound: BoundRules) -> StepFn:
    """``bound``'s :meth:`~BoundRules.step` as one compiled function (see the module note)."""
    rules = bound.ruleset.rules
    exprs = [e for r in rules for _, e in r.sets] + [
        side
        for r in rules
        for conj in r.when.disjuncts
        for lit in conj.expressions
        for side in (lit.left, lit.right)
    ]
    calls = [c for e in exprs for c in subexpressions(e) if isinstance(c, Call)]
    shared = [c for c in dict.fromkeys(calls) if calls.count(c) > 1]
    compiler = Compiler(bound.functions, shared, fields=bound.read)
    w = _Writer(bound, compiler)
    w.emit(0, "def step(key, row, event):")
    if calls:
        w.scope["new_memo"] = compiler.memo_factory()
        w.emit(1, "env = (event, row, key)")
        w.emit(1, "memo = new_memo()")
    for rule in rules:
        indent = 1
        if rule.when != Filter.true():
            _guard(w, rule, indent)
            w.emit(indent, "if g:")
            indent += 1
        w.emit(indent, "try:")
        values = {bound.components.index(n): w.expr(e, indent + 1) for n, e in rule.sets}
        items = [values.get(i, f"row[{i}]") for i in range(len(bound.components))]
        w.emit(indent + 1, f"return ({', '.join(items)},)")
        w.emit(indent, "except _ERRORS:")
        w.emit(indent + 1, "pass")
    w.emit(1, "return None")
    fn: StepFn = define("step", w.lines, w.scope, where=f"<rules {bound.where}>")
    return fn


def _guard(w: _Writer, rule: Rule, indent: int) -> None:
    """Statements setting ``g`` to whether ``rule``'s guard holds (disjuncts and literals short-circuit)."""
    disjuncts = rule.when.disjuncts
    if not disjuncts:
        w.emit(indent, "g = False")
    for i, conj in enumerate(disjuncts):
        depth = indent
        if i:
            w.emit(depth, "if not g:")
            depth += 1
        if not conj.literals:
            w.emit(depth, "g = True")
        for j, lit in enumerate(conj.literals):
            w.literal(lit, "g", depth)
            if j < len(conj.literals) - 1:
                w.emit(depth, "if g:")
                depth += 1


def key_function(bound: BoundRules) -> KeyFn:
    """``bound``'s :meth:`~BoundRules.key_of` compiled when every key component is an event
    field, read as the filter compiler reads one (raises :class:`Undefined` as it does); else
    ``bound.key_of`` itself."""
    exprs = dict(bound.ruleset.key)
    names = [e.name for n in bound.key_names if isinstance(e := exprs[n], Field)]
    if len(names) != len(bound.key_names):
        return bound.key_of
    lines = ["def key_of(event):"]
    for i, name in enumerate(names):
        lines += [
            f"    v{i} = event.get({name!r})",
            f"    t = type(v{i})",
            "    if not (t is int or t is float or t is str or t is bool):",
            f"        if v{i} is None: raise Undefined({name!r})",
            f"        v{i} = canonical(v{i})",
        ]
    lines.append(f"    return ({', '.join(f'v{i}' for i in range(len(bound.key_names)))},)")
    scope: dict[str, Any] = {"Undefined": Undefined, "canonical": canonical}
    fn: KeyFn = define("key_of", lines, scope, where=f"<key {bound.where}>")
    return fn


def projection(index: Sequence[int]) -> Callable[[Row], Row]:
    """``row -> (row[i] for i in index)`` as one tuple display."""
    items = "".join(f"row[{i}], " for i in index)
    fn: Callable[[Row], Row] = define("project", ["def project(row):", f"    return ({items})"], {})
    return fn


def goal_function(plan: Sequence[tuple[str, int, type]]) -> Callable[[Key, Row], dict[str, Any] | None]:
    """``(key, goal) -> event`` with each ``(field, column, type)`` of ``plan`` read off the key
    (column -1 - i: its component i) or the goal row: None when a goal value is not of the
    field's type (a float field takes an int, as a float); one dict display."""
    lines = ["def goal_event(key, goal):"]
    items = []
    for n, (f, col, kind) in enumerate(plan):
        v = f"v{n}"
        lines.append(f"    {v} = key[{-1 - col}]" if col < 0 else f"    {v} = goal[{col}]")
        if col >= 0:
            fits = _NUMERIC.format(v) if kind is float else f"type({v}) is {kind.__name__}"
            lines.append(f"    if not {fits}: return None")
        if kind is float:
            lines.append(f"    if type({v}) is int: {v} = float({v})")
        items.append(f"{f!r}: {v}")
    lines.append(f"    return {{{', '.join(items)}}}")
    scope: dict[str, Any] = {}
    fn: Callable[[Key, Row], dict[str, Any] | None] = define("goal_event", lines, scope, where="<goal event>")
    return fn
