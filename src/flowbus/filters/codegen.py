"""Generated Python functions, in one place: the operator table and the one way to make a
function from its source.

How it works: a filter's test, a transform's dict display, a collapse rule's step, a key
function, a broker's index of its own subscriptions are each written as Python source and
compiled once (:func:`define`), because one generated function runs several times faster
than a chain of closures. Every generator reads the operators from the same tables:
:data:`SOURCE` (an operator as Python source) and :data:`COMPARE` / :data:`ARITHMETIC` (as
functions, for the closures that are not generated), so a comparison means the same thing
in every generated function and in the plain evaluator.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from flowbus.errors import InternalError
from flowbus.filters.ast import Op

__all__ = ["ARITHMETIC", "COMPARE", "ORDER", "SOURCE", "define", "divide"]

SOURCE: dict[Op, str] = {Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}
"""A comparison operator as Python source."""

COMPARE: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}
"""A comparison operator as a function (the same comparison as :data:`SOURCE`)."""

ORDER: dict[Op, Callable[[Any, Any], bool]] = {op: COMPARE[op] for op in (Op.LT, Op.LE, Op.GT, Op.GE)}
"""The ordering operators as functions (equality of values has its own rule: values_equal)."""


def divide(a: Any, b: Any) -> Any:
    """``a / b``; a division by zero raises ZeroDivisionError (for ints and floats alike)."""
    if b == 0:
        raise ZeroDivisionError
    return a / b


ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": divide,
}
"""An arithmetic operator of the expression language as a function."""


def define(name: str, lines: Sequence[str], scope: dict[str, Any], *, where: str = "<generated>") -> Any:
    """The function ``name`` that ``lines`` of Python source define, compiled with the names
    of ``scope`` in reach (``where`` names the source in a traceback)."""
    exec(compile("\n".join(lines), where, "exec"), scope)
    fn = scope.get(name)
    if not callable(fn):
        raise InternalError(f"{where}: the generated source defines no function {name!r}")
    return fn
