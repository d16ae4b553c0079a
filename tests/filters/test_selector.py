"""selector(): JMS message selectors to flowbus filters, their three-valued meaning, their errors.

Three kinds of test: a table of selectors and the flowbus filters they become (compared with
``parse`` of the flowbus text: equal canonical forms), a table of selectors and events pinning
the NULL rule and the documented choices (type mismatches, NOT BETWEEN, LIKE on a non-string,
a boolean identifier), and a reference evaluator: random selector trees (comparisons,
arithmetic, AND/OR/NOT, BETWEEN, IN, IS NULL, LIKE) rendered to text and evaluated directly
with SQL's three values, on random events with fields missing, None, ints, floats (NaN and
infinities too), strings and booleans. A message is selected exactly when the reference says
TRUE. Then the errors: syntax errors point at the offending character, refused constructs say
why, garbage gives a FilterError and never a crash.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError, FilterSyntaxError
from flowbus.filters import Filter, parse
from flowbus.filters.selector import _READABLE, _lark, selector

# ------------------------------------------------------------------ translations

CASES: list[tuple[str, str]] = [
    # comparisons and literals
    ("price > 100", "price > 100"),
    ("sym = 'IBM'", 'sym = "IBM"'),
    ("s = 'it''s'", 's = "it\'s"'),
    ("s = ''", 's = ""'),
    ("s = 'a\"b\\c'", r's = "a\"b\\c"'),
    ("s = 'two\nlines'", r's = "two\nlines"'),
    ("x <> 5", "x != 5"),
    ("x <= 5 AND x >= 1", "x <= 5 & x >= 1"),
    ("5 < x", "x > 5"),
    ("x = -957", "x = -957"),
    ("x = +62", "x = 62"),
    ("x = 57L", "x = 57"),
    ("x = 0x1F", "x = 31"),
    ("x = 0X1fl", "x = 31"),
    ("x = 017", "x = 15"),
    ("x = 0", "x = 0"),
    ("x = 7E3", "x = 7000.0"),
    ("x = -57.9E2", "x = -5790.0"),
    ("x = 7.", "x = 7.0"),
    ("x = .5", "x = 0.5"),
    ("x = 1e-3", "x = 0.001"),
    ("x = 99999999999999999999", "x = 99999999999999999999"),
    ("flag = TRUE", "flag = true"),
    ("flag = false", "flag = false"),
    ("TRUE", "true"),
    ("FALSE", "false"),
    ("1 < 2", "true"),
    ("'a' = 1", "false"),
    # arithmetic
    ("a * b > 1000", "a * b > 1000"),
    ("x > 2 + 3 * 4", "x > 14"),
    ("x > (2 + 3) * 4", "x > 20"),
    ("a / 2 > 1", "a / 2 > 1"),
    ("-a < 3", "-a < 3"),
    ("+a < 3", "a + 0 < 3"),
    ("a - -b = 1", "a - -b = 1"),
    ("a = b", "a = b"),
    # BETWEEN, IN, IS NULL
    ("x BETWEEN 1 AND 5", "x >= 1 & x <= 5"),
    ("x NOT BETWEEN 1 AND 5", "x < 1 | x > 5"),
    ("a + 1 BETWEEN 1 AND 5", "a + 1 >= 1 & a + 1 <= 5"),
    ("x IN ('a', 'b')", 'x in {"a", "b"}'),
    ("x IN ('a', -1, TRUE, 2.5)", 'x in {"a", -1, true, 2.5}'),
    ("x NOT IN ('a', 'b')", 'x not in {"a", "b"}'),
    ("x IS NULL", "not exists x"),
    ("x IS NOT NULL", "exists x"),
    # LIKE
    ("x LIKE 'abc'", 'x = "abc"'),
    ("x LIKE 'abc%'", 'x prefix "abc"'),
    ("x LIKE '%abc'", 'x suffix "abc"'),
    ("x LIKE '%abc%'", 'x contains "abc"'),
    ("x LIKE '%%abc%%'", 'x contains "abc"'),
    ("x LIKE '%'", 'x prefix ""'),
    ("x LIKE 'ab%cd'", 'x prefix "ab" & x suffix "cd"'),
    ("x LIKE 'a%%b'", 'x prefix "a" & x suffix "b"'),
    ("x LIKE 'it''s%'", 'x prefix "it\'s"'),
    ("x LIKE '100\\%' ESCAPE '\\'", 'x = "100%"'),
    ("x LIKE '100!%%' ESCAPE '!'", 'x prefix "100%"'),
    ("x LIKE '%a!_b%' ESCAPE '!'", 'x contains "a_b"'),
    ("x LIKE 'a!!%' ESCAPE '!'", 'x prefix "a!"'),
    ("x LIKE 'a%%' ESCAPE '%'", 'x = "a%"'),
    ("x LIKE 'a__' ESCAPE '_'", 'x = "a_"'),
    ("x NOT LIKE 'abc'", 'x != "abc"'),
    ("x NOT LIKE 'abc%'", 'exists x & !(x prefix "abc")'),
    ("x NOT LIKE 'ab%cd'", 'exists x & !(x prefix "ab" & x suffix "cd")'),
    # NOT: never a bare flowbus negation
    ("NOT (x < 5)", "exists x & !(x < 5)"),
    ("NOT x < 5", "exists x & !(x < 5)"),
    ("NOT x = 5", "x != 5"),
    ("NOT x <> 5", "x = 5"),
    ("NOT NOT x < 5", "x < 5"),
    ("NOT (x IS NULL)", "exists x"),
    ("NOT x IS NOT NULL", "not exists x"),
    ("NOT x BETWEEN 1 AND 5", "(exists x & !(x >= 1)) | (exists x & !(x <= 5))"),
    ("NOT x NOT BETWEEN 1 AND 5", "exists x & !(x < 1) & !(x > 5)"),  # TRUE for a string x too
    ("NOT x IN ('a')", 'x not in {"a"}'),
    ("NOT x LIKE 'a%'", 'exists x & !(x prefix "a")'),
    ("NOT (a < b)", "exists a & exists b & !(a < b)"),
    ("NOT (a * b > 5)", "(a * b = a * b | a * b != a * b) & !(a * b > 5)"),
    ("NOT (a + 1 < b)", "(a + 1 = a + 1 | a + 1 != a + 1) & exists b & !(a + 1 < b)"),
    ("NOT (1 < 2)", "false"),
    ("NOT TRUE", "false"),
    ("flag", "flag = true"),
    ("NOT flag", "flag = false"),
    ("NOT (flag = TRUE)", "flag != true"),
    # AND, OR, precedence, De Morgan
    ("a = 1 AND b = 2 OR c = 3", "(a = 1 & b = 2) | c = 3"),
    ("a = 1 AND (b = 2 OR c = 3)", "(a = 1 & b = 2) | (a = 1 & c = 3)"),
    ("NOT (a = 1 AND b < 2)", "a != 1 | (exists b & !(b < 2))"),
    ("NOT (a = 1 OR b < 2)", "a != 1 & exists b & !(b < 2)"),
    ("NOT (a = 1 OR NOT (b = 2 AND c))", "a != 1 & b = 2 & c = true"),
    ("a AND b OR NOT c", "(a = true & b = true) | c = false"),
    # case, whitespace, identifiers near keywords
    ("x between 1 AnD 2 or Not y iS nUlL", "(x >= 1 & x <= 2) | exists y"),
    ("order = 1 AND notes = 2 AND island = 3", "order = 1 & notes = 2 & island = 3"),
    ("nullable = TRUE AND likes IS NULL AND TRUEx = 1", "nullable = true & not exists likes & TRUEx = 1"),
    ("X = 1 AND x = 2", "X = 1 & x = 2"),
    ("\tx\n=\r\n1  ", "x = 1"),
    ("x=1 AND y<>2", "x = 1 & y != 2"),
    ("((x = 1))", "x = 1"),
]


@pytest.mark.parametrize(("source", "flowbus"), CASES, ids=[s for s, _ in CASES])
def test_translations(source: str, flowbus: str) -> None:
    assert selector(source) == parse(flowbus)


# --------------------------------------------------------------- what selects what

NAN = math.nan

MEANING: list[tuple[str, dict[str, Any], bool]] = [
    # the NULL rule: UNKNOWN selects nothing, NOT UNKNOWN neither
    ("x < 5", {}, False),
    ("NOT (x < 5)", {}, False),
    ("NOT (x < 5)", {"x": None}, False),
    ("NOT (x < 5)", {"x": 7}, True),
    ("x <> 5", {}, False),
    ("NOT (x = 1 OR y = 2)", {"x": 2}, False),  # FALSE OR UNKNOWN is UNKNOWN
    ("NOT (x = 1 AND y = 2)", {"x": 2}, True),  # FALSE AND UNKNOWN is FALSE
    ("x = 1 OR y = 2", {"x": 1}, True),  # TRUE OR UNKNOWN is TRUE
    ("x IS NULL", {"x": None}, True),
    ("x IS NULL", {"x": 0}, False),
    ("NOT (a * b > 5)", {"a": 1}, False),
    ("NOT (a * b > 5)", {"a": 1, "b": 2}, True),
    ("NOT (a * b > 5)", {"a": NAN, "b": 2}, True),
    ("NOT (a * b > 5)", {"a": "x", "b": 2}, False),  # arithmetic on a string: UNKNOWN
    ("NOT (x / 0.0 > 1)", {"x": 1}, False),  # division by zero: UNKNOWN
    ("x / 2 = 3.5", {"x": 7}, True),  # exact division, as ActiveMQ's doubles
    ("+x = 'a'", {"x": "a"}, False),  # unary + is arithmetic
    # different types compare FALSE, and <> is NOT =
    ("NOT (x < 5)", {"x": "a"}, True),
    ("x <> 5", {"x": "a"}, True),
    ("x = 1", {"x": 1.0}, True),
    ("x = 1", {"x": True}, False),
    ("NOT (a < b)", {"a": 1, "b": "b"}, True),
    ("a < b", {"a": "a", "b": "b"}, True),
    ("x <> 5", {"x": NAN}, True),
    ("NOT (x > 5)", {"x": NAN}, True),
    # IN, LIKE, BETWEEN on a value of another type
    ("x NOT IN ('a')", {"x": 5}, True),
    ("x NOT IN ('a')", {}, False),
    ("x NOT LIKE 'a%'", {"x": 5}, True),
    ("x NOT LIKE 'a%'", {}, False),
    ("x LIKE '%'", {"x": ""}, True),
    ("x LIKE '%'", {"x": 1}, False),
    ("NOT x LIKE '%'", {"x": 1}, True),
    ("x LIKE 'a%b'", {"x": "ab"}, True),
    ("x LIKE 'a%b'", {"x": "a"}, False),
    ("x NOT BETWEEN 1 AND 5", {"x": "a"}, False),  # x < 1 OR x > 5
    ("NOT (x BETWEEN 1 AND 5)", {"x": "a"}, True),
    ("x NOT BETWEEN 1 AND 5", {}, False),
    ("x NOT BETWEEN 1 AND 5", {"x": 6}, True),
    # an identifier alone
    ("flag", {"flag": True}, True),
    ("NOT flag", {"flag": False}, True),
    ("NOT flag", {}, False),
    ("NOT flag", {"flag": "no"}, False),
    ("flag <> TRUE", {"flag": "no"}, True),
]


@pytest.mark.parametrize(("source", "event", "selected"), MEANING)
def test_meaning(source: str, event: dict[str, Any], selected: bool) -> None:
    assert selector(source).matches(event) is selected


# ---------------------------------------------------------- the reference evaluator


class _Null:
    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()
"""A NULL value (a missing field, or one holding None)."""

Truth = bool | None
"""TRUE, FALSE or UNKNOWN (None)."""


def _class(v: Any) -> int:
    return {bool: 0, int: 1, float: 1, str: 2}.get(type(v), -1)


def _number(v: Any) -> bool:
    return _class(v) == 1


def _not(a: Truth) -> Truth:
    return None if a is None else not a


def _and(a: Truth, b: Truth) -> Truth:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: Truth, b: Truth) -> Truth:
    return _not(_and(_not(a), _not(b)))


def ref_compare(a: Any, op: str, b: Any) -> Truth:
    """JMS: NULL makes UNKNOWN; different types compare FALSE; <> is NOT =."""
    if a is NULL or b is NULL:
        return None
    if op in ("=", "<>"):
        equal = _class(a) == _class(b) >= 0 and a == b
        return equal if op == "=" else not equal
    if _class(a) != _class(b) or _class(a) not in (1, 2):
        return False
    return bool({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op])


def ref_like(v: Any, pattern: str, escape: str | None) -> Truth:
    """SQL LIKE by regular expression: % any run, _ any one character."""
    if v is NULL:
        return None
    if type(v) is not str:
        return False
    regex, chars = [], iter(pattern)
    for ch in chars:
        if ch == escape:
            regex.append(re.escape(next(chars)))
        else:
            regex.append({"%": ".*", "_": "."}.get(ch, re.escape(ch)))
    return re.fullmatch("".join(regex), v, re.DOTALL) is not None


@dataclass(frozen=True)
class Val:
    """A selector value: its text, its precedence (1 + -, 2 * /, 3 unary, 4 atom), its value."""

    text: str
    precedence: int
    value: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Sel:
    """A selector condition: its text, its precedence (1 OR, 2 AND, 3 NOT, 4 atom), its truth."""

    text: str
    precedence: int
    truth: Callable[[Mapping[str, Any]], Truth]


def _field(name: str) -> Val:
    def value(e: Mapping[str, Any]) -> Any:
        v = e.get(name)
        return NULL if v is None else v

    return Val(name, 4, value)


def _const(text: str, v: Any) -> Val:
    return Val(text, 4, lambda e: v)


def _arith(op: str, a: Any, b: Any) -> Any:
    if a is NULL or b is NULL or not _number(a) or not _number(b):
        return NULL
    try:
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[op]()
    except (ZeroDivisionError, OverflowError):
        return NULL


def _sign(op: str, a: Any) -> Any:
    """Unary + and - are arithmetic: a number, or NULL."""
    if a is NULL or not _number(a):
        return NULL
    return -a if op == "-" else a


def _wrap(x: Val | Sel, need: int) -> str:
    return x.text if x.precedence >= need else f"({x.text})"


FIELDS = ("a", "b", "c", "flag")
NUMBERS = [("0", 0), ("1", 1), ("2", 2), ("7", 7), ("0x1F", 31), ("017", 15), ("7L", 7)]
NUMBERS += [("2.0", 2.0), (".5", 0.5), ("7.", 7.0), ("15E-1", 1.5), ("1e0", 1.0)]
STRINGS = ["", "a", "ab", "it's", "100%", "a_b"]
EVENT_VALUES = [None, 0, 1, 2, -1, 7, 15, 31, 0.5, 2.0, -1.5, 7.0, NAN, math.inf, -math.inf, True, False]
EVENT_VALUES += ["", "a", "ab", "abc", "b", "ba", "it's", "100%", "100", "a_b", "axb", "x!y", "\\", "x"]

numbers = st.sampled_from(NUMBERS).map(lambda p: _const(*p))
strings = st.sampled_from(STRINGS).map(lambda s: _const("'" + s.replace("'", "''") + "'", s))
booleans = st.sampled_from([("TRUE", True), ("false", False)]).map(lambda p: _const(*p))
fields = st.sampled_from(FIELDS).map(_field)


@st.composite
def values(draw: st.DrawFn, depth: int = 2) -> Val:
    """A value: a field, a number literal or arithmetic over them (never on a string literal)."""
    kind = draw(st.integers(0, 5 if depth > 0 else 1))
    if kind == 0:
        return draw(fields)
    if kind == 1:
        return draw(numbers)
    if kind == 2:
        x, sign = draw(values(depth - 1)), draw(st.sampled_from("+-"))
        return Val(f"{sign}{_wrap(x, 3)}", 3, lambda e: _sign(sign, x.value(e)))
    op = draw(st.sampled_from("+-*/"))
    a, b = draw(values(depth - 1)), draw(values(depth - 1))
    if op == "/":  # a constant divisor is never zero, so the selector never folds 1 / 0
        b = draw(st.one_of(fields, numbers.filter(lambda n: n.value({}) != 0)))
    prec = 1 if op in "+-" else 2
    return Val(
        f"{_wrap(a, prec)} {op} {_wrap(b, prec + 1)}", prec, lambda e: _arith(op, a.value(e), b.value(e))
    )


@st.composite
def comparisons(draw: st.DrawFn) -> Sel:
    op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
    # strings and booleans are compared with = and <> only (ordering a literal one is refused)
    operand = st.one_of(values(), strings, booleans) if op in ("=", "<>") else values()
    a, b = draw(operand), draw(operand)
    return Sel(f"{a.text} {op} {b.text}", 4, lambda e: ref_compare(a.value(e), op, b.value(e)))


@st.composite
def betweens(draw: st.DrawFn) -> Sel:
    """``x BETWEEN lo AND hi`` is ``x >= lo AND x <= hi``; NOT BETWEEN is ``x < lo OR x > hi`` (JMS)."""
    x, lo, hi = draw(st.one_of(fields, values())), draw(values()), draw(values())
    negated = draw(st.booleans())

    def truth(e: Mapping[str, Any]) -> Truth:
        v, low, high = x.value(e), lo.value(e), hi.value(e)
        if negated:
            return _or(ref_compare(v, "<", low), ref_compare(v, ">", high))
        return _and(ref_compare(v, ">=", low), ref_compare(v, "<=", high))

    return Sel(f"{x.text} {'NOT BETWEEN' if negated else 'BETWEEN'} {lo.text} AND {hi.text}", 4, truth)


@st.composite
def ins(draw: st.DrawFn) -> Sel:
    x = draw(fields)
    members = draw(st.lists(st.one_of(strings, numbers, booleans), min_size=1, max_size=3))
    negated = draw(st.booleans())
    text = f"{x.text} {'NOT IN' if negated else 'IN'} ({', '.join(m.text for m in members)})"

    def truth(e: Mapping[str, Any]) -> Truth:
        v = x.value(e)
        if v is NULL:
            return None
        found = any(ref_compare(v, "=", m.value(e)) for m in members)
        return found != negated

    return Sel(text, 4, truth)


LIKE_PAIRS = [("a", "b"), ("ab", "x"), ("it's", "100%"), ("a_b", "x!y")]
"""Prefix and suffix pairs that cannot overlap (the translation refuses those that can)."""


def _escaped(segment: str, escape: str | None) -> str:
    if escape is None:
        return segment
    return "".join(escape + ch if ch in ("%", "_", escape) else ch for ch in segment)


@st.composite
def likes(draw: st.DrawFn) -> Sel:
    x = draw(fields)
    escape = draw(st.sampled_from([None, "!", "\\", "#"]))
    segments = ["", "a", "ab", "b", "it's"] + (["100%", "a_b", "x!y", "\\", "#"] if escape else [])
    segment = st.sampled_from(segments)
    kind = draw(st.sampled_from(["exact", "prefix", "suffix", "contains", "any", "both"]))
    if kind == "both":
        p, s = draw(st.sampled_from([(p, s) for p, s in LIKE_PAIRS if escape or (p + s).isalpha()]))
        pattern = _escaped(p, escape) + draw(st.sampled_from(["%", "%%"])) + _escaped(s, escape)
    else:
        body = _escaped(draw(segment), escape)
        pattern = {
            "exact": body,
            "prefix": body + "%",
            "suffix": "%" + body,
            "contains": "%" + body + "%",
            "any": "%",
        }[kind]
    negated = draw(st.booleans())
    quoted = "'" + pattern.replace("'", "''") + "'"
    text = f"{x.text} {'NOT LIKE' if negated else 'LIKE'} {quoted}"
    if escape is not None:
        text += f" ESCAPE '{escape}'"

    def truth(e: Mapping[str, Any]) -> Truth:
        t = ref_like(x.value(e), pattern, escape)
        return _not(t) if negated else t

    return Sel(text, 4, truth)


def _is_null(draw: st.DrawFn) -> Sel:
    x, negated = draw(fields), draw(st.booleans())
    return Sel(f"{x.text} IS {'NOT ' if negated else ''}NULL", 4, lambda e: (x.value(e) is NULL) != negated)


def _flag(draw: st.DrawFn) -> Sel:
    """An identifier alone: TRUE or FALSE when it holds a boolean, else UNKNOWN."""
    x = draw(fields)

    def truth(e: Mapping[str, Any]) -> Truth:
        v = x.value(e)
        return v if type(v) is bool else None

    return Sel(x.text, 4, truth)


def _boolean(draw: st.DrawFn) -> Sel:
    b = draw(booleans)
    return Sel(b.text, 4, lambda e: b.value(e))


@st.composite
def leaves(draw: st.DrawFn) -> Sel:
    kind = draw(
        st.sampled_from(["cmp", "cmp", "cmp", "between", "between", "in", "like", "like", "null", "flag"])
    )
    if kind == "flag":  # now and then a TRUE or FALSE literal instead
        return _flag(draw) if draw(st.integers(0, 3)) else _boolean(draw)
    if kind == "null":
        return _is_null(draw)
    return draw({"cmp": comparisons, "between": betweens, "in": ins, "like": likes}[kind]())


@st.composite
def selectors(draw: st.DrawFn, max_leaves: int = 5) -> Sel:
    if max_leaves <= 1 or draw(st.integers(0, 2)) == 0:
        return draw(leaves())
    kind = draw(st.sampled_from(["AND", "OR", "NOT"]))
    if kind == "NOT":
        a = draw(selectors(max_leaves - 1))
        return Sel(f"NOT {_wrap(a, 3)}", 3, lambda e: _not(a.truth(e)))
    split = draw(st.integers(1, max_leaves - 1))
    a, b = draw(selectors(split)), draw(selectors(max_leaves - split))
    prec = 2 if kind == "AND" else 1
    combine = _and if kind == "AND" else _or
    return Sel(
        f"{_wrap(a, prec)} {kind} {_wrap(b, prec + 1)}", prec, lambda e: combine(a.truth(e), b.truth(e))
    )


ABSENT = object()
events = st.fixed_dictionaries({f: st.sampled_from([*EVENT_VALUES, *[ABSENT] * 8]) for f in FIELDS}).map(
    lambda e: {f: v for f, v in e.items() if v is not ABSENT}
)
"""An event: each field absent a fifth of the time, else any value of the pool (None included)."""


def _lower_keywords(text: str) -> str:
    """The same selector with its keywords in lower case (string literals untouched)."""
    words = r"\b(AND|OR|NOT|BETWEEN|IN|LIKE|ESCAPE|IS|NULL|TRUE|FALSE)\b"
    parts = re.split(r"('(?:[^']|'')*')", text)
    return "".join(p if p.startswith("'") else re.sub(words, lambda m: m.group().lower(), p) for p in parts)


REFERENCE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@REFERENCE
@given(selectors(), st.lists(events, min_size=4, max_size=12), st.booleans())
def test_selected_exactly_when_the_reference_says_true(
    sel: Sel, evs: list[dict[str, Any]], lower: bool
) -> None:
    text = _lower_keywords(sel.text) if lower else sel.text
    try:
        f = selector(text)
    except FilterError as err:
        assume("too complex" not in str(err))
        raise
    assert parse(f.to_text()) == f  # a selector's filter travels as text (wire, store)
    for e in evs:
        assert f.matches(e) == (sel.truth(e) is True), (text, e, sel.truth(e), f.to_text())


# ------------------------------------------------------------------------ errors

SYNTAX_ERRORS: list[tuple[str, int, int, str]] = [
    ("price > AND 5", 1, 9, "an identifier or a literal"),
    ("price >", 1, 8, "end of selector"),
    ("", 1, 1, "empty selector"),
    ("  \n ", 1, 1, "empty selector"),
    ("x = 'abc", 1, 5, "unterminated string"),
    ("x = 1 AND\n  y = 'it''s", 2, 11, "unterminated string"),  # ('it' is a string)
    ("x != 5", 1, 3, "<>"),
    ('x = "a"', 1, 5, "single quotes"),
    ("x = 1 AND\n  y = (2", 2, 9, "')'"),
    ("x = 1\n  AND (y = 2 OR)", 2, 16, "an identifier or a literal"),
    ("x = 1 y", 1, 7, "end of input"),
    ("x IN ()", 1, 7, "a string"),
    ("x IN (a)", 1, 7, "a number"),
    ("x IN 'a'", 1, 6, "'('"),
    ("x = NULL", 1, 5, "an identifier or a literal"),
    ("x LIKE y", 1, 8, "a string"),
    ("x BETWEEN 1", 1, 12, "AND"),
    ("and = 1", 1, 1, "an identifier or a literal"),
    ("x IS 5", 1, 6, "NULL"),
    ("x = 09", 1, 5, "octal"),
    ("x = 1 AND @", 1, 11, "unexpected character '@'"),
    ("(a > 1) = TRUE", 1, 9, "condition cannot be an operand"),
    ("a + (b > 1) > 2", 1, 3, "condition cannot be an operand"),
    ("price + 1", 1, 1, "not a condition"),
    ("x = 1 AND\n 'a'", 2, 2, "not a condition"),
    ("5", 1, 1, "not a condition"),
    ("a + b IN ('x')", 1, 1, "identifier"),
    ("1 IS NULL", 1, 1, "identifier"),
    ("'a' LIKE 'a'", 1, 1, "identifier"),
    ("(x > 1) IS NULL", 1, 9, "identifier"),
    ("x LIKE 'a' ESCAPE 'ab'", 1, 19, "one character"),
    ("x LIKE 'a' ESCAPE ''", 1, 19, "one character"),
]


@pytest.mark.parametrize(("text", "line", "column", "wanted"), SYNTAX_ERRORS)
def test_syntax_errors_say_where_and_what(text: str, line: int, column: int, wanted: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        selector(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert f"at line {line}, column {column}" in str(err)
    assert err.text == text
    assert wanted in str(err)
    raw = {"LPAR", "RPAR", "CMP", "NAME", "INT", "FLOAT", "STRING", "COMMA", "$END"}
    assert not raw & set(err.expected), err.expected


REFUSED: list[tuple[str, str]] = [
    ("x LIKE 'a_c'", "LIKE 'a_c' at line 1, column 8 is refused: _ matches any one character"),
    ("x LIKE '_'", "_ matches any one character"),
    ("x NOT LIKE '%a_'", "_ matches any one character"),
    ("x LIKE 'a%b%c'", "LIKE 'a%b%c' at line 1, column 8 is refused: flowbus has no general pattern match"),
    ("x LIKE '%a%b'", "no general pattern match"),
    ("x LIKE 'a%b%'", "no general pattern match"),
    ("x LIKE 'a%a'", "'a' starts with 'a' and ends with 'a' but does not match"),
    ("x LIKE 'ab%ba'", "'aba' starts with 'ab' and ends with 'ba'"),
    ("x LIKE 'it''s%s'", "'it''s' starts with 'it''s' and ends with 's'"),
    ("x LIKE 'a\\b' ESCAPE '\\'", "must be followed by %, _ or itself"),
    ("x LIKE 'a\\' ESCAPE '\\'", "must be followed by %, _ or itself"),
    ("x < 'abc'", "'abc' at line 1, column 5 cannot be ordered"),
    ("x >= TRUE", "TRUE at line 1, column 6 cannot be ordered"),
    ("'a' < 'b'", "cannot be ordered"),
    ("x BETWEEN 'a' AND 'b'", "'a' at line 1, column 11 cannot be ordered"),
    ("x + 'a' > 1", "arithmetic on 'a' at line 1, column 5"),
    ("-'a' = x", "arithmetic on 'a'"),
    ("x IN (-TRUE)", "arithmetic on TRUE"),
    ("$x = 1", "identifier $x at line 1, column 1 cannot name a flowbus field"),
    ("a$ = 1", "cannot name a flowbus field"),
    ("prefix = 1", "cannot name a flowbus field"),
    ("x = 1 OR Exists = 1", "identifier Exists at line 1, column 10"),
    ("é = 1", "cannot name a flowbus field"),
    ("JMSType = 'a'", "JMS message headers"),
    ("x = 1e999", "beyond the largest double"),
    ("x = " + "9" * 5000, "too many digits"),
    ("x = 0x" + "f" * 5000, "too many digits"),
    ("x = 1 / 0", "division by zero"),
    ("a" + " + a" * 150 + " > 1", "nests more than 100 levels"),
    (" AND ".join(f"(a{i} = 1 OR b{i} = 2)" for i in range(9)), "too complex"),
]


@pytest.mark.parametrize(("text", "fragment"), REFUSED)
def test_refused_selectors_say_why(text: str, fragment: str) -> None:
    with pytest.raises(FilterError) as info:
        selector(text)
    assert not isinstance(info.value, FilterSyntaxError), str(info.value)
    assert fragment in str(info.value)


def test_deep_nesting_is_an_error_or_a_filter_never_a_crash() -> None:
    assert selector("NOT " * 5000 + "x = 1") == parse("x = 1")
    assert selector("(" * 3000 + "x = 1" + ")" * 3000) == parse("x = 1")
    alternating = "x = 1"
    for i in range(3000):
        alternating = f"({alternating}) {'AND' if i % 2 else 'OR'} y{i % 7} = 1"
    with pytest.raises(FilterError):
        selector(alternating)


def test_not_text_is_refused() -> None:
    with pytest.raises(FilterError, match="a selector is text"):
        selector(b"x = 1")  # type: ignore[arg-type]


def test_errors_leave_no_state_behind() -> None:
    good = selector("a = 1 AND b LIKE 'x%'")
    for bad in ["a = ", "a LIKE 'x_'", "(a > 1) = TRUE", "a < 'x'", "a = 'x", "JMSX = 1"]:
        for _ in range(2):  # the same error again: nothing was remembered half-done
            with pytest.raises(FilterError):
                selector(bad)
        assert selector("a = 1 AND b LIKE 'x%'") == good
    assert _lark() is _lark()


def test_every_terminal_has_a_readable_name() -> None:
    terminals = {t.name for t in _lark().terminals if not t.name.startswith("__")}
    assert terminals <= set(_READABLE)


# --------------------------------------------------------------- garbage in

KEYWORDS = ["AND", "or", "Not", "BETWEEN", "in", "LIKE", "escape", "IS", "null", "TRUE", "false"]
TOKENS = st.one_of(
    st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "(", ")", ",", "!", "!=", "@", '"'])
    | st.sampled_from(KEYWORDS)
    | st.sampled_from(["x", "y", "price", "$z", "é", "prefix", "JMSType", "order", "in_"])
    | st.sampled_from(["0", "7", "017", "09", "0x1F", "57L", "7.", ".5", "7E3", "1e999", "9" * 30])
    | st.sampled_from(["''", "'a'", "'it''s'", "'a%'", "'%a%'", "'a_b'", "'\\'", "'", "'abc"])
)
SEPARATORS = st.sampled_from([" ", " ", "", "\n", "\t"])


@st.composite
def soups(draw: st.DrawFn) -> str:
    out = []
    for tok in draw(st.lists(TOKENS, max_size=12)):
        out += [tok, draw(SEPARATORS)]
    return "".join(out)


FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.one_of(soups(), st.text(max_size=30)))
def test_garbage_gives_a_filter_or_a_filter_error(text: str) -> None:
    try:
        f = selector(text)
    except FilterSyntaxError as err:
        lines = text.split("\n")
        assert 1 <= err.line <= len(lines), (text, str(err))
        assert 1 <= err.column <= len(lines[err.line - 1]) + 1, (text, str(err))
        assert f"at line {err.line}, column {err.column}" in str(err)
        return
    except FilterError as err:
        assert str(err)
        return
    assert isinstance(f, Filter)
    assert parse(f.to_text()) == f
