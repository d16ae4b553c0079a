"""JMS message selectors, the kind STOMP brokers such as ActiveMQ take in a SUBSCRIBE
frame's ``selector`` header, translated into flowbus filters:
``selector("price > 100 AND sym IN ('IBM', 'MSFT')")``.

**Accepted** (JMS 2.0, section 3.8.1; the grammar is ``selector.lark``):

* identifiers (Java rules, case-sensitive) name event fields; the keywords ``AND OR NOT
  BETWEEN IN LIKE ESCAPE IS NULL TRUE FALSE`` are case-insensitive and reserved;
* literals: strings in single quotes (``'it''s'``), exact numerics (``57``, ``57L``, ``0x1F``,
  ``017``: octal, as in Java), approximate numerics (``7E3``, ``57.9E2``, ``7.``, ``.5``), ``TRUE``,
  ``FALSE``; a sign is the unary operator (``-957``); integers of any size are read exactly;
* ``= <> < <= > >=``; ``+ - * /`` and unary ``+ -``; parentheses; ``NOT``, ``AND``, ``OR``;
* ``e [NOT] BETWEEN e1 AND e2``; ``x [NOT] IN (literal, ...)``; ``x [NOT] LIKE 'pattern'
  [ESCAPE 'c']``; ``x IS [NOT] NULL``; an identifier alone as a condition (a boolean field).

**Refused** (:class:`FilterError`, naming what and where):

* LIKE patterns with no exact flowbus form: flowbus tests prefixes, suffixes and substrings,
  with no general pattern match and no length test. So ``_`` (any one character) is refused,
  and so is a ``%`` inside the pattern (``'a%b%c'``, ``'%a%b'``) except in ``'ab%cd'``, which is
  ``prefix "ab" & suffix "cd"`` when the two cannot overlap (``'a%a'`` is refused: ``'a'``
  starts with ``a`` and ends with ``a`` but does not match). ``'%'`` is ``prefix ""``, which
  holds exactly for a string.
* ordering a string or boolean literal (``x < 'abc'``, ``x >= TRUE``): JMS orders numbers
  only (ActiveMQ refuses these too); arithmetic on a string or boolean literal (``x + 'a'``).
* identifiers flowbus cannot name a field with (``$``, non-ASCII letters, the flowbus words
  ``prefix suffix contains exists``), and those beginning with ``JMS``: JMS message headers and
  JMS-defined properties, which flowbus events do not carry.
* these are :class:`FilterSyntaxError` s, with a position: a condition as an operand
  (``(a > 1) = TRUE``), a value as a condition (``price + 1``), IN / LIKE / IS NULL on anything
  but an identifier, an ESCAPE of other than one character, an octal literal with 8 or 9.

**The NULL rule.** A selector has SQL's three truth values. A missing field (or one holding
``None``) is NULL; a comparison, IN, LIKE or arithmetic that reads NULL is UNKNOWN; ``NOT
UNKNOWN`` is UNKNOWN; AND and OR follow Kleene's tables; a message is selected only when the
selector is TRUE. flowbus has two values and a negation that holds on a missing field, so a
``NOT`` never becomes a flowbus negation as it stands. Each condition has two translations: a
flowbus condition that holds exactly when it is TRUE, and one that holds exactly when it is
FALSE. ``NOT`` swaps them, AND and OR combine them (De Morgan for the FALSE side), and the
filter is the TRUE side of the whole selector. ``a < 5`` is TRUE on ``a < 5`` and FALSE on
``exists a & !(a < 5)``; ``a = 5`` on ``a = 5`` and ``a != 5`` (flowbus's ``!=`` needs a present
field); ``a IS NULL``, never UNKNOWN, on ``not exists a`` and ``exists a``. An arithmetic
operand ``e`` has a value exactly when ``e = e | e != e`` holds (``!=`` for NaN), so ``NOT (a * b
> 5)`` is ``(a * b = a * b | a * b != a * b) & !(a * b > 5)``.

**Values.** What JMS leaves open follows ActiveMQ, whose STOMP clients this serves, and
flowbus's value semantics (docs/filters.md) otherwise:

* values of different types compare FALSE (JMS), not UNKNOWN, and ``<>`` is ``NOT =``
  (ActiveMQ): ``x <> 5`` and ``NOT (x < 5)`` are TRUE for a string ``x``. Numbers compare by
  exact value (``x = 1`` holds for ``1.0``; Java rounds a long past 2**53 to a double first);
  NaN equals nothing and is ordered with nothing.
* two strings met at run time (``a < b``) are ordered by code point, as in flowbus (ActiveMQ
  orders them too, by UTF-16 unit: the same order but for characters past U+FFFF against
  U+E000-U+FFFF).
* arithmetic on a non-number is UNKNOWN, as on NULL; unary ``+`` is arithmetic too. Division is
  exact, as in flowbus (``7 / 2`` is 3.5, as in ActiveMQ, which divides doubles); dividing by
  zero is UNKNOWN (Java's doubles give an infinity); integers do not wrap past 64 bits.
* ``x IN (...)`` is the OR of ``x = ...`` (JMS), so ``x NOT IN ('a')`` is TRUE for ``x = 5``
  (ActiveMQ: UNKNOWN for a non-string); the members may be any literals.
* LIKE on a non-string is FALSE, so NOT LIKE is TRUE (ActiveMQ). The ESCAPE character must be
  followed by ``%``, ``_`` or itself (SQL-92).
* ``x BETWEEN a AND b`` is ``x >= a AND x <= b``; ``x NOT BETWEEN a AND b`` is ``x < a OR x > b``
  (JMS), which is not ``NOT (x BETWEEN a AND b)`` on a value the bounds do not compare with.
* an identifier alone is TRUE when it holds ``true``, FALSE when it holds ``false``, UNKNOWN
  otherwise: ``NOT flag`` selects a present false only (``flag <> TRUE`` also selects a string).

How it works: lark's LALR parser runs :class:`_Build` as it reduces each rule, so no tree is
built. A value becomes flowbus expression text on the spot (:class:`_Value`); a condition
becomes a :class:`_Leaf` holding its TRUE and FALSE texts, or a :class:`_Group` of conditions
(AND or OR, negated or not). The TRUE text of the whole is read by
:func:`flowbus.filters.parse`, which folds constants, distributes into the canonical
disjunction of conjunctions (refusing one that is too complex) and remembers recent texts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache
from importlib.resources import files
from typing import cast

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

from flowbus.errors import FilterError, FilterSyntaxError
from flowbus.filters.ast import Filter, value_class
from flowbus.filters.parser import MAX_EXPR_DEPTH, _Misplaced, parse
from flowbus.filters.text import KEYWORDS, is_name, value_to_text
from flowbus.model import Value

__all__ = ["selector", "selector_source"]

_OPS = {"=": "=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
"""The JMS comparison operators, by their flowbus spelling."""
_JMS_WORDS = frozenset({"and", "or", "not", "between", "in", "like", "escape", "is", "null", "true", "false"})
_FLOWBUS_ONLY_WORDS = ", ".join(sorted(KEYWORDS - _JMS_WORDS))


# ------------------------------------------------------------------------------------ nodes


@dataclass(frozen=True, slots=True)
class _Value:
    """A value: its flowbus text (arithmetic in parentheses), where it starts, and what the
    translation needs to know of it."""

    text: str
    line: int
    column: int
    field: str | None = None  # the identifier, when the value is one
    literal: Value | None = None  # the constant, when the value is one literal
    constant: bool = False  # no identifier in it: flowbus folds it
    depth: int = 1  # how deep it nests, as flowbus counts (a folded constant: 1)


@dataclass(frozen=True, slots=True)
class _Leaf:
    """A condition as two flowbus conditions: one holds exactly when it is TRUE, the other
    exactly when it is FALSE (neither: UNKNOWN)."""

    true: str
    false: str


@dataclass(frozen=True, slots=True)
class _Group:
    """``parts`` joined by AND (``all``) or by OR, under a NOT when ``negated``."""

    all: bool
    parts: tuple[_Cond, ...]
    negated: bool = False


_Cond = _Leaf | _Group
_Node = _Cond | _Value


def _pos(tok: Token) -> tuple[int, int]:
    return tok.line or 0, tok.column or 0


def _at(line: int, column: int) -> str:
    return f"line {line}, column {column}"


def _show(v: Value) -> str:
    """A literal as a selector writes it."""
    if type(v) is str:
        return "'" + v.replace("'", "''") + "'"
    if type(v) is bool:
        return "TRUE" if v else "FALSE"
    return repr(v)


def _literal(v: Value, tok: Token) -> _Value:
    return _Value(value_to_text(v), *_pos(tok), literal=v, constant=True)


def _expression(text: str, line: int, column: int, *operands: _Value) -> _Value:
    """Arithmetic over ``operands``, starting at ``line``, ``column``."""
    if all(o.constant for o in operands):
        return _Value(text, line, column, constant=True)
    depth = 1 + max(o.depth for o in operands)
    if depth > MAX_EXPR_DEPTH:
        raise FilterError(
            f"selector nested too deeply: the expression at {_at(line, column)} nests more than "
            f"{MAX_EXPR_DEPTH} levels of operators"
        )
    return _Value(text, line, column, depth=depth)


def _number(v: _Value, op: Token) -> int | float | None:
    """The number ``v`` is when it is a literal (None: not a literal), as an operand of
    arithmetic ``op``; a string or boolean literal is refused."""
    lit = v.literal
    if isinstance(lit, (str, bool)):
        raise FilterError(f"arithmetic on {_show(lit)} at {_at(v.line, v.column)}: {str(op)!r} takes numbers")
    return lit


def _value(node: _Node, op: Token) -> _Value:
    if isinstance(node, _Value):
        return node
    raise _Misplaced(f"a condition cannot be an operand of {str(op)!r}", *_pos(op))


def _cond(node: _Node) -> _Cond:
    if not isinstance(node, _Value):
        return node
    if node.field is not None:  # a boolean field: UNKNOWN unless it holds a boolean
        return _Leaf(f"{node.field} = true", f"{node.field} = false")
    if type(node.literal) is bool:
        return _Leaf("true", "false") if node.literal else _Leaf("false", "true")
    message = "a value is not a condition (a literal or arithmetic needs a comparison)"
    raise _Misplaced(message, node.line, node.column)


def _identifier(node: _Node, op: Token) -> str:
    """The identifier on the left of IN, LIKE or IS."""
    if isinstance(node, _Value) and node.field is not None:
        return node.field
    line, column = (node.line, node.column) if isinstance(node, _Value) else _pos(op)
    raise _Misplaced(f"{str(op).upper()} tests an identifier: its left must be one", line, column)


def _negate(c: _Cond) -> _Cond:
    return _Leaf(c.false, c.true) if isinstance(c, _Leaf) else replace(c, negated=not c.negated)


def _join(all_: bool, a: _Cond, b: _Cond) -> _Group:
    def parts(c: _Cond) -> tuple[_Cond, ...]:
        return c.parts if isinstance(c, _Group) and c.all == all_ and not c.negated else (c,)

    return _Group(all_, parts(a) + parts(b))


# ------------------------------------------------------------------------------ translation


def _defined(v: _Value) -> list[str]:
    """flowbus conditions that all hold exactly when ``v`` is not NULL."""
    if v.constant:
        return []
    if v.field is not None:
        return [f"exists {v.field}"]
    return [f"({v.text} = {v.text} | {v.text} != {v.text})"]


def _compare(left: _Value, op: str, right: _Value) -> _Leaf:
    """``left OP right``: flowbus's comparison is TRUE; FALSE when both have a value and it fails."""
    if op not in ("=", "<>"):
        for side in (left, right):
            if side.literal is not None and value_class(side.literal) != 1:
                raise FilterError(
                    f"{_show(side.literal)} at {_at(side.line, side.column)} cannot be "
                    f"ordered: JMS compares strings and booleans with = and <> only"
                )
    true = f"{left.text} {_OPS[op]} {right.text}"
    if op == "=":
        return _Leaf(true, f"{left.text} != {right.text}")
    if op == "<>":
        return _Leaf(true, f"{left.text} = {right.text}")
    return _Leaf(true, " & ".join([*_defined(left), *_defined(right), f"!({true})"]))


def _unquote(tok: Token) -> str:
    return tok[1:-1].replace("''", "'")


def _like(name: str, pattern_tok: Token, escape: str | None) -> _Cond:
    """``name LIKE pattern``, when flowbus can say it exactly."""
    pattern = _unquote(pattern_tok)
    where = f"LIKE {_show(pattern)} at {_at(*_pos(pattern_tok))}"
    parts = [""]  # the literal text between the wildcards %
    chars = iter(pattern)
    for ch in chars:
        if ch == escape:
            escaped = next(chars, "")
            if escaped not in ("%", "_", escape):
                raise FilterError(
                    f"{where}: the ESCAPE character {_show(escape)} must be followed by %, _ or itself"
                )
            parts[-1] += escaped
        elif ch == "%":
            parts.append("")
        elif ch == "_":
            raise FilterError(
                f"{where} is refused: _ matches any one character, and flowbus has no general "
                "pattern match (only prefix, suffix and substring tests) nor a length test"
            )
        else:
            parts[-1] += ch
    if len(parts) == 1:
        text = value_to_text(parts[0])
        return _Leaf(f"{name} = {text}", f"{name} != {text}")
    first, *middle, last = parts
    middle = [p for p in middle if p]  # (%% is %)
    if not middle and not last:
        tests = [("prefix", first)]  # ('%' is prefix "": any string)
    elif not middle and not first:
        tests = [("suffix", last)]
    elif len(middle) == 1 and not first and not last:
        tests = [("contains", middle[0])]
    elif not middle:
        overlap = next((k for k in range(min(len(first), len(last)), 0, -1) if first[-k:] == last[:k]), 0)
        if overlap:
            raise FilterError(
                f"{where} is refused: {_show(first + last[overlap:])} starts with {_show(first)} and "
                "ends with " + _show(last) + " but does not match, and flowbus has no length test"
            )
        tests = [("prefix", first), ("suffix", last)]
    else:
        raise FilterError(
            f"{where} is refused: flowbus has no general pattern match; it can say 'ab%', '%ab', "
            "'%ab%' and 'ab%cd', not more parts"
        )
    true = " & ".join(f"{name} {op} {value_to_text(s)}" for op, s in tests)
    return _Leaf(true, f"exists {name} & !({true})")


def _render(c: _Cond, truth: bool) -> str:
    """flowbus text that holds exactly when ``c`` is TRUE (``truth``) or FALSE."""
    if isinstance(c, _Leaf):
        return c.true if truth else c.false
    truth = truth != c.negated
    join = " & " if c.all == truth else " | "
    return join.join(f"({_render(p, truth)})" for p in c.parts)


# ---------------------------------------------------------------------------------- parsing


@v_args(inline=True)
class _Build(Transformer[Token, _Node]):
    """The callbacks lark calls as it reduces each rule (see selector.lark)."""

    def or_(self, a: _Node, _op: Token, b: _Node) -> _Cond:
        return _join(False, _cond(a), _cond(b))

    def and_(self, a: _Node, _op: Token, b: _Node) -> _Cond:
        return _join(True, _cond(a), _cond(b))

    def not_(self, _op: Token, a: _Node) -> _Cond:
        return _negate(_cond(a))

    def compare(self, a: _Node, op: Token, b: _Node) -> _Cond:
        return _compare(_value(a, op), str(op), _value(b, op))

    def between(self, a: _Node, op: Token, lo: _Node, _and: Token, hi: _Node) -> _Cond:
        x = _value(a, op)
        return _Group(True, (_compare(x, ">=", _value(lo, op)), _compare(x, "<=", _value(hi, op))))

    def not_between(self, a: _Node, _not: Token, op: Token, lo: _Node, _and: Token, hi: _Node) -> _Cond:
        x = _value(a, op)
        return _Group(False, (_compare(x, "<", _value(lo, op)), _compare(x, ">", _value(hi, op))))

    def in_(self, a: _Node, op: Token, _lpar: Token, members: str, _rpar: Token) -> _Cond:
        name = _identifier(a, op)
        return _Leaf(f"{name} in {{{members}}}", f"{name} not in {{{members}}}")

    def not_in(self, a: _Node, _not: Token, op: Token, lpar: Token, members: str, rpar: Token) -> _Cond:
        return _negate(self.in_(a, op, lpar, members, rpar))

    def like(
        self, a: _Node, op: Token, pattern: Token, _escape: Token | None = None, escape: Token | None = None
    ) -> _Cond:
        name = _identifier(a, op)
        if escape is None:
            return _like(name, pattern, None)
        char = _unquote(escape)
        if len(char) != 1:
            raise _Misplaced(f"ESCAPE takes one character, not {_show(char)}", *_pos(escape))
        return _like(name, pattern, char)

    def not_like(self, a: _Node, _not: Token, *rest: Token) -> _Cond:
        return _negate(self.like(a, *rest))

    def is_null(self, a: _Node, op: Token, _null: Token) -> _Cond:
        name = _identifier(a, op)
        return _Leaf(f"not exists {name}", f"exists {name}")

    def is_not_null(self, a: _Node, op: Token, _not: Token, null: Token) -> _Cond:
        return _negate(self.is_null(a, op, null))

    def arith(self, a: _Node, op: Token, b: _Node) -> _Value:
        left, right = _value(a, op), _value(b, op)
        _number(left, op)
        _number(right, op)
        return _expression(f"({left.text} {op} {right.text})", left.line, left.column, left, right)

    def sign(self, op: Token, a: _Node) -> _Value:
        v = _value(a, op)
        n = _number(v, op)
        if n is not None:  # a signed literal: -957
            return _literal(-n if op == "-" else n, op)
        # unary + is arithmetic too: NULL, or a non-number, gives UNKNOWN
        return _expression(f"-{v.text}" if op == "-" else f"({v.text} + 0)", *_pos(op), v)

    def int_(self, tok: Token) -> _Value:
        digits = tok.rstrip("lL")
        if digits[:2] in ("0x", "0X"):
            base, digits = 16, digits[2:]
        elif len(digits) > 1 and digits[0] == "0":
            if not set(digits) <= set("01234567"):
                message = f"{tok} is not a number: a leading 0 makes it octal (digits 0-7), as in Java"
                raise _Misplaced(message, *_pos(tok))
            base = 8
        else:
            base = 10
        try:
            return _literal(int(digits, base), tok)
        except (ValueError, FilterError):  # more digits than Python reads or prints
            raise FilterError(f"the number at {_at(*_pos(tok))} has too many digits") from None

    def float_(self, tok: Token) -> _Value:
        v = float(tok)
        if not math.isfinite(v):
            raise FilterError(f"the number {tok} at {_at(*_pos(tok))} is beyond the largest double")
        return _literal(v, tok)

    def string(self, tok: Token) -> _Value:
        return _literal(_unquote(tok), tok)

    def bool_(self, tok: Token) -> _Value:
        return _literal(tok.lower() == "true", tok)

    def field(self, tok: Token) -> _Value:
        name = str(tok)
        if name.startswith("JMS"):
            raise FilterError(
                f"identifier {name} at {_at(*_pos(tok))}: names beginning with JMS are JMS message headers "
                "and JMS-defined properties, which flowbus events do not carry"
            )
        if not is_name(name):
            raise FilterError(
                f"identifier {name} at {_at(*_pos(tok))} cannot name a flowbus field: ASCII letters, digits "
                f"and _ only, and none of the words {_FLOWBUS_ONLY_WORDS}"
            )
        return _Value(name, *_pos(tok), field=name)

    def paren(self, _lpar: Token, inner: _Node, _rpar: Token) -> _Node:
        return inner

    def members(self, *items: _Value | Token) -> str:
        """The flowbus text of the set (its members are literals: the grammar says so)."""
        return ", ".join(value_to_text(cast(Value, m.literal)) for m in items if isinstance(m, _Value))


@cache
def _lark() -> Lark:
    grammar = files("flowbus.filters").joinpath("selector.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", transformer=_Build())


# ----------------------------------------------------------------------------------- errors


_READABLE = {
    "OR": "OR",
    "AND": "AND",
    "NOT": "NOT",
    "BETWEEN": "BETWEEN",
    "IN": "IN",
    "LIKE": "LIKE",
    "ESCAPE": "ESCAPE",
    "IS": "IS",
    "NULL": "NULL",
    "CMP": "a comparison (= <> < <= > >=)",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "NAME": "an identifier",
    "INT": "a number",
    "FLOAT": "a number",
    "STRING": "a string",
    "TRUE": "TRUE/FALSE",
    "FALSE": "TRUE/FALSE",
    "$END": "end of input",
}
"""Each terminal of selector.lark, as an error message names it."""
_OPERAND_START = frozenset({"NAME", "INT", "FLOAT", "STRING", "TRUE", "FALSE", "PLUS", "MINUS"})
_ORDER = list(dict.fromkeys(["an identifier or a literal", *_READABLE.values()]))
_HINTS = {
    "'": " (an unterminated string? a quote inside one is written '')",
    '"': " (strings are in single quotes)",
    "!": " (not equal is written <>)",
}


def _readable(expected: Iterable[str]) -> tuple[str, ...]:
    names = set(expected)
    words = set()
    if names >= _OPERAND_START:
        names -= _OPERAND_START
        words.add("an identifier or a literal")
    words.update(_READABLE[n] for n in names)
    return tuple(sorted(words, key=_ORDER.index))


def _syntax_error(exc: UnexpectedToken | UnexpectedCharacters, text: str) -> FilterSyntaxError:
    if isinstance(exc, UnexpectedCharacters):
        message = f"unexpected character {exc.char!r}{_HINTS.get(exc.char, '')}"
        line, column, expected = exc.line, exc.column, exc.allowed or ()
    elif exc.token.type == "$END":
        end = len(text.rstrip())
        line = text.count("\n", 0, end) + 1
        column = end - (text.rfind("\n", 0, end) + 1) + 1
        message, expected = "unexpected end of selector", exc.accepts or exc.expected
    else:
        message = f"unexpected {str(exc.token)!r}"
        line, column, expected = exc.line, exc.column, exc.accepts or exc.expected
    return FilterSyntaxError(message, text=text, line=line, column=column, expected=_readable(expected))


# ------------------------------------------------------------------------------------ entry


def selector(text: str) -> Filter:
    """The flowbus filter that matches exactly the events the JMS selector ``text`` selects.

    ``selector("price > 100 AND NOT sym LIKE 'X%'")``. Raises :class:`FilterSyntaxError`, with
    the line, column and what was expected there, for text that is not a selector, and
    :class:`FilterError` for a selector flowbus cannot say exactly (see the module's note).
    """
    return parse(selector_source(text))


def selector_source(text: str) -> str:
    """The flowbus filter text of the JMS selector ``text`` (what :func:`selector` parses:
    parsed again, it comes from the parser's memo), with :func:`selector`'s errors of the
    selector itself."""
    if not isinstance(text, str):
        raise FilterError(f"a selector is text, not {type(text).__name__}")
    if not text.strip():
        raise FilterSyntaxError("empty selector: a selector is a condition", text=text, line=1, column=1)
    try:
        return _render(_cond(cast(_Node, _lark().parse(text))), True)
    except (UnexpectedToken, UnexpectedCharacters) as exc:
        raise _syntax_error(exc, text) from None
    except _Misplaced as exc:
        raise FilterSyntaxError(exc.message, text=text, line=exc.line, column=exc.column) from None
    except RecursionError:
        raise FilterError("selector nested too deeply") from None
