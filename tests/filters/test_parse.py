"""parse(): the text and triple forms to the canonical form, and its errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError, FilterSyntaxError
from flowbus.filters import parse
from flowbus.filters.ast import (
    MAX_CONJUNCTIONS,
    BinOp,
    Call,
    Conjunction,
    Const,
    ExprPredicate,
    Field,
    Filter,
    Functions,
    Literal,
    Op,
    Predicate,
)
from flowbus.filters.parser import _lark
from strategies import FUNCTIONS, events, reference_matches, trees


def P(attr: str, op: str, value: Any = None, neg: bool = False) -> Predicate:
    return Predicate(attr, Op(op), value, neg)


def E(left: Any, op: str, right: Any, neg: bool = False) -> ExprPredicate:
    return ExprPredicate(left, Op(op), right, neg)


def all_of(*lits: Literal) -> Filter:
    return Filter((Conjunction(lits),))


def any_of(*conjs: tuple[Literal, ...]) -> Filter:
    return Filter(tuple(Conjunction(c) for c in conjs))


a, b, c = Field("a"), Field("b"), Field("c")

CASES: list[tuple[str, Filter]] = [
    # every operator
    ("x = 1", all_of(P("x", "=", 1))),
    ("x != 1", all_of(P("x", "!=", 1))),
    ("x < 1", all_of(P("x", "<", 1))),
    ("x <= 1.5", all_of(P("x", "<=", 1.5))),
    ("x > -3", all_of(P("x", ">", -3))),
    ("x >= 1e6", all_of(P("x", ">=", 1e6))),
    ('name prefix "IB"', all_of(P("name", "prefix", "IB"))),
    ('name SUFFIX "M"', all_of(P("name", "suffix", "M"))),
    ('name contains "B"', all_of(P("name", "contains", "B"))),
    ('x in {1, 2, "x", true}', all_of(P("x", "in", (1, 2, "x", True)))),
    ("x not in {3, 1}", all_of(P("x", "not in", (1, 3)))),
    ("x in {}", all_of(P("x", "in", ()))),
    ("x in {1, 1, 1.0,}", all_of(P("x", "in", (1,)))),
    ("exists x", all_of(P("x", "exists"))),
    ("not exists x", all_of(P("x", "exists", None, True))),
    ("x = true", all_of(P("x", "=", True))),
    ("x = FALSE", all_of(P("x", "=", False))),
    ("trade.price >= 10", all_of(P("trade.price", ">=", 10))),
    ("_x1 = 1", all_of(P("_x1", "=", 1))),
    ("android = 1", all_of(P("android", "=", 1))),
    # numbers
    ("x = -2.5E-3", all_of(P("x", "=", -0.0025))),
    ("x = .5", all_of(P("x", "=", 0.5))),
    ("x = 1e+16", all_of(P("x", "=", 1e16))),
    ("x = 9007199254740993", all_of(P("x", "=", 2**53 + 1))),
    # flipped constants and folding
    ("5 < x", all_of(P("x", ">", 5))),
    ("5 >= x", all_of(P("x", "<=", 5))),
    ('"a" = x', all_of(P("x", "=", "a"))),
    ("x > 2*3", all_of(P("x", ">", 6))),
    ("x > 2 + 3 * 4", all_of(P("x", ">", 14))),
    ("x > (2 + 3) * 4", all_of(P("x", ">", 20))),
    ("x > 7 / 2", all_of(P("x", ">", 3.5))),
    ("x > 8 - 2 - 1", all_of(P("x", ">", 5))),
    ("x > -(2 - 5)", all_of(P("x", ">", 3))),
    ("1 < 2", Filter.true()),
    ("1 > 2", Filter.false()),
    ('"ab" prefix "a"', Filter.true()),
    ("1 = true", Filter.false()),
    ("1 != true", Filter.true()),
    ("2 in {1, 2}", Filter.true()),
    # expressions
    ("price*vol >= 1000000", all_of(E(BinOp("*", Field("price"), Field("vol")), ">=", Const(1000000)))),
    ('NYS(issue) = "IBM"', all_of(E(Call("NYS", (Field("issue"),)), "=", Const("IBM")))),
    ("f(a, 2) < g(b)", all_of(E(Call("f", (a, Const(2))), "<", Call("g", (b,))))),
    ("f() = 1", all_of(E(Call("f", ()), "=", Const(1)))),
    ("a = b", all_of(E(a, "=", b))),
    ("10 < a + b", all_of(E(BinOp("+", a, b), ">", Const(10)))),
    ("a - b - c > 0", all_of(E(BinOp("-", BinOp("-", a, b), c), ">", Const(0)))),
    ("a - (b - c) > 0", all_of(E(BinOp("-", a, BinOp("-", b, c)), ">", Const(0)))),
    ("a + b * c > 0", all_of(E(BinOp("+", a, BinOp("*", b, c)), ">", Const(0)))),
    ("-a < 1", all_of(E(BinOp("-", Const(0), a), "<", Const(1)))),
    ("a + 2 * 3 > 0", all_of(E(BinOp("+", a, Const(6)), ">", Const(0)))),
    ('"IB" prefix name', all_of(E(Const("IB"), "prefix", Field("name")))),
    ('a + b prefix "x"', all_of(E(BinOp("+", a, b), "prefix", Const("x")))),
    ("a + b in {1, 2}", any_of((E(BinOp("+", a, b), "=", Const(1)),), (E(BinOp("+", a, b), "=", Const(2)),))),
    ("a + b not in {1, 2}", all_of(E(BinOp("+", a, b), "!=", Const(1)), E(BinOp("+", a, b), "!=", Const(2)))),
    ("a * b in {}", Filter.false()),
    # between
    ("x between 1 and 5", all_of(P("x", ">=", 1), P("x", "<=", 5))),
    ("x BETWEEN 1 AND 5 and y = 2", all_of(P("x", ">=", 1), P("x", "<=", 5), P("y", "=", 2))),
    ("!(x between 1 and 5)", any_of((P("x", ">=", 1, True),), (P("x", "<=", 5, True),))),
    (
        "a + b between 1 and 2",
        all_of(E(BinOp("+", a, b), ">=", Const(1)), E(BinOp("+", a, b), "<=", Const(2))),
    ),
    # boolean structure and precedence
    ("x = 1 & y = 2", all_of(P("x", "=", 1), P("y", "=", 2))),
    ("x = 1 and y = 2 AND z = 3", all_of(P("x", "=", 1), P("y", "=", 2), P("z", "=", 3))),
    ("x = 1 | y = 2", any_of((P("x", "=", 1),), (P("y", "=", 2),))),
    ("x = 1 or y = 2 & z = 3", any_of((P("x", "=", 1),), (P("y", "=", 2), P("z", "=", 3)))),
    ("(x = 1 or y = 2) & z = 3", any_of((P("x", "=", 1), P("z", "=", 3)), (P("y", "=", 2), P("z", "=", 3)))),
    ("!x = 1 & y = 2", all_of(P("x", "=", 1, True), P("y", "=", 2))),
    ("not x = 1 | y = 2", any_of((P("x", "=", 1, True),), (P("y", "=", 2),))),
    ("!(x = 1 & y = 2)", any_of((P("x", "=", 1, True),), (P("y", "=", 2, True),))),
    ("!(x = 1 | y = 2)", all_of(P("x", "=", 1, True), P("y", "=", 2, True))),
    ("!!x = 1", all_of(P("x", "=", 1))),
    ("!!!x = 1", all_of(P("x", "=", 1, True))),
    ("!(x < 5)", all_of(P("x", "<", 5, True))),
    ("!(a * b > 1)", all_of(E(BinOp("*", a, b), ">", Const(1), True))),
    ("!not exists x", all_of(P("x", "exists"))),
    (
        "(a = 1 | b = 2) & (c = 3 | d = 4)",
        any_of(
            (P("a", "=", 1), P("c", "=", 3)),
            (P("a", "=", 1), P("d", "=", 4)),
            (P("b", "=", 2), P("c", "=", 3)),
            (P("b", "=", 2), P("d", "=", 4)),
        ),
    ),
    # true / false as sub-filters, contradictions, duplicates
    ("true", Filter.true()),
    ("FALSE", Filter.false()),
    ("!true", Filter.false()),
    ("x = 1 & true", all_of(P("x", "=", 1))),
    ("x = 1 | true", Filter.true()),
    ("x = 1 & false", Filter.false()),
    ("x = 1 | false", all_of(P("x", "=", 1))),
    ("x = 1 & !(x = 1)", Filter.false()),
    ("x = 1 | x = 1", all_of(P("x", "=", 1))),
    ("(x = 1 | y = 2) & !(x = 1)", all_of(P("x", "=", 1, True), P("y", "=", 2))),
    ("(true)", Filter.true()),
    # strings, unicode and escapes
    ('s = "é日本"', all_of(P("s", "=", "é日本"))),
    ('s = "😀"', all_of(P("s", "=", "😀"))),
    (r's = "a\"b\\c\nd\te\r"', all_of(P("s", "=", 'a"b\\c\nd\te\r'))),
    (r's = "\u00e9\u0000\/"', all_of(P("s", "=", "é\x00/"))),
    (r's = "\ud800"', all_of(P("s", "=", "\ud800"))),
    ('s = ""', all_of(P("s", "=", ""))),
    # whitespace and newlines
    ("  x\n=\t1\n  &\r\n y = 2  ", all_of(P("x", "=", 1), P("y", "=", 2))),
    ("x=1&y=2|z=3", any_of((P("x", "=", 1), P("y", "=", 2)), (P("z", "=", 3),))),
    ("x!=1", all_of(P("x", "!=", 1))),
    ("a=-1", all_of(P("a", "=", -1))),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[t for t, _ in CASES])
def test_parse_cases(text: str, expected: Filter) -> None:
    assert parse(text) == expected


EQUIVALENT = [
    ("a = 1 & b = 2", "b = 2 and a = 1"),
    ("a = 1 & b = 2", "(b = 2) & ((a = 1))"),
    ("x between 1 and 5", "x >= 1 & x <= 5"),
    ("x between 1 and 5", "1 <= x & 5 >= x"),
    ("!(a = 1 | b = 2)", "not a = 1 and not b = 2"),
    ("a = 1 | b = 2 & c = 3", "(c = 3 & b = 2) | a = 1"),
    ("(a = 1 | b = 2) & c = 3", "a = 1 & c = 3 | b = 2 & c = 3"),
    ("x > 2*3", "6 < x"),
    ("exists x", "EXISTS x"),
    ("x in {1, 2}", "x in {2, 1, 2}"),
    ("a * b > 3", "3 < a * b"),
]


@pytest.mark.parametrize(("one", "other"), EQUIVALENT)
def test_equivalent_texts_have_one_canonical_form(one: str, other: str) -> None:
    assert parse(one) == parse(other)


# ------------------------------------------------------------------- triples

TRIPLES: list[tuple[Any, Filter]] = [
    (
        [["class", "=", "trigger"], ["price", ">", 50]],
        all_of(P("class", "=", "trigger"), P("price", ">", 50)),
    ),
    ('[["class","=","trigger"],["price",">",50]]', all_of(P("class", "=", "trigger"), P("price", ">", 50))),
    ('  \n [["x", "in", [1, "a", true]]]', all_of(P("x", "in", (1, "a", True)))),
    ([("x", "not in", (1, 2))], all_of(P("x", "not in", (1, 2)))),
    ([["x", "NOT  IN", [1]]], all_of(P("x", "not in", (1,)))),
    ([["x", "between", [1, 5]]], all_of(P("x", ">=", 1), P("x", "<=", 5))),
    ([["x", "exists"]], all_of(P("x", "exists"))),
    ([["x", "exists", None]], all_of(P("x", "exists"))),
    ('[["x", "not exists", null]]', all_of(P("x", "exists", None, True))),
    ([["x", "exists"], ["x", "not exists"]], Filter.false()),
    (
        [["s", "prefix", "IB"], ["s", "suffix", "M"], ["s", "contains", "B"]],
        all_of(P("s", "prefix", "IB"), P("s", "suffix", "M"), P("s", "contains", "B")),
    ),
    (
        [["x", "!=", 1], ["x", "<=", 2.5], ["x", "<", 3], ["x", ">=", 0]],
        all_of(P("x", "!=", 1), P("x", "<=", 2.5), P("x", "<", 3), P("x", ">=", 0)),
    ),
    ([], Filter.true()),
    ("[]", Filter.true()),
    ((), Filter.true()),
]


@pytest.mark.parametrize(("source", "expected"), TRIPLES)
def test_triples(source: Any, expected: Filter) -> None:
    assert parse(source) == expected


BAD_TRIPLES: list[tuple[Any, str]] = [
    ([["x", "="]], "triple 0"),
    ([["x", "=", 1], ["y", "~", 2]], "triple 1"),
    ([["x", "=", 1, 2]], "triple 0"),
    (["x = 1"], "triple 0"),
    ([[1, "=", 1]], "not a name"),
    ([["in", "=", 1]], "not a name"),
    ([["a b", "=", 1]], "not a name"),
    ([["x", 5, 1]], "operator"),
    ([["x", "in", 1]], "list"),
    ([["x", "between", [1]]], "between"),
    ([["x", "exists", 1]], "exists"),
    ([["x", "<", True]], "triple 0"),
    ([["x", "prefix", 5]], "triple 0"),
    ([["x", "=", None]], "triple 0"),
    ([["x", "=", [1]]], "triple 0"),
    ([["x", "in", [[1]]]], "triple 0"),
    ([["x", "in", [{"a": 1}]]], "triple 0"),
    ([["x", "=", math.nan]], "triple 0"),
    ('[["x", "=", NaN]]', "triple 0"),
    ('[["x", "=", 1e999]]', "triple 0"),
    ('{"x": 1}', "unexpected"),
    ('[["x", "=", 1]', "JSON"),
    ('["x"]', "triple 0"),
    ('[{"x": 1}]', "triple 0"),
]


@pytest.mark.parametrize(("source", "fragment"), BAD_TRIPLES)
def test_bad_triples(source: Any, fragment: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse(source)
    assert fragment in str(info.value)


def test_bad_json_has_a_position() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse('[["x", "=", 1],\n ["y" "=", 2]]')
    assert (info.value.line, info.value.column) == (2, 7)


def test_filter_passes_through_and_other_types_are_refused() -> None:
    f = parse("x = 1")
    assert parse(f) is f
    for bad in (5, None, {"x": 1}, b"x = 1"):
        with pytest.raises(FilterError):
            parse(bad)  # type: ignore[arg-type]


# -------------------------------------------------------------------- errors

SYNTAX_ERRORS: list[tuple[str, int, int, str]] = [
    ("", 1, 1, "an attribute or constant"),
    ("x >", 1, 4, "an attribute or constant"),
    ("x = 1 &\n  y = (2", 2, 9, '")"'),
    ("x = 1\n  y = 2", 2, 3, '"&"/"and"'),
    ('x = 1 &\n\n   y = "abc', 3, 8, "unterminated string"),
    ("x = 1 )", 1, 7, "end of input"),
    ("x = @", 1, 5, "an attribute or constant"),
    ("and = 1", 1, 1, "an attribute or constant"),
    ("x = 1 & \n in = 2", 2, 2, "an attribute or constant"),
    ("x in {1, 2", 1, 11, '"}"'),
    ("x in 1", 1, 6, '"{"'),
    ("x = 'a'", 1, 5, "an attribute or constant"),
    (r'x = "\q"', 1, 5, "bad escape"),
    ("x == 1", 1, 4, "an attribute or constant"),
    ("exists 1", 1, 8, "an attribute"),
    ("f(x > 1) = 2", 1, 5, '")"'),
    ("x = 1 y", 1, 7, "end of input"),
]


@pytest.mark.parametrize(("text", "line", "column", "wanted"), SYNTAX_ERRORS)
def test_syntax_errors_have_position_and_readable_expectations(
    text: str, line: int, column: int, wanted: str
) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert err.text == text
    assert wanted in str(err)
    assert all(not name.isupper() for name in err.expected), err.expected  # no raw lark terminal names


MISPLACED: list[tuple[str, int, int, str]] = [
    ("a & b = 1", 1, 1, "`a` is a value"),
    ("x = 1 |\n  a + b", 2, 3, "`a + b` is a value"),
    ("(a + b)", 1, 1, "is a value"),
    ("(a > 1) + 2 > 3", 1, 9, "condition"),
    ("(a > 1) = true", 1, 9, "condition"),
    ("x in {a}", 1, 7, "constants"),
    ("x in {1, (y > 1)}", 1, 6, "condition"),
    ("1", 1, 1, "is a value"),
]


@pytest.mark.parametrize(("text", "line", "column", "wanted"), MISPLACED)
def test_values_and_conditions_in_the_wrong_place(text: str, line: int, column: int, wanted: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse(text)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)
    assert wanted in str(info.value)


SEMANTIC_ERRORS = [
    "x < true",
    "x >= false",
    "name prefix 5",
    "5 contains name",
    "a + b < true",
    "1 / 0 > x",
    "x > 1 / (2 - 2)",
    "x = 1e999",
    "x = -true",
    'x = 1 + "a"',
    "a * b not in {}",
    "x = " + "9" * 5000,
]


@pytest.mark.parametrize("text", SEMANTIC_ERRORS)
def test_semantic_errors_are_filter_errors(text: str) -> None:
    with pytest.raises(FilterError) as info:
        parse(text)
    assert not isinstance(info.value, FilterSyntaxError)


def test_too_complex_is_refused() -> None:
    clause = " & ".join(f"(a{i} = 1 | b{i} = 2)" for i in range(9))  # 512 conjunctions
    with pytest.raises(FilterError, match="too complex"):
        parse(clause)
    assert len(parse(" & ".join(f"(a{i} = 1 | b{i} = 2)" for i in range(8))).disjuncts) == MAX_CONJUNCTIONS


def test_contradictions_are_pruned_while_distributing() -> None:
    # 2**9 conjunctions before pruning, one after: the limit applies to what is kept.
    text = "!(x = 1) & " + " & ".join(f"(x = 1 | a{i} = 1)" for i in range(9))
    assert parse(text) == all_of(P("x", "=", 1, True), *(P(f"a{i}", "=", 1) for i in range(9)))


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(FilterError):
        parse("!" * 5000 + "x = 1")
    with pytest.raises(FilterError):
        parse("a" + " + a" * 3000 + " > 1")
    assert parse("(" * 200 + "x = 1" + ")" * 200) == all_of(P("x", "=", 1))


def test_parser_object_is_built_once() -> None:
    assert _lark() is _lark()


# ----------------------------------------------------------------- semantics

EVENTS: list[dict[str, Any]] = [
    {},
    {"price": 120, "vol": 10000, "issue": "IBM"},
    {"price": 99.5, "vol": 20000.0, "issue": "IBMX"},
    {"price": "high", "vol": True, "issue": 7},
    {"price": 100, "issue": "MSFT"},
    {"price": math.nan, "vol": 0, "issue": ""},
    {"price": math.inf, "vol": -1, "issue": "ibm"},
    {"price": 1.0, "vol": 1, "issue": "I"},
]


def _num(v: Any) -> bool:
    return type(v) in (int, float)


SEMANTICS: list[tuple[str, Any]] = [
    ("price > 100", lambda e: _num(e.get("price")) and e["price"] > 100),
    ("!(price > 100)", lambda e: not (_num(e.get("price")) and e["price"] > 100)),
    ("price != 100", lambda e: "price" in e and not (_num(e["price"]) and e["price"] == 100)),
    ("price = 1", lambda e: _num(e.get("price")) and e["price"] == 1),
    (
        "price*vol >= 1000000",
        lambda e: _num(e.get("price")) and _num(e.get("vol")) and e["price"] * e["vol"] >= 1e6,
    ),
    ('issue prefix "IB"', lambda e: type(e.get("issue")) is str and e["issue"].startswith("IB")),
    ('!(issue prefix "IB")', lambda e: not (type(e.get("issue")) is str and e["issue"].startswith("IB"))),
    ('issue in {"IBM", "MSFT", 7}', lambda e: e.get("issue", None) in ("IBM", "MSFT", 7)),
    ('issue not in {"IBM", 7}', lambda e: "issue" in e and e["issue"] not in ("IBM", 7)),
    ("not exists vol", lambda e: "vol" not in e),
    ("vol = true", lambda e: e.get("vol") is True),
    ("vol = 1", lambda e: _num(e.get("vol")) and e["vol"] == 1),
    ("price between 99 and 120", lambda e: _num(e.get("price")) and 99 <= e["price"] <= 120),
    ("!(price between 99 and 120)", lambda e: not (_num(e.get("price")) and 99 <= e["price"] <= 120)),
    (
        'price > 100 | issue = "MSFT" & !exists vol',
        lambda e: (
            (_num(e.get("price")) and e["price"] > 100) or (e.get("issue") == "MSFT" and "vol" not in e)
        ),
    ),
    (
        "vol / (price - 100) > 0",
        lambda e: (
            _num(e.get("vol"))
            and _num(e.get("price"))
            and e["price"] != 100
            and e["vol"] / (e["price"] - 100) > 0
        ),
    ),
    ("-vol < -5", lambda e: _num(e.get("vol")) and -e["vol"] < -5),
    ('issue < "J"', lambda e: type(e.get("issue")) is str and e["issue"] < "J"),
]


@pytest.mark.parametrize(("text", "direct"), SEMANTICS, ids=[t for t, _ in SEMANTICS])
def test_parsed_filters_mean_what_they_say(text: str, direct: Any) -> None:
    f = parse(text)
    for event in EVENTS:
        assert f.matches(event) == bool(direct(event)), event


def test_functions_and_lookup_tables() -> None:
    f = parse('NYS(issue) = "IBM" & twice(price) > 100')
    fns: Functions = {"NYS": {"IBM.N": "IBM"}, "twice": lambda x: 2 * x}
    assert f.matches({"issue": "IBM.N", "price": 60}, functions=fns)
    assert not f.matches({"issue": "IBM.N", "price": 40}, functions=fns)
    assert not f.matches({"issue": "MSFT.N", "price": 60}, functions=fns)


@settings(max_examples=250, deadline=None)
@given(tree=trees(), evs=st.lists(events(), min_size=1, max_size=12))
def test_canonical_form_matches_exactly_when_the_source_tree_does(
    tree: Any, evs: list[dict[str, Any]]
) -> None:
    f = parse(tree.text)
    for e in evs:
        assert f.matches(e, functions=FUNCTIONS) == reference_matches(tree, e), (tree.text, str(f), e)


@settings(max_examples=250, deadline=None)
@given(tree=trees())
def test_canonical_form_is_a_normal_form(tree: Any) -> None:
    f = parse(tree.text)
    for conj in f.disjuncts:
        assert not conj.is_contradiction()
        for lit in conj.literals:
            if isinstance(lit, ExprPredicate):
                assert not (isinstance(lit.left, Field) and isinstance(lit.right, Const))
                assert not isinstance(lit.left, Const) or lit.op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS)
    assert len(set(f.disjuncts)) == len(f.disjuncts)


GRAMMAR_CHARS = st.sampled_from(
    [
        *'ab xy=!<>&|()"{},.-+*/\\\n019eE',
        "in",
        "not",
        "exists",
        "between",
        "and",
        "true",
        "prefix",
        "1.5",
        '"s"',
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(GRAMMAR_CHARS, max_size=20).map("".join))
def test_any_text_gives_a_filter_or_a_filter_error(text: str) -> None:
    try:
        f = parse(text)
    except FilterSyntaxError as err:
        assert err.line >= 1 and err.column >= 1
    except FilterError:
        pass
    else:
        assert isinstance(f, Filter)
