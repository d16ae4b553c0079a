"""Filters, expressions and transforms compiled to closures, with common subexpressions computed once.

How it works (000 document, section 4.1, "a smart implementation can discover
[common subexpressions] ... and avoid recomputation"): a :class:`Compiler` turns
each node of the canonical form into a Python closure ``fn(env, memo)``. A
compilation unit -- one arc, or every rewritten [select; transform] path leaving
one publication point -- first counts its subexpressions
(:func:`shared_subexpressions`); each arithmetic or call node that occurs more
than once gets a slot in a per-event ``memo`` list, and its closure fills the
slot on first use (with its value, or the mark that it is undefined) and reads it
afterwards. So in ``[price*vol >= 1000000; cap = price*vol]`` the product is
computed once per event, and ``NYS(issue)`` once for all paths leaving NYSE.

The closures keep the plain evaluator's value semantics exactly (the tests
compare them with :meth:`Filter.matches` on random filters and events):
arithmetic on numbers only, division by zero and overflow undefined, a lookup
miss or a function that raises undefined, a literal over an undefined expression
false (true once negated), ``None`` a missing field, numbers compared by exact
value. Simple predicates get specialised closures for the common cases (a string
equality, an ordering against a number): they test the common types inline and
hand any other value to :func:`~flowbus.filters.values.canonical` first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from flowbus.errors import FilterError, Undefined
from flowbus.filters.ast import (
    ORDERING_OPS,
    STRING_OPS,
    BinOp,
    Call,
    Conjunction,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Functions,
    Literal,
    Op,
    Predicate,
    compare,
    value_class,
    values_equal,
)
from flowbus.filters.codegen import ARITHMETIC, ORDER, define
from flowbus.filters.values import canonical
from flowbus.model import Value

__all__ = [
    "ALWAYS",
    "Compiler",
    "ExprFn",
    "TestFn",
    "TransformFn",
    "expressions_of",
    "shared_subexpressions",
    "subexpressions",
]

Env = Any
"""What closures read fields from: an event mapping, or (event, row, key) inside collapse rules."""
Memo = list[Any]
ExprFn = Callable[[Env, Memo], Any]
TestFn = Callable[[Env, Memo], bool]
TransformFn = Callable[[Env, Memo], Mapping[str, Any]]

_UNSET = object()
_UNDEF = object()


def expressions_of(f: Filter) -> list[Expr]:
    """The operand expressions of ``f``'s expression literals."""
    out: list[Expr] = []
    for conj in f.disjuncts:
        for lit in conj.expressions:
            out += (lit.left, lit.right)
    return out


def subexpressions(e: Expr) -> Iterator[Expr]:
    """``e`` and every expression inside it, outermost first."""
    yield e
    if isinstance(e, BinOp):
        yield from subexpressions(e.left)
        yield from subexpressions(e.right)
    elif isinstance(e, Call):
        for a in e.args:
            yield from subexpressions(a)


def shared_subexpressions(exprs: Iterable[Expr]) -> list[Expr]:
    """Arithmetic and call nodes occurring more than once in ``exprs`` (outermost first).

    A repeated node is not descended into again: once it is computed once, its
    children are not computed at its other occurrences.
    """
    counts: Counter[Expr] = Counter()

    def walk(e: Expr) -> None:
        if isinstance(e, (BinOp, Call)):
            counts[e] += 1
            if counts[e] > 1:
                return
            for child in (e.left, e.right) if isinstance(e, BinOp) else e.args:
                walk(child)

    for e in exprs:
        walk(e)
    return [e for e, n in counts.items() if n > 1]


def _always(env: Env, memo: Memo) -> bool:
    return True


ALWAYS: TestFn = _always
"""The compiled form of the filter ``true`` (callers may skip calling it)."""


def _never(env: Env, memo: Memo) -> bool:
    return False


def _identity(env: Env, memo: Memo) -> Mapping[str, Any]:
    event: Mapping[str, Any] = env
    return event


class Compiler:
    """Compiles one unit; ``shared`` expressions get memo slots (see :meth:`new_memo`)."""

    def __init__(
        self,
        functions: Functions,
        shared: Iterable[Expr] = (),
        *,
        fields: Callable[[str], ExprFn] | None = None,
    ) -> None:
        """``fields`` compiles a field read (default: ``env[name]``, undefined when absent)."""
        self._functions = functions
        self._slot = {e: i for i, e in enumerate(dict.fromkeys(shared))}
        self._fields = fields

    def new_memo(self) -> Memo:
        return [_UNSET] * len(self._slot)

    def memo_factory(self) -> Callable[[], Memo]:
        """A fresh-memo function (one shared empty list when nothing is memoised: it is never written)."""
        if not self._slot:
            empty: Memo = []
            return lambda: empty
        return self.new_memo

    # ------------------------------------------------------------ expressions

    def expr(self, e: Expr) -> ExprFn:
        slot = self._slot.get(e)
        if isinstance(e, Field):
            return _field(e.name) if self._fields is None else self._fields(e.name)
        if isinstance(e, Const):
            value = e.value
            return lambda env, memo: value
        if isinstance(e, BinOp):
            return _binop(e.op, self.expr(e.left), self.expr(e.right), slot)
        return self._call(e, slot)

    def _call(self, e: Call, slot: int | None) -> ExprFn:
        try:
            fn = self._functions[e.name]
        except KeyError:
            raise FilterError(f"unknown function or lookup table {e.name!r}") from None
        args = [self.expr(a) for a in e.args]
        if isinstance(fn, Mapping):
            if len(args) != 1:
                raise FilterError(f"lookup table {e.name!r} takes one argument, got {len(args)}")
            return _lookup(fn, args[0], slot)
        return _apply(fn, args, slot)

    # ------------------------------------------------------------ conditions

    def literal(self, lit: Literal) -> TestFn:
        if isinstance(lit, ExprPredicate):
            return self._expr_predicate(lit)
        if self._fields is None:
            return _predicate(lit)
        if lit.op in ORDERING_OPS or lit.op in (Op.EQ, Op.NE) or lit.op in STRING_OPS:
            assert lit.value is not None and not isinstance(lit.value, tuple)
            return self._expr_predicate(ExprPredicate(Field(lit.attr), lit.op, Const(lit.value), lit.negated))
        return _resolved_predicate(lit, self._fields(lit.attr))

    def _expr_predicate(self, lit: ExprPredicate) -> TestFn:
        left, op, neg = self.expr(lit.left), lit.op, lit.negated
        if isinstance(lit.right, Const):
            c = lit.right.value
            if op in ORDERING_OPS and value_class(c) == 1:
                return _expr_ordering(left, op, c, neg)
            if op is Op.EQ and value_class(c) in (1, 2):
                return _expr_equals(left, c, neg)
        right = self.expr(lit.right)
        cmp = ORDER.get(op)

        def test(env: Env, memo: Memo) -> bool:
            try:
                a = left(env, memo)
                b = right(env, memo)
            except Undefined:
                return neg
            if cmp is not None:
                ta, tb = type(a), type(b)
                if (ta is int or ta is float) and (tb is int or tb is float):
                    return cmp(a, b) != neg
            return compare(a, op, b) != neg

        return test

    def conjunction(self, conj: Conjunction) -> TestFn:
        tests = [self.literal(lit) for lit in conj.literals]
        if not tests:
            return _always
        if len(tests) == 1:
            return tests[0]
        if len(tests) == 2:
            t1, t2 = tests
            return lambda env, memo: t1(env, memo) and t2(env, memo)

        def test(env: Env, memo: Memo) -> bool:
            return all(t(env, memo) for t in tests)

        return test

    def filter(self, f: Filter) -> TestFn:
        tests = [self.conjunction(c) for c in f.disjuncts]
        if not tests:
            return _never
        if len(tests) == 1:
            return tests[0]

        def test(env: Env, memo: Memo) -> bool:
            return any(t(env, memo) for t in tests)

        return test

    # ------------------------------------------------------------ transforms

    def transform(
        self,
        outputs: Sequence[tuple[str, Expr]],
        requires: Sequence[Expr] = (),
        *,
        inputs: Sequence[str] | None = None,
    ) -> TransformFn:
        """The output event of ``outputs`` (raises :class:`Undefined` if any output or requirement is).

        With ``inputs`` (the source's fields, in order) an identity transform returns
        its input event itself.
        """
        if not requires and inputs is not None and list(outputs) == [(n, Field(n)) for n in inputs]:
            return _identity
        checks = [self.expr(r) for r in requires]
        return _transform(
            checks, [(name, e if isinstance(e, Field) else self.expr(e)) for name, e in outputs]
        )


# ------------------------------------------------------------------ closures


def _transform(checks: list[ExprFn], outputs: list[tuple[str, Field | ExprFn]]) -> TransformFn:
    """``{name: value, ...}`` as one generated dict display (twice as fast as a comprehension)."""
    scope: dict[str, Any] = {"Undefined": Undefined}
    lines = ["def transform(env, memo):", "    try:"]
    for i, check in enumerate(checks):
        scope[f"c{i}"] = check
        lines.append(f"        c{i}(env, memo)")
    items = []
    for i, (name, out) in enumerate(outputs):
        if isinstance(out, Field):
            items.append(f"{name!r}: env[{out.name!r}]")
        else:
            scope[f"f{i}"] = out
            items.append(f"{name!r}: f{i}(env, memo)")
    lines.append(f"        return {{{', '.join(items)}}}")
    lines += ["    except KeyError as exc:", "        raise Undefined(str(exc)) from None"]
    fn: TransformFn = define("transform", lines, scope, where="<transform>")
    return fn


def _memoized(slot: int | None, fn: ExprFn) -> ExprFn:
    """``fn`` reading and filling ``memo[slot]`` (its value, or the mark that it is undefined)."""
    if slot is None:
        return fn

    def memoized(env: Env, memo: Memo) -> Any:
        v = memo[slot]
        if v is _UNSET:
            try:
                v = fn(env, memo)
            except Undefined:
                v = _UNDEF
            memo[slot] = v
        if v is _UNDEF:
            raise Undefined("undefined subexpression")
        return v

    return memoized


def _field(name: str) -> ExprFn:
    def field(env: Env, memo: Memo) -> Any:
        v = env.get(name)
        t = type(v)
        if t is int or t is float or t is str or t is bool:
            return v
        if v is None:
            raise Undefined(name)
        return canonical(v)

    return field


def _binop(op: str, left: ExprFn, right: ExprFn, slot: int | None) -> ExprFn:
    operate = ARITHMETIC[op]

    def binop(env: Env, memo: Memo) -> Any:
        a = left(env, memo)
        b = right(env, memo)
        ta, tb = type(a), type(b)
        if (ta is int or ta is float) and (tb is int or tb is float):
            try:
                return operate(a, b)
            except (OverflowError, ZeroDivisionError):
                raise Undefined(f"{op} overflows") from None
        raise Undefined(f"{op} on a non-number")

    if slot is None:
        return binop
    if op != "*":
        return _memoized(slot, binop)

    def memo_product(env: Env, memo: Memo) -> Any:  # the common case of a shared product, inlined
        v = memo[slot]
        if v is _UNSET:
            try:
                a = left(env, memo)
                b = right(env, memo)
                ta, tb = type(a), type(b)
                v = a * b if (ta is int or ta is float) and (tb is int or tb is float) else _UNDEF
            except (Undefined, OverflowError):
                v = _UNDEF
            memo[slot] = v
        if v is _UNDEF:
            raise Undefined("* on a non-number")
        return v

    return memo_product


def _checked(result: Any, what: str) -> Any:
    """``result`` as a value, or undefined when it is none (``None`` included)."""
    t = type(result)
    if t is str or t is int or t is float or t is bool:
        return result
    value = canonical(result)
    if value_class(value) < 0:
        raise Undefined(f"{what} returned {result!r}")
    return value


def _lookup(table: Mapping[Any, Any], arg: ExprFn, slot: int | None) -> ExprFn:
    def lookup(env: Env, memo: Memo) -> Any:
        x = arg(env, memo)
        try:
            result = table[x]
        except Exception:  # a missing key, or anything the mapping raises
            raise Undefined(f"lookup {x!r}") from None
        return _checked(result, "lookup")

    if slot is None:
        return lookup

    def memo_lookup(env: Env, memo: Memo) -> Any:  # inlined: a shared lookup is the common case
        v = memo[slot]
        if v is _UNSET:
            try:
                v = table[arg(env, memo)]
                t = type(v)
                if not (t is str or t is int or t is float or t is bool):
                    v = _checked(v, "lookup")
            except Exception:  # undefined, a missing key, or anything the mapping raises
                v = _UNDEF
            memo[slot] = v
        if v is _UNDEF:
            raise Undefined("lookup")
        return v

    return memo_lookup


def _apply(fn: Callable[..., Any], args: list[ExprFn], slot: int | None) -> ExprFn:
    def apply(env: Env, memo: Memo) -> Any:
        values = [a(env, memo) for a in args]
        try:
            result = fn(*values)
        except Exception as exc:  # whatever the user's function raises
            raise Undefined(repr(exc)) from None
        return _checked(result, "function")

    return _memoized(slot, apply)


def _expr_equals(left: ExprFn, c: Value, neg: bool) -> TestFn:
    """``x = c`` for a number or string ``c`` (``left`` yields values): same class and equal."""
    classes = (int, float) if type(c) is not str else (str,)

    def test(env: Env, memo: Memo) -> bool:
        try:
            a = left(env, memo)
        except Undefined:
            return neg
        return (type(a) in classes and a == c) != neg

    return test


def _resolved_predicate(p: Predicate, get: ExprFn) -> TestFn:
    """A set or ``exists`` predicate on a field read by ``get`` (undefined when absent)."""
    op, c, neg = p.op, p.value, p.negated

    def test(env: Env, memo: Memo) -> bool:
        try:
            v = get(env, memo)
        except Undefined:
            return neg
        return (op is Op.EXISTS or compare(v, op, c)) != neg

    return test


def _expr_ordering(left: ExprFn, op: Op, c: Value, neg: bool) -> TestFn:
    """``x OP c`` for a number ``c`` (``left`` yields values), compared exactly."""
    cmp = ORDER[op]

    def test(env: Env, memo: Memo) -> bool:
        try:
            a = left(env, memo)
        except Undefined:
            return neg
        t = type(a)
        if t is int or t is float:
            return cmp(a, c) != neg
        return neg

    return test


def _predicate(p: Predicate) -> TestFn:
    """A simple predicate on ``env[p.attr]``; the common value types are tested inline, any
    other is made canonical first, ``None`` is missing."""
    attr, op, c, neg = p.attr, p.op, p.value, p.negated
    if op is Op.EXISTS:
        return lambda env, memo: (env.get(attr) is not None) != neg
    if op is Op.EQ and type(c) is str:

        def str_eq(env: Env, memo: Memo) -> bool:
            v = env.get(attr)
            if type(v) is str:
                return (v == c) != neg
            return values_equal(canonical(v), c) != neg

        return str_eq
    if op is Op.EQ and value_class(c) == 1:

        def number_eq(env: Env, memo: Memo) -> bool:
            v = env.get(attr)
            t = type(v)
            if t is int or t is float:
                equal: bool = v == c
                return equal != neg
            if t is bool or t is str or v is None:
                return neg
            return values_equal(canonical(v), c) != neg

        return number_eq
    if op in ORDERING_OPS and value_class(c) == 1:
        cmp = ORDER[op]

        def ordering(env: Env, memo: Memo) -> bool:
            v = env.get(attr)
            t = type(v)
            if t is int or t is float:
                return cmp(v, c) != neg
            if t is bool or t is str or v is None:
                return neg
            return compare(canonical(v), op, c) != neg

        return ordering

    def generic(env: Env, memo: Memo) -> bool:
        v = env.get(attr)
        if v is None:
            return neg
        return compare(canonical(v), op, c) != neg

    return generic
