"""Substituting expressions for attributes, in expressions and in filters (000 document, section 4.1).

How it works: pushing a select ``S`` ahead of a transform ``T`` replaces every
attribute ``y`` that ``S`` reads by the expression ``T`` computes for it, and
composing two transforms does the same in the second one's expressions. The
result is put back in the canonical form that :func:`flowbus.filters.parse`
would give for the substituted text:

* constant arithmetic is folded; arithmetic that cannot be done (``1 / 0``,
  ``"a" + 1``) makes its whole expression undefined on every event, so a literal
  over it folds to false (true once negated);
* a :class:`Predicate` whose attribute becomes another attribute stays a
  predicate; one whose attribute becomes a constant folds to true or false; one
  whose attribute becomes any other expression turns into
  :class:`ExprPredicate` s -- ``in`` into a disjunction of ``=``, ``not in`` into
  a conjunction of ``!=``, ``exists e`` into "``e`` has a value"
  (``e = e | e != e``), each keeping the value semantics (a predicate on an
  undefined value is false, its negation true);
* an :class:`ExprPredicate` re-canonicalises as the parser does: ``const OP x``
  is flipped, ``attr OP const`` becomes a predicate, ``const OP const`` folds,
  and an operand that can never satisfy its operator (an ordering against
  ``true``, ``prefix`` against a number) folds to false;
* the literals' disjunctive normal form is rebuilt; contradictions drop out.

The guarantee, checked by the tests on random filters: for every event ``e`` on
which all the substituted expressions are defined,
``substitute_filter(f, m).matches(e) == f.matches({y: m[y](e), ...})``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from flowbus.errors import FilterError, Undefined
from flowbus.filters.ast import (
    FLIPPED,
    MAX_CONJUNCTIONS,
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
    Literal,
    Op,
    Predicate,
    compare,
    value_class,
)

__all__ = ["fold", "never_defined", "substitute_expr", "substitute_filter"]

_DNF = list[tuple[Literal, ...]]
_TRUE: _DNF = [()]
_FALSE: _DNF = []


def fold(op: str, left: Expr, right: Expr) -> Expr:
    """``left OP right``, folded to a constant when both sides are constants and the result is finite."""
    if isinstance(left, Const) and isinstance(right, Const):
        a, b = left.value, right.value
        if value_class(a) == 1 and value_class(b) == 1:
            try:
                value = BinOp(op, left, right)._apply(a, b)
            except Exception:  # division by zero, overflow: left to run time, where it is undefined
                return BinOp(op, left, right)
            if value_class(value) == 1 and (type(value) is int or math.isfinite(value)):
                return Const(value)
    return BinOp(op, left, right)


def never_defined(e: Expr) -> bool:
    """Is ``e`` undefined on every event? (It holds constant arithmetic that cannot be done, such as
    ``"a" + 1`` or ``1 / 0``: evaluation is strict, so the whole expression is then undefined.)"""
    if isinstance(e, BinOp):
        if isinstance(e.left, Const) and isinstance(e.right, Const):
            try:
                e.evaluate({}, {})
            except Undefined:
                return True
            return False
        return never_defined(e.left) or never_defined(e.right)
    if isinstance(e, Call):
        return any(never_defined(a) for a in e.args)
    return False


def substitute_expr(e: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """``e`` with every field named in ``mapping`` replaced by its expression (others are kept)."""
    if isinstance(e, Field):
        return mapping.get(e.name, e)
    if isinstance(e, Const):
        return e
    if isinstance(e, BinOp):
        return fold(e.op, substitute_expr(e.left, mapping), substitute_expr(e.right, mapping))
    return Call(e.name, tuple(substitute_expr(a, mapping) for a in e.args))


def substitute_filter(f: Filter, mapping: Mapping[str, Expr]) -> Filter:
    """``f`` with every attribute named in ``mapping`` replaced by its expression, in canonical form."""
    disjuncts: _DNF = []
    for conj in f.disjuncts:
        disjuncts.extend(_product([_literal(lit, mapping) for lit in conj.literals]))
        _bound(disjuncts)
    return Filter(tuple(Conjunction(c) for c in disjuncts))


def _bound(dnf: _DNF) -> None:
    if len(dnf) > 4 * MAX_CONJUNCTIONS:
        raise FilterError(
            f"filter too complex after substitution: {len(dnf)} conjunctions (at most {MAX_CONJUNCTIONS})"
        )


def _product(parts: list[_DNF]) -> _DNF:
    result = _TRUE
    for part in sorted(parts, key=len):
        result = [a + b for a in result for b in part]
        _bound(result)
    return result


def _truth(holds: bool) -> _DNF:
    return _TRUE if holds else _FALSE


def _literal(lit: Literal, mapping: Mapping[str, Expr]) -> _DNF:
    if isinstance(lit, ExprPredicate):
        left = substitute_expr(lit.left, mapping)
        right = substitute_expr(lit.right, mapping)
        return comparison(left, lit.op, right, negated=lit.negated)
    e = mapping.get(lit.attr)
    if e is None:
        return [(lit,)]
    if isinstance(e, Field):
        return [(Predicate(e.name, lit.op, lit.value, lit.negated),)]
    if isinstance(e, Const):
        holds = lit.op is Op.EXISTS or compare(e.value, lit.op, lit.value)
        return _truth(holds != lit.negated)
    return _on_expression(e, lit)


def _operand_can_hold(op: Op, value: object) -> bool:
    """Can ``x OP value`` (or ``value OP x``) ever hold? (The parser refuses the ones that cannot.)"""
    if op in ORDERING_OPS:
        return value_class(value) in (1, 2)
    if op in STRING_OPS:
        return type(value) is str
    return True


def comparison(left: Expr, op: Op, right: Expr, *, negated: bool = False) -> _DNF:
    """``left OP right`` (negated when asked) as canonical literals: a one-literal DNF, true or false."""
    if never_defined(left) or never_defined(right):
        return _truth(negated)  # the literal never holds
    for side in (left, right):
        if isinstance(side, Const) and not _operand_can_hold(op, side.value):
            return _truth(negated)
    if isinstance(left, Const):
        if isinstance(right, Const):
            return _truth(compare(left.value, op, right.value) != negated)
        if op in FLIPPED:
            left, op, right = right, FLIPPED[op], left
    if isinstance(left, Field) and isinstance(right, Const):
        return [(Predicate(left.name, op, right.value, negated),)]
    return [(ExprPredicate(left, op, right, negated),)]


def _defined(e: Expr, negated: bool) -> _DNF:
    """``e`` has a value (``e = e | e != e``: true for NaN too), or has none when ``negated``."""
    same, differs = ExprPredicate(e, Op.EQ, e), ExprPredicate(e, Op.NE, e)
    if negated:
        return [(same.negate(), differs.negate())]
    return [(same,), (differs,)]


def _on_expression(e: Expr, lit: Predicate) -> _DNF:
    """``lit`` on an attribute that became the (non-field, non-constant) expression ``e``."""
    op, neg = lit.op, lit.negated
    if never_defined(e):
        return _truth(neg)
    if op is Op.EXISTS:
        return _defined(e, neg)
    if op in (Op.IN, Op.NOT_IN):
        members = lit.value if isinstance(lit.value, tuple) else ()
        if not members:
            # ``e in {}`` never holds; ``e not in {}`` holds exactly when e has a value
            return _truth(neg) if op is Op.IN else _defined(e, neg)
        cmp = Op.EQ if op is Op.IN else Op.NE
        lits = [ExprPredicate(e, cmp, Const(m), neg) for m in members]
        # in: any of the =; not in: all of the != ... and the other way round once negated
        return [tuple(lits)] if (op is Op.NOT_IN) != neg else [(x,) for x in lits]
    assert lit.value is not None and not isinstance(lit.value, tuple)
    return comparison(e, op, Const(lit.value), negated=neg)
