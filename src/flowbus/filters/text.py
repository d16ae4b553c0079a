"""Printing the canonical form back as text: ``parse(to_text(f)) == f``.

How it works: a :class:`Filter` prints as its disjuncts joined by `` | ``, each a
conjunction of literals joined by `` & `` (parenthesised when there is more than
one disjunct and more than one literal); no disjunct prints ``false``, the one
empty conjunction ``true``. A negated literal prints as ``!(...)`` except
``not exists a``. Expressions print with the fewest parentheses their precedence
needs (``*`` ``/`` over ``+`` ``-``, left-associative, so a right operand of equal
precedence keeps its parentheses). Floats print with ``repr`` so they read back
exactly; strings print in double quotes with ``\\" \\\\ \\n \\r \\t`` escapes and
``\\uXXXX`` for other control characters and lone surrogates.

The round trip holds for every filter in canonical form (everything
:func:`flowbus.filters.parse` returns). A hand-built filter that is not canonical
-- an :class:`ExprPredicate` comparing a bare attribute with a constant, say, or
unfolded constant arithmetic -- prints fine but reads back as its canonical form.
"""

from __future__ import annotations

import re

from flowbus.errors import FilterError
from flowbus.filters.ast import BinOp, Call, Const, Expr, Field, Filter, Literal, Op, Predicate

KEYWORDS = frozenset(
    {"and", "or", "not", "in", "prefix", "suffix", "contains", "exists", "between", "true", "false"}
)
"""Reserved words of the text form (case-insensitive); they cannot name an attribute."""

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
"""What an attribute or function name looks like in the text form."""

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_ESCAPED = re.compile('[\x00-\x1f"\\\\\x7f\ud800-\udfff]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def is_name(name: str) -> bool:
    """Can ``name`` be written as an attribute in the text form?"""
    return NAME_RE.fullmatch(name) is not None and name.lower() not in KEYWORDS


def to_text(f: Filter) -> str:
    """The text form of ``f``."""
    if not f.disjuncts:
        return "false"
    if len(f.disjuncts) == 1:
        return " & ".join(literal_to_text(lit) for lit in f.disjuncts[0].literals) or "true"
    parts = []
    for conj in f.disjuncts:
        text = " & ".join(literal_to_text(lit) for lit in conj.literals)
        parts.append(f"({text})" if len(conj.literals) > 1 else text)
    return " | ".join(parts)


def literal_to_text(lit: Literal) -> str:
    """One literal: ``price > 10``, ``!(issue prefix "IB")``, ``not exists vol``, ``a * b >= 1000``."""
    if isinstance(lit, Predicate):
        text = lit._text
        if text is None:  # (written once: a literal is immutable)
            text = _predicate_text(lit)
            object.__setattr__(lit, "_text", text)
        return text
    body = f"{expr_to_text(lit.left)} {lit.op} {expr_to_text(lit.right)}"
    return f"!({body})" if lit.negated else body


def _predicate_text(lit: Predicate) -> str:
    if lit.op is Op.EXISTS:
        return f"{'not exists' if lit.negated else 'exists'} {lit.attr}"
    if isinstance(lit.value, tuple):
        body = f"{lit.attr} {lit.op} {{{', '.join(value_to_text(v) for v in lit.value)}}}"
    else:
        body = f"{lit.attr} {lit.op} {value_to_text(lit.value)}"
    return f"!({body})" if lit.negated else body


def expr_to_text(e: Expr) -> str:
    """An expression, with parentheses only where precedence needs them."""
    if isinstance(e, Field):
        return e.name
    if isinstance(e, Const):
        return value_to_text(e.value)
    if isinstance(e, Call):
        return f"{e.name}({', '.join(expr_to_text(a) for a in e.args)})"
    precedence = _PRECEDENCE[e.op]
    return f"{_operand(e.left, precedence, False)} {e.op} {_operand(e.right, precedence, True)}"


def _operand(e: Expr, precedence: int, right: bool) -> str:
    inner = _PRECEDENCE[e.op] if isinstance(e, BinOp) else _ATOM
    text = expr_to_text(e)
    if inner < precedence or (right and inner == precedence):
        return f"({text})"
    return text


def value_to_text(v: object) -> str:
    """A constant: ``"IBM"``, ``42``, ``-2.5e-05``, ``true``."""
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is str:
        return f'"{_ESCAPED.sub(_escape, v)}"'
    if type(v) is float:
        return repr(v)
    if type(v) is int:
        try:
            return str(v)
        except ValueError as exc:
            raise FilterError(f"integer constant too long to print: {exc}") from None
    raise FilterError(f"{v!r} is not a filter constant")


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    return _SHORT_ESCAPES.get(ch) or f"\\u{ord(ch):04x}"
