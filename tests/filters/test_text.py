"""to_text(): the canonical form printed back, and read back to the same filter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError
from flowbus.filters import parse
from flowbus.filters.ast import (
    BinOp,
    Call,
    Conjunction,
    Const,
    ExprPredicate,
    Field,
    Filter,
    Literal,
    Op,
    Predicate,
)
from flowbus.filters.text import expr_to_text, is_name, literal_to_text, to_text, value_to_text
from strategies import canonical_filters, filters, trees


def all_of(*lits: Literal) -> Filter:
    return Filter((Conjunction(lits),))


a, b, c = Field("a"), Field("b"), Field("c")

TEXTS: list[tuple[Filter, str]] = [
    (Filter.true(), "true"),
    (Filter.false(), "false"),
    (all_of(Predicate("x", Op.EQ, 1)), "x = 1"),
    (all_of(Predicate("x", Op.LT, 5, negated=True)), "!(x < 5)"),
    (all_of(Predicate("x", Op.EXISTS)), "exists x"),
    (all_of(Predicate("x", Op.EXISTS, negated=True)), "not exists x"),
    (all_of(Predicate("x", Op.IN, (2, "a", 1, True))), 'x in {true, 1, 2, "a"}'),
    (all_of(Predicate("x", Op.NOT_IN, ())), "x not in {}"),
    (all_of(Predicate("x", Op.IN, (1,), negated=True)), "!(x in {1})"),
    (all_of(Predicate("s", Op.PREFIX, "IB")), 's prefix "IB"'),
    (all_of(Predicate("s", Op.EQ, 'q"\\\n\t\r\x01\x7fé\ud800😀')), r's = "q\"\\\n\t\r\u0001\u007fé\ud800😀"'),
    (all_of(Predicate("x", Op.EQ, 1e16)), "x = 1e+16"),
    (all_of(Predicate("x", Op.EQ, -2.5e-05)), "x = -2.5e-05"),
    (all_of(Predicate("x", Op.EQ, 0.1)), "x = 0.1"),
    (all_of(Predicate("x", Op.GT, -3)), "x > -3"),
    (all_of(Predicate("x", Op.EQ, 2.0)), "x = 2.0"),
    (all_of(Predicate("x", Op.EQ, False)), "x = false"),
    (all_of(Predicate("b", Op.EQ, 1), Predicate("a", Op.EQ, 2)), "a = 2 & b = 1"),
    (
        Filter(
            (
                Conjunction((Predicate("a", Op.EQ, 1), Predicate("b", Op.EQ, 2))),
                Conjunction((Predicate("c", Op.EQ, 3),)),
            )
        ),
        "(a = 1 & b = 2) | c = 3",
    ),
    (
        all_of(ExprPredicate(BinOp("*", Field("price"), Field("vol")), Op.GE, Const(1000000))),
        "price * vol >= 1000000",
    ),
    (all_of(ExprPredicate(Call("NYS", (Field("issue"),)), Op.EQ, Const("IBM"))), 'NYS(issue) = "IBM"'),
    (all_of(ExprPredicate(a, Op.LT, b, negated=True)), "!(a < b)"),
    (all_of(ExprPredicate(Const("IB"), Op.PREFIX, a)), '"IB" prefix a'),
]


@pytest.mark.parametrize(("f", "text"), TEXTS, ids=[t for _, t in TEXTS])
def test_to_text_cases(f: Filter, text: str) -> None:
    assert to_text(f) == text
    assert str(f) == text
    assert parse(text) == f


EXPRESSIONS = [
    (BinOp("-", a, BinOp("-", b, c)), "a - (b - c)"),
    (BinOp("-", BinOp("-", a, b), c), "a - b - c"),
    (BinOp("*", BinOp("+", a, b), c), "(a + b) * c"),
    (BinOp("+", a, BinOp("*", b, c)), "a + b * c"),
    (BinOp("/", a, BinOp("*", b, c)), "a / (b * c)"),
    (BinOp("*", a, BinOp("/", b, c)), "a * (b / c)"),
    (BinOp("+", a, BinOp("+", b, c)), "a + (b + c)"),
    (BinOp("-", a, Const(-3)), "a - -3"),
    (BinOp("*", Const(-0.5), a), "-0.5 * a"),
    (BinOp("-", Const(0), a), "0 - a"),
    (Call("f", ()), "f()"),
    (Call("f", (BinOp("+", a, Const(1)), Const("x"))), 'f(a + 1, "x")'),
]


@pytest.mark.parametrize(("e", "text"), EXPRESSIONS, ids=[t for _, t in EXPRESSIONS])
def test_expression_parenthesisation(e: object, text: str) -> None:
    assert expr_to_text(e) == text  # type: ignore[arg-type]
    lit = ExprPredicate(e, Op.GT, Field("z"))  # type: ignore[arg-type]
    assert literal_to_text(lit) == f"{text} > z"
    assert parse(f"{text} > z") == all_of(lit)


def test_names_and_values() -> None:
    assert is_name("trade.price") and is_name("_x") and is_name("android")
    assert not is_name("in") and not is_name("AND") and not is_name("1x") and not is_name("a b")
    assert value_to_text(True) == "true"
    with pytest.raises(FilterError):
        value_to_text([1])


def test_non_canonical_input_prints_and_reads_back_canonical() -> None:
    f = all_of(ExprPredicate(Field("x"), Op.LT, Const(5)))
    assert to_text(f) == "x < 5"
    assert parse(to_text(f)) == all_of(Predicate("x", Op.LT, 5))


@settings(max_examples=300, deadline=None)
@given(canonical_filters())
def test_round_trip_of_built_filters(f: Filter) -> None:
    assert parse(to_text(f)) == f


@settings(max_examples=200, deadline=None)
@given(filters())
def test_round_trip_of_parsed_filters(f: Filter) -> None:
    text = to_text(f)
    assert parse(text) == f
    assert to_text(parse(text)) == text


@settings(max_examples=150, deadline=None)
@given(trees())
def test_printing_is_idempotent_on_source_text(tree: object) -> None:
    f = parse(tree.text)  # type: ignore[attr-defined]
    assert to_text(parse(to_text(f))) == to_text(f)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(st.characters(codec=None, exclude_categories=())),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
    )
)
def test_constants_round_trip_exactly(v: object) -> None:
    f = all_of(Predicate("x", Op.EQ, v))  # type: ignore[arg-type]
    back = parse(to_text(f)).disjuncts[0].literals[0]
    assert isinstance(back, Predicate)
    assert type(back.value) is type(v) and back.value == v
