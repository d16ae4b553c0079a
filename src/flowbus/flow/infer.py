"""Checking expressions against schemas: known names, known functions, and the types they can yield.

How it works: validation (000 document, section 2: "the type of an information
space is defined by an information schema") walks every expression of a flow
once. :func:`check_expr` refuses a field the space does not have or a function
the flow does not define, and returns the set of value types the expression can
produce -- exact for fields, constants and arithmetic (``int * int`` is ``int``,
``/`` is ``float``, arithmetic on a string or boolean field is an error), the
value types of a lookup table's entries, and "any" for other functions.
:func:`check_assign` then refuses only a *certain* mismatch (a ``str``
expression into a ``float`` field), so an expression of unknown type passes and
is checked where its value lands. ``max``, ``min`` and ``abs`` are built in.
:func:`check_filter` checks a filter's literals the same way: a field compared
with a constant of another class (numbers, strings, booleans: ``vol = "x"`` on
an int field), a string operator on a field that is no string, an ordering of
booleans, or an int field tested for equality with a fractional constant
(``vol = 1.5``) is refused -- such a literal can never hold (or, negated, never
fail); two expressions are refused when no type one can yield compares with a
type the other can.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flowbus.errors import FlowError
from flowbus.filters.ast import (
    ORDERING_OPS,
    SET_OPS,
    STRING_OPS,
    BinOp,
    Call,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Functions,
    Op,
    Predicate,
)
from flowbus.filters.text import expr_to_text, literal_to_text, value_to_text

__all__ = [
    "ANY",
    "BUILTINS",
    "article",
    "check_assign",
    "check_expr",
    "check_filter",
    "hint",
    "with_builtins",
]

ANY: frozenset[type] = frozenset({bool, int, float, str})
NUMBERS: frozenset[type] = frozenset({int, float})
TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str"}

BUILTINS: Mapping[str, Callable[..., Any]] = {"max": max, "min": min, "abs": abs}
"""Functions every flow may call, unless it defines its own of the same name."""


def with_builtins(functions: Functions) -> dict[str, Any]:
    return {**BUILTINS, **functions}


def hint(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when ``name`` is close to one of ``known``, else ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _names(types: Mapping[str, Any]) -> str:
    return ", ".join(types) or "no fields"


def check_expr(e: Expr, types: Mapping[str, type], functions: Functions, where: str) -> frozenset[type]:
    """The value types ``e`` can yield over ``types``; :class:`FlowError` naming ``where`` if unusable."""
    if isinstance(e, Field):
        if e.name not in types:
            raise FlowError(
                f"{where}: unknown field {e.name!r}{hint(e.name, types)} (known: {_names(types)})"
            )
        kind = types[e.name]
        return frozenset({kind}) if kind in ANY else ANY
    if isinstance(e, Const):
        return frozenset({type(e.value)})
    if isinstance(e, BinOp):
        left = check_expr(e.left, types, functions, where)
        right = check_expr(e.right, types, functions, where)
        for side, part in ((left, e.left), (right, e.right)):
            if not side & NUMBERS:
                kinds = "/".join(sorted(TYPE_NAMES[t] for t in side))
                raise FlowError(
                    f"{where}: `{expr_to_text(e)}` does arithmetic on `{expr_to_text(part)}`, a {kinds}"
                )
        if e.op == "/":
            return frozenset({float})
        both_int = int in left and int in right
        return frozenset({int} if both_int else set()) | (
            frozenset({float}) if float in left | right else frozenset()
        )
    return _check_call(e, types, functions, where)


def _check_call(e: Call, types: Mapping[str, type], functions: Functions, where: str) -> frozenset[type]:
    if e.name not in functions:
        raise FlowError(
            f"{where}: unknown function or lookup table {e.name!r}{hint(e.name, functions)} "
            f"(known: {', '.join(sorted(functions)) or 'none'})"
        )
    args = [check_expr(a, types, functions, where) for a in e.args]
    fn = functions[e.name]
    if isinstance(fn, Mapping):
        if len(args) != 1:
            raise FlowError(f"{where}: lookup table {e.name!r} takes one argument, got {len(args)}")
        found = frozenset(type(v) for v in fn.values())
        return found if found and found <= ANY else ANY
    if fn is BUILTINS.get(e.name) and e.name in ("max", "min") and args:
        return frozenset().union(*args)
    if fn is BUILTINS.get("abs") and e.name == "abs" and len(args) == 1:
        return (args[0] & NUMBERS) | (frozenset({int}) if bool in args[0] else frozenset())
    return ANY


def check_assign(kinds: frozenset[type], target: type, where: str, e: Expr) -> None:
    """Refuse an expression that can never yield a value of type ``target`` (``float`` takes ``int``)."""
    accepted = NUMBERS if target is float else frozenset({target})
    if not kinds & accepted:
        got = "/".join(sorted(TYPE_NAMES[t] for t in kinds))
        raise FlowError(f"{where}: `{expr_to_text(e)}` is a {got}, the schema says {TYPE_NAMES[target]}")


def check_filter(f: Filter, types: Mapping[str, type], functions: Functions, where: str) -> None:
    """Every attribute ``f`` reads is in ``types``, every function it calls is known, and every literal
    compares values that can be compared (see the module notes)."""
    for conj in f.disjuncts:
        for lit in conj.literals:
            if isinstance(lit, ExprPredicate):
                left = check_expr(lit.left, types, functions, where)
                right = check_expr(lit.right, types, functions, where)
                _check_comparable(lit, left, right, where)
            elif lit.attr not in types:
                raise FlowError(
                    f"{where}: unknown field {lit.attr!r}{hint(lit.attr, types)} (known: {_names(types)})"
                )
            else:
                _check_constant(lit, types[lit.attr], where)


_CLASSES = {bool: "bool", int: "number", float: "number", str: "str"}


def article(kinds: frozenset[type]) -> str:
    """``an int``, ``a str``, ``a number``, ``a str/int`` (for messages)."""
    text = "number" if kinds == NUMBERS else "/".join(sorted(TYPE_NAMES[t] for t in kinds))
    return f"an {text}" if text[0] in "aeiou" else f"a {text}"


def _check_constant(lit: Predicate, kind: type, where: str) -> None:
    """``attr OP constant``: the constant (every member of a set) can be a value of the field's type."""
    if lit.op is Op.EXISTS or kind not in _CLASSES:
        return
    text = f"{where}: `{literal_to_text(lit)}`"
    if lit.op in STRING_OPS and kind is not str:
        raise FlowError(f"{text}: {lit.op} needs a str field, {lit.attr!r} is {article(frozenset({kind}))}")
    if lit.op in ORDERING_OPS and kind is bool:
        raise FlowError(f"{text}: {lit.op} orders numbers or strings, {lit.attr!r} is a bool field")
    values = lit.value if isinstance(lit.value, tuple) else (lit.value,)
    for v in values:
        if _CLASSES.get(type(v)) != _CLASSES[kind]:
            raise FlowError(
                f"{text} compares the {TYPE_NAMES[kind]} field {lit.attr!r} with the "
                f"{TYPE_NAMES.get(type(v), type(v).__name__)} {value_to_text(v)}"
            )
        equality = lit.op in SET_OPS or lit.op in (Op.EQ, Op.NE)
        if kind is int and equality and isinstance(v, float) and not v.is_integer():
            raise FlowError(f"{text}: {lit.attr!r} is an int field, it never equals {value_to_text(v)}")


def _check_comparable(lit: ExprPredicate, left: frozenset[type], right: frozenset[type], where: str) -> None:
    """``left OP right``: some type the left side can yield compares with some type the right side can."""
    text = f"{where}: `{literal_to_text(lit)}`"
    sides = ((lit.left, left), (lit.right, right))
    if lit.op in STRING_OPS:
        for e, kinds in sides:
            if str not in kinds:
                raise FlowError(f"{text}: {lit.op} needs strings, `{expr_to_text(e)}` is {article(kinds)}")
        return
    if lit.op in ORDERING_OPS:
        for e, kinds in sides:
            if kinds <= {bool}:
                raise FlowError(f"{text}: {lit.op} orders numbers or strings, `{expr_to_text(e)}` is a bool")
    if not {_CLASSES[t] for t in left} & {_CLASSES[t] for t in right}:
        raise FlowError(f"{text} compares {article(left)} with {article(right)}")
