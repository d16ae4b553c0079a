"""parse_expression, substitution into filters, and the compiled evaluators against the plain one."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError, FilterSyntaxError, Undefined
from flowbus.filters import parse
from flowbus.filters.ast import BinOp, Call, Const, Expr, Field, Filter
from flowbus.filters.compile import Compiler, expressions_of, shared_subexpressions
from flowbus.filters.expr import parse_expression
from flowbus.filters.substitute import substitute_expr, substitute_filter
from flowbus.filters.text import expr_to_text
from strategies import FUNCTIONS, canonical_filters, events, expressions

# ------------------------------------------------------------ parse_expression

EXPRESSIONS = [
    ("price*vol", BinOp("*", Field("price"), Field("vol"))),
    ("NYS(issue)", Call("NYS", (Field("issue"),))),
    ("max(maxP, price)", Call("max", (Field("maxP"), Field("price")))),
    ("p", Field("p")),
    ("42", Const(42)),
    ("-2.5", Const(-2.5)),
    ('"IBM"', Const("IBM")),
    ("true", Const(True)),
    ("2 * 3 + 1", Const(7)),
    ("(a + b) * c", BinOp("*", BinOp("+", Field("a"), Field("b")), Field("c"))),
    ("-x", BinOp("-", Const(0), Field("x"))),
    ("state.maxP", Field("state.maxP")),
]


@pytest.mark.parametrize(("text", "expected"), EXPRESSIONS)
def test_parse_expression(text: str, expected: Expr) -> None:
    assert parse_expression(text) == expected


@pytest.mark.parametrize(
    "text", ["a > 1", "a & b", "not a", "a in {1}", "a = b", "x prefix y", "a +", "(a", "f("]
)
def test_a_condition_or_a_fragment_is_not_an_expression(text: str) -> None:
    with pytest.raises(FilterSyntaxError, match="not an expression"):
        parse_expression(text)


def test_syntax_errors_point_into_the_text() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse_expression("a) + (b")
    assert (info.value.line, info.value.column) == (1, 2)
    with pytest.raises(FilterSyntaxError, match="empty"):
        parse_expression("  ")
    with pytest.raises(FilterError, match="division by zero"):
        parse_expression("1 / 0")


@settings(max_examples=150, deadline=None, derandomize=True)
@given(expressions())
def test_expression_text_reads_back(e: Expr) -> None:
    assert parse_expression(expr_to_text(e)) == e


# ----------------------------------------------------------------- substitution

TARGETS = ("p", "q", "r")


def _targets() -> st.SearchStrategy[Expr]:
    return st.one_of(
        st.sampled_from(TARGETS).map(Field),
        st.sampled_from([0, 1, 2.0, "a", "IBM", True]).map(Const),
        expressions(attrs=TARGETS),
    )


@settings(max_examples=400, deadline=None, derandomize=True)
@given(canonical_filters(), st.dictionaries(st.sampled_from("abcde"), _targets()), events(attrs=TARGETS))
def test_substituted_filter_matches_as_the_filter_on_the_transformed_event(
    f: Filter, mapping: dict[str, Expr], event: dict[str, Any]
) -> None:
    try:
        g = substitute_filter(f, mapping)
    except FilterError:
        return  # too complex after substitution
    assert g.matches(event, functions=FUNCTIONS) == f.matches(_after(mapping, event), functions=FUNCTIONS)
    assert parse(g.to_text()) == g


def _after(mapping: dict[str, Expr], source: dict[str, Any]) -> dict[str, Any]:
    """The event ``f`` sees: mapped attributes computed (absent when undefined), the others as they were."""
    out = {k: v for k, v in source.items() if k not in mapping}
    for name, e in mapping.items():
        with contextlib.suppress(Undefined):
            out[name] = e.evaluate(source, FUNCTIONS)
    return out


def test_substitution_examples() -> None:
    m = {"y": parse_expression("x * 2"), "z": Field("w"), "k": Const(3)}
    assert substitute_filter(parse("y > 4 & z = 1 & k = 3"), m) == parse("x * 2 > 4 & w = 1")
    assert substitute_filter(parse("y in {2, 4}"), m) == parse("x * 2 = 2 | x * 2 = 4")
    assert substitute_filter(parse("y not in {2, 4}"), m) == parse("x * 2 != 2 & x * 2 != 4")
    assert substitute_filter(parse("exists y"), m) == parse("x * 2 = x * 2 | x * 2 != x * 2")
    assert substitute_filter(parse("k < 1"), m) == Filter.false()
    assert substitute_expr(parse_expression("y + k"), m) == parse_expression("x * 2 + 3")
    assert substitute_expr(parse_expression("k * k"), m) == Const(9)


# -------------------------------------------------------------------- compiled


@settings(max_examples=400, deadline=None, derandomize=True)
@given(canonical_filters(), events())
def test_compiled_filter_agrees_with_the_plain_evaluator(f: Filter, event: dict[str, Any]) -> None:
    c = Compiler(FUNCTIONS, shared_subexpressions(expressions_of(f)))
    assert c.filter(f)(event, c.new_memo()) == f.matches(event, functions=FUNCTIONS)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(expressions(), min_size=1, max_size=4), events())
def test_compiled_expressions_agree_and_share(exprs: list[Expr], event: dict[str, Any]) -> None:
    twice = exprs + exprs  # every node shared: memoised
    c = Compiler(FUNCTIONS, shared_subexpressions(twice))
    memo = c.new_memo()
    for e in twice:
        try:
            expected = e.evaluate(event, FUNCTIONS)
        except Undefined:
            with pytest.raises(Undefined):
                c.expr(e)(event, memo)
            continue
        got = c.expr(e)(event, memo)
        assert got == expected or (math.isnan(got) and math.isnan(expected))


def test_a_shared_subexpression_is_computed_once() -> None:
    calls = []

    def f(x: Any) -> Any:
        calls.append(x)
        return x * 2

    e = parse_expression("f(a) + 1")
    c = Compiler({"f": f}, shared_subexpressions([e, Call("f", (Field("a"),))]))
    memo = c.new_memo()
    assert c.expr(e)({"a": 3}, memo) == 7
    assert c.expr(Call("f", (Field("a"),)))({"a": 3}, memo) == 6
    assert calls == [3]


EDGE_FILTERS = [
    "x = 1", "x = 1.0", "x != 1", "x < 2", "x >= 1", 'x = "a"', 'x prefix "a"', "x in {1, true}",
    "x not in {}", "exists x", "!(x < 2)", "x * 2 = 2", "x * 2 >= 2", "x + y > 1", "half(x) = 0.5",
    'code(x) = 1', "x / 0 = 1", "!(x * 2 = 2)", "x = y", "x < y", "x contains y", "x = true", "!(x = 1)",
]  # fmt: skip
EDGE_EVENTS: list[dict[str, Any]] = [
    {}, {"x": 1}, {"x": 1.0}, {"x": True}, {"x": False}, {"x": 0}, {"x": "a"}, {"x": math.nan},
    {"x": math.inf}, {"x": 2**60}, {"x": "ab", "y": "b"}, {"x": 1, "y": 1.0}, {"x": 1, "y": True}, {"y": 2},
]  # fmt: skip


def _resolving(name: str) -> Any:
    """A field reader of the kind collapse rules use (undefined when absent)."""

    def read(env: Any, memo: Any) -> Any:
        try:
            return env[name]
        except KeyError:
            raise Undefined(name) from None

    return read


@pytest.mark.parametrize("text", EDGE_FILTERS)
def test_compiled_filters_on_edge_values(text: str) -> None:
    f = parse(text)
    plain, resolved = Compiler(FUNCTIONS), Compiler(FUNCTIONS, fields=_resolving)
    for event in EDGE_EVENTS:
        expected = f.matches(event, functions=FUNCTIONS)
        assert plain.filter(f)(event, []) == expected, event
        assert resolved.filter(f)(event, []) == expected, event


def test_substitution_keeps_the_meaning_of_absent_values() -> None:
    m = {"y": parse_expression("x * 2")}
    for text in ("y not in {}", "exists y", "!(y not in {})", "not exists y", "y in {}", "!(y in {2})"):
        f, g = parse(text), substitute_filter(parse(text), m)
        for event in ({}, {"x": 1}, {"x": "a"}, {"x": math.nan}):
            assert g.matches(event) == f.matches(_after(m, event)), (text, event)
