"""Hypothesis strategies for filters and events, shared by the filter and matcher tests.

Import as ``from strategies import ...`` (pyproject puts ``tests`` on the path).

Values come from small pools so that events often hit a filter's constants. Two
kinds of random filter are offered:

* :func:`canonical_filters` builds :class:`Filter` objects directly from random
  canonical literals (simple predicates, negated or not, and expression
  predicates);
* :func:`trees` draws a *source* filter -- a boolean tree with negations,
  ``between``, sets, constant arithmetic, flipped comparisons -- as a :class:`Tree`
  holding its text form and a reference evaluator written independently of
  flowbus (:func:`reference_matches`); :func:`filters` parses such text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from flowbus.filters import parse
from flowbus.filters.ast import (
    BinOp,
    Call,
    Conjunction,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Op,
    Predicate,
)

ATTRS = ("a", "b", "c", "d", "e")
INTS = (-1, 0, 1, 2, 3)
FLOATS = (-0.5, 0.5, 1.5, 2.0, 1e16)
STRS = ("", "a", "ab", "abc", "b", "IBM", "é", 'q"\\\n')
BOOLS = (True, False)
SPECIAL = (math.nan, math.inf, -math.inf)
"""Floats an event may hold but a filter constant may not."""

SIMPLE_OPS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.IN, Op.NOT_IN, Op.EXISTS, Op.PREFIX)
"""The operators covering is complete for."""
ALL_OPS = (*SIMPLE_OPS, Op.SUFFIX, Op.CONTAINS)


def _half(x: Any) -> Any:
    if type(x) not in (int, float):
        raise TypeError(f"half of {x!r}")
    return x / 2


FUNCTIONS: Mapping[str, Any] = {"half": _half, "code": {"a": 1, "b": 2, "IBM": 3, "": 0}}
"""What expressions in generated filters may call; pass as ``functions=`` to ``matches``."""

attr_names = st.sampled_from(ATTRS)
numbers = st.sampled_from(INTS + FLOATS)
strings = st.sampled_from(STRS)


def values() -> st.SearchStrategy[Any]:
    """A filter constant: a number, string or boolean from the small pools."""
    return st.sampled_from(INTS + FLOATS + STRS + BOOLS)


def event_values(special: bool = True) -> st.SearchStrategy[Any]:
    """A value an event may hold (with NaN and infinities when ``special``)."""
    return st.sampled_from(INTS + FLOATS + STRS + BOOLS + (SPECIAL if special else ()))


def events(attrs: Sequence[str] = ATTRS, special: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    """An event: a random subset of ``attrs``, values from the pools."""
    return st.fixed_dictionaries({}, optional={a: event_values(special) for a in attrs})


# ----------------------------------------------------------- canonical literals


@st.composite
def simple_predicates(
    draw: st.DrawFn,
    ops: Sequence[Op] = SIMPLE_OPS,
    attrs: Sequence[str] = ATTRS,
    nums: Sequence[Any] = INTS + FLOATS,
    strs: Sequence[str] = STRS,
    negated: bool = False,
) -> Predicate:
    """A valid ``Predicate``; negated at random when ``negated``."""
    attr = draw(st.sampled_from(attrs))
    op = draw(st.sampled_from(ops))
    neg = negated and draw(st.booleans())
    anything = st.sampled_from((*nums, *strs, *BOOLS))
    if op is Op.EXISTS:
        value: Any = None
    elif op in (Op.IN, Op.NOT_IN):
        value = tuple(draw(st.lists(anything, max_size=3)))
    elif op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS):
        value = draw(st.sampled_from(strs))
    elif op in (Op.EQ, Op.NE):
        value = draw(anything)
    else:
        value = draw(st.sampled_from((*nums, *strs)))
    return Predicate(attr, op, value, neg)


@st.composite
def conjunction_filters(
    draw: st.DrawFn,
    max_preds: int = 4,
    simple_only: bool = True,
    attrs: Sequence[str] = ATTRS,
    nums: Sequence[Any] = INTS + FLOATS,
    strs: Sequence[str] = STRS,
) -> Filter:
    """One conjunction: of non-negated simple predicates (``simple_only``), or of any literals."""
    if simple_only:
        lits = st.one_of(simple_predicates(SIMPLE_OPS, attrs, nums, strs))
    else:
        lits = st.one_of(simple_predicates(ALL_OPS, attrs, nums, strs, negated=True), expr_predicates(attrs))
    return Filter((Conjunction(tuple(draw(st.lists(lits, max_size=max_preds)))),))


@st.composite
def expressions(draw: st.DrawFn, attrs: Sequence[str] = ATTRS, depth: int = 2) -> Expr:
    """An arithmetic expression over attributes, numbers and calls, without constant subterms."""
    kind = draw(st.integers(0, 5 if depth > 0 else 1))
    if kind == 0:
        return Field(draw(st.sampled_from(attrs)))
    if kind == 1:
        return Const(draw(numbers))
    if kind == 2:
        return Call(draw(st.sampled_from(sorted(FUNCTIONS))), (draw(expressions(attrs, depth - 1)),))
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    left = draw(expressions(attrs, depth - 1))
    right = draw(expressions(attrs, depth - 1))
    if isinstance(left, Const) and isinstance(right, Const):
        left = Field(draw(st.sampled_from(attrs)))
    if op == "/" and isinstance(right, Const) and right.value == 0:
        right = Const(2)
    return BinOp(op, left, right)


@st.composite
def expr_predicates(draw: st.DrawFn, attrs: Sequence[str] = ATTRS) -> ExprPredicate:
    """A canonical ``ExprPredicate`` (never ``attr OP const``, never ``const OP x`` with a flippable op)."""
    op = draw(st.sampled_from([Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.PREFIX, Op.CONTAINS]))
    left = draw(expressions(attrs).filter(lambda e: not isinstance(e, Const)))
    right: Expr
    if op in (Op.PREFIX, Op.CONTAINS) and draw(st.booleans()):
        left, right = Const(draw(strings)), left
    elif isinstance(left, Field) or draw(st.booleans()):
        right = draw(expressions(attrs).filter(lambda e: not isinstance(e, Const)))
    elif op in (Op.PREFIX, Op.CONTAINS):
        right = Const(draw(strings))
    elif op in (Op.EQ, Op.NE):
        right = Const(draw(values()))
    else:
        right = Const(draw(st.sampled_from(INTS + FLOATS + STRS)))
    return ExprPredicate(left, op, right, draw(st.booleans()))


@st.composite
def canonical_filters(draw: st.DrawFn, max_conjunctions: int = 3, max_literals: int = 3) -> Filter:
    """A Filter built directly from random canonical literals."""
    lits = st.one_of(simple_predicates(ALL_OPS, negated=True), expr_predicates())
    conjs = draw(st.lists(st.lists(lits, max_size=max_literals), max_size=max_conjunctions))
    return Filter(tuple(Conjunction(tuple(c)) for c in conjs))


# ------------------------------------------------------------- source trees


@dataclass(frozen=True)
class Tree:
    """A generated source filter: its text, and the reference evaluation of what it means."""

    text: str
    holds: Callable[[Mapping[str, Any]], bool]
    precedence: int  # 1 or, 2 and, 3 not, 4 comparison / constant


class _Undefined(Exception):
    pass


def _class(v: Any) -> int:
    return {bool: 0, int: 1, float: 1, str: 2}.get(type(v), -1)


def _eq(a: Any, b: Any) -> bool:
    return _class(a) == _class(b) and a == b


def reference_compare(a: Any, op: str, b: Any) -> bool:
    """``a OP b`` per the documented value semantics, written from the docs, not from flowbus."""
    if op == "=":
        return _eq(a, b)
    if op == "!=":
        return not _eq(a, b)
    if op in ("<", "<=", ">", ">="):
        if _class(a) != _class(b) or _class(a) not in (1, 2):
            return False
        return bool({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op])
    if type(a) is not str or type(b) is not str:
        return False
    return {"prefix": a.startswith(b), "suffix": a.endswith(b), "contains": b in a}[op]


@dataclass(frozen=True)
class _Ex:
    """A source expression: text, precedence (1 + -, 2 * /, 3 unary minus, 4 atom) and evaluator."""

    text: str
    precedence: int
    value: Callable[[Mapping[str, Any]], Any]
    is_constant: bool = False  # no attribute and no call: the parser folds it to ``constant``
    constant: Any = None


def _attr_ex(name: str) -> _Ex:
    def value(e: Mapping[str, Any]) -> Any:
        if name not in e:
            raise _Undefined
        return e[name]

    return _Ex(name, 4, value)


def _const_ex(v: Any) -> _Ex:
    text = json.dumps(v, ensure_ascii=False) if type(v) in (str, bool) else repr(v)
    return _Ex(text, 4 if not text.startswith("-") else 3, lambda e: v, True, v)


def _arith(op: str, a: Any, b: Any) -> Any:
    if _class(a) != 1 or _class(b) != 1:
        raise _Undefined
    if op == "/" and b == 0:
        raise _Undefined
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[op]()


def _call(name: str, arg: Any) -> Any:
    fn = FUNCTIONS[name]
    try:
        result = fn[arg] if isinstance(fn, Mapping) else fn(arg)
    except (KeyError, TypeError, ArithmeticError, ValueError):
        raise _Undefined from None
    if _class(result) < 0:
        raise _Undefined
    return result


def _wrap(x: _Ex, need: int) -> str:
    return x.text if x.precedence >= need else f"({x.text})"


@st.composite
def source_expressions(draw: st.DrawFn, depth: int = 2, attrs: Sequence[str] = ATTRS) -> _Ex:
    """An expression in source form: may fold to a constant, uses unary minus and extra parentheses."""
    kind = draw(st.integers(0, 7 if depth > 0 else 2))
    if kind <= 1:
        return _attr_ex(draw(st.sampled_from(attrs)))
    if kind == 2:
        return _const_ex(draw(numbers))
    sub = source_expressions(depth - 1, attrs)
    if kind == 3:
        name, arg = draw(st.sampled_from(sorted(FUNCTIONS))), draw(sub)
        return _Ex(f"{name}({arg.text})", 4, lambda e: _call(name, arg.value(e)))
    if kind == 4:
        x = draw(sub)
        folded = -x.constant if x.is_constant else None
        return _Ex(f"-{_wrap(x, 3)}", 3, lambda e: _arith("-", 0, x.value(e)), x.is_constant, folded)
    if kind == 5:
        x = draw(sub)
        return _Ex(f"({x.text})", 4, x.value, x.is_constant, x.constant)
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    a, b = draw(sub), draw(sub)
    if op == "/" and b.is_constant and b.constant == 0:
        b = _const_ex(2)
    prec = 1 if op in "+-" else 2
    text = f"{_wrap(a, prec)} {op} {_wrap(b, prec + 1)}"
    both = a.is_constant and b.is_constant
    folded = _arith(op, a.constant, b.constant) if both else None
    return _Ex(text, prec, lambda e: _arith(op, a.value(e), b.value(e)), both, folded)


def _sp(draw: st.DrawFn) -> str:
    return draw(st.sampled_from([" ", " ", " ", "\n  ", "\t"]))


def _kw(draw: st.DrawFn, word: str) -> str:
    return draw(st.sampled_from([word, word, word.upper(), word.capitalize()]))


def _comparison_leaf(draw: st.DrawFn, attrs: Sequence[str]) -> Tree:
    op = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "prefix", "suffix", "contains"]))
    shape = draw(st.integers(0, 9))  # mostly `attr OP const`, sometimes flipped, sometimes general
    attr = _attr_ex(draw(st.sampled_from(attrs)))
    if op in ("prefix", "suffix", "contains"):
        choices = [source_expressions(1, attrs), st.sampled_from(STRS).map(_const_ex)]
        left, right = (
            (attr, _const_ex(draw(strings)))
            if shape < 6
            else (draw(st.one_of(choices)), draw(st.one_of(choices)))
        )
        # a constant operand of a string operator must be a string (else: FilterError)
        if left.is_constant and type(left.constant) is not str:
            left = _const_ex(draw(strings))
        if right.is_constant and type(right.constant) is not str:
            right = _const_ex(draw(strings))
        op_text = _kw(draw, op)
    else:
        pool = values() if op in ("=", "!=") else st.sampled_from(INTS + FLOATS + STRS)
        if shape < 5:
            left, right = attr, _const_ex(draw(pool))
        elif shape < 7:
            left, right = _const_ex(draw(pool)), attr
        else:
            left, right = draw(source_expressions(2, attrs)), draw(source_expressions(2, attrs))
        op_text = op

    def holds(e: Mapping[str, Any]) -> bool:
        try:
            return reference_compare(left.value(e), op, right.value(e))
        except _Undefined:
            return False

    return Tree(f"{left.text}{_sp(draw)}{op_text}{_sp(draw)}{right.text}", holds, 4)


def _membership_leaf(draw: st.DrawFn, attrs: Sequence[str]) -> Tree:
    negated = draw(st.booleans())
    if draw(st.booleans()):
        left = _attr_ex(draw(st.sampled_from(attrs)))
        members = draw(st.lists(values(), max_size=3))
    else:
        left = draw(source_expressions(1, attrs))
        members = draw(st.lists(values(), min_size=1, max_size=3))
    items = ", ".join(_const_ex(m).text for m in members)
    op_text = f"{_kw(draw, 'not')} {_kw(draw, 'in')}" if negated else _kw(draw, "in")

    def holds(e: Mapping[str, Any]) -> bool:
        try:
            x = left.value(e)
        except _Undefined:
            return False
        return any(_eq(x, m) for m in members) != negated

    return Tree(f"{left.text} {op_text}{_sp(draw)}{{{items}}}", holds, 4)


def _between_leaf(draw: st.DrawFn, attrs: Sequence[str]) -> Tree:
    x = draw(st.one_of(st.sampled_from(attrs).map(_attr_ex), source_expressions(1, attrs)))
    pool = st.sampled_from(INTS + FLOATS) if draw(st.booleans()) else strings
    lo, hi = _const_ex(draw(pool)), _const_ex(draw(pool))

    def holds(e: Mapping[str, Any]) -> bool:
        try:
            v = x.value(e)
        except _Undefined:
            return False
        return reference_compare(v, ">=", lo.constant) and reference_compare(v, "<=", hi.constant)

    text = f"{x.text} {_kw(draw, 'between')} {lo.text} {_kw(draw, 'and')} {hi.text}"
    return Tree(text, holds, 4)


@st.composite
def _leaves(draw: st.DrawFn, attrs: Sequence[str]) -> Tree:
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        return _comparison_leaf(draw, attrs)
    if kind <= 6:
        return _membership_leaf(draw, attrs)
    if kind == 7:
        return _between_leaf(draw, attrs)
    if kind == 8:
        name = draw(st.sampled_from(attrs))
        return Tree(f"{_kw(draw, 'exists')} {name}", lambda e: name in e, 4)
    flag = draw(st.booleans())
    return Tree(_kw(draw, "true" if flag else "false"), lambda e: flag, 4)


def _paren(draw: st.DrawFn, t: Tree, need: int) -> str:
    return f"({t.text})" if t.precedence < need or draw(st.integers(0, 7)) == 0 else t.text


@st.composite
def trees(draw: st.DrawFn, max_leaves: int = 5, attrs: Sequence[str] = ATTRS) -> Tree:
    """A source filter of at most ``max_leaves`` leaves (5 keeps its normal form under 256 conjunctions)."""
    if max_leaves <= 1 or draw(st.integers(0, 2)) == 0:
        return draw(_leaves(attrs))
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        a = draw(trees(max_leaves - 1, attrs))
        return Tree(
            f"{draw(st.sampled_from(['!', 'not ', 'NOT ', '! ']))}{_paren(draw, a, 3)}",
            lambda e: not a.holds(e),
            3,
        )
    split = draw(st.integers(1, max_leaves - 1))
    a, b = draw(trees(split, attrs)), draw(trees(max_leaves - split, attrs))
    prec = 2 if kind == "and" else 1
    word = draw(st.sampled_from(["&", _kw(draw, "and")] if kind == "and" else ["|", _kw(draw, "or")]))
    text = f"{_paren(draw, a, prec)}{_sp(draw)}{word}{_sp(draw)}{_paren(draw, b, prec + 1)}"
    if kind == "and":
        return Tree(text, lambda e: a.holds(e) and b.holds(e), 2)
    return Tree(text, lambda e: a.holds(e) or b.holds(e), 1)


def reference_matches(tree: Tree, event: Mapping[str, Any]) -> bool:
    """What the source filter means for ``event`` (calls use :data:`FUNCTIONS`)."""
    return tree.holds(event)


@st.composite
def filters(draw: st.DrawFn, attrs: Sequence[str] = ATTRS) -> Filter:
    """A general Filter: a parsed :func:`trees` text (negation, and/or, between, sets, expressions),
    or a built :func:`canonical_filters` one."""
    if draw(st.integers(0, 3)) == 0:
        return draw(canonical_filters())
    return parse(draw(trees(attrs=attrs)).text)
