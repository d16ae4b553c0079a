"""Reading a bare expression: ``price*vol``, ``NYS(issue)``, ``max(maxP, price)``, ``42``.

How it works: an expression is read with the filter grammar itself, so that it
means exactly what it means inside a filter. The text is parsed as the
comparison ``<text> = __hole__`` (no parentheses are added, so positions in
syntax errors are the text's own); the one literal that comes back holds the
expression on its left (or, when the expression folded to a constant, is the
canonical ``__hole__ = constant``). Anything else -- a condition (``a > 1``), a
conjunction smuggled in (``a & b``), a negation -- is refused with a message
saying that the text is not an expression. Constant arithmetic is folded as in
filters (``2 * 3`` is the constant ``6``).
"""

from __future__ import annotations

from flowbus.errors import FilterError, FilterSyntaxError
from flowbus.filters.ast import Const, Expr, ExprPredicate, Field, Op, Predicate
from flowbus.filters.parser import parse

__all__ = ["parse_expression"]

_HOLE = "__flowbus_expression_hole__"
_EXPRESSION_TOKENS = frozenset(
    {'"+"', '"-"', '"*"', '"/"', '"("', '")"', '","', "an attribute or constant", "an attribute", "a number"}
    | {"a string", "true/false"}
)


def _end(text: str) -> tuple[int, int]:
    """Line and column (1-based) just past the end of ``text``."""
    stripped = text.rstrip()
    line_start = stripped.rfind("\n") + 1
    return stripped.count("\n") + 1, len(stripped) - line_start + 1


def _not_expression(text: str) -> FilterSyntaxError:
    line, column = _end(text)
    return FilterSyntaxError(
        f"`{text.strip()}` is not an expression (a condition or an incomplete expression?)",
        text=text,
        line=line,
        column=column,
    )


def _past_end(exc: FilterSyntaxError, text: str) -> bool:
    line, column = _end(text)
    return exc.line > line or (exc.line == line and exc.column >= column)


def parse_expression(text: str) -> Expr:
    """The expression of ``text`` (a field, constant, arithmetic or a call), in canonical form.

    Raises :class:`FilterSyntaxError` (with line and column) for text that is not
    one expression, :class:`FilterError` for one that cannot be used (``1 / 0``).
    """
    if not isinstance(text, str):
        raise FilterError(f"an expression must be text, got {type(text).__name__} {text!r}")
    if not text.strip():
        raise FilterSyntaxError("empty expression", text=text, line=1, column=1)
    if _HOLE in text:
        raise FilterSyntaxError(f"the name {_HOLE} is reserved", text=text)
    try:
        f = parse(f"{text} = {_HOLE}")
    except FilterSyntaxError as exc:
        message = str(exc).split(" at line ")[0]
        if _past_end(exc, text) or "condition" in message:
            raise _not_expression(text) from None
        expected = tuple(e for e in exc.expected if e in _EXPRESSION_TOKENS)
        raise FilterSyntaxError(
            message, text=text, line=exc.line, column=exc.column, expected=expected
        ) from None
    if len(f.disjuncts) != 1 or len(f.disjuncts[0].literals) != 1:
        raise _not_expression(text)
    lit = f.disjuncts[0].literals[0]
    if lit.negated:
        raise _not_expression(text)
    if isinstance(lit, Predicate):
        if (
            lit.attr == _HOLE
            and lit.op is Op.EQ
            and not isinstance(lit.value, tuple)
            and lit.value is not None
        ):
            return Const(lit.value)
        raise _not_expression(text)
    if isinstance(lit, ExprPredicate) and lit.op is Op.EQ and lit.right == Field(_HOLE):
        if _HOLE in lit.left.fields():
            raise _not_expression(text)
        return lit.left
    raise _not_expression(text)
