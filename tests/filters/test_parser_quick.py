"""The parser's fast path (``_Quick``): a conjunction of tests of fields against constants is
read without the LALR parser, and gives exactly the filter the parser gives; any other text
is left to the parser (None), which then reads it or says what is wrong."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError
from flowbus.filters import Filter, parse
from flowbus.filters.parser import Node, _cond, _lark, _quick, _to_filter

SETTINGS = settings(
    max_examples=400, deadline=timedelta(milliseconds=500), suppress_health_check=[HealthCheck.too_slow]
)


def _slow(text: str) -> Filter:
    """What the LALR parser reads ``text`` as."""
    return _to_filter(_cond(cast(Node, _lark().parse(text))))


_lark()  # (built once, before any deadline applies)

names = st.sampled_from(["x", "price", "a.b_c9", "Sym", "_q"])
blank = st.sampled_from(["", " ", "  ", "\n", "\t "])
numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: repr(abs(v)) if v >= 0 else f"-{abs(v)!r}"),
    st.sampled_from([".5", "1.", "2e3", "1.e-3", "7E2", "- 4"]),
)
strings = st.sampled_from(['"IBM"', '""', r'"a\"b"', r'"\\n\u00e9"', '"x y"'])
constants = st.one_of(numbers, strings, st.sampled_from(["true", "FALSE"]))


@st.composite
def field_tests(draw: st.DrawFn) -> str:
    """One test of the fast path's shape, blanks and keywords' case drawn."""
    name, b = draw(names), draw(blank)
    kind = draw(st.sampled_from(["cmp", "str", "in", "not in", "between", "exists"]))
    if kind == "cmp":
        return f"{name}{b}{draw(st.sampled_from(['=', '!=', '<', '<=', '>', '>=']))} {draw(constants)}"
    if kind == "str":
        return f"{name} {draw(st.sampled_from(['prefix', 'SUFFIX', 'contains']))} {draw(strings)}"
    if kind in ("in", "not in"):
        items = draw(st.lists(constants, max_size=4))
        comma = draw(st.sampled_from(["", ","])) if items else ""
        return f"{name} {kind.upper() if draw(st.booleans()) else kind} {{{', '.join(items)}{comma}}}"
    if kind == "between":
        return f"{name} between {draw(numbers)} AND {draw(numbers)}"
    return f"exists{b or ' '} {name}"


@st.composite
def conjunctions(draw: st.DrawFn) -> str:
    parts = draw(st.lists(field_tests(), min_size=1, max_size=8))
    glue = draw(st.sampled_from([" & ", "&", " and ", "\nAND "]))
    return draw(blank) + glue.join(parts) + draw(blank)


@SETTINGS
@given(conjunctions())
def test_the_fast_path_reads_a_conjunction_as_the_parser_does(text: str) -> None:
    try:
        want: Filter | type[FilterError] = _slow(text)
    except FilterError:
        want = FilterError  # (`x < true`: the parser says why; the fast path leaves it to it)
    got = _quick()(text)
    if want is FilterError:
        assert got is None
    else:
        assert got == want, text
    with pytest.raises(FilterError) if want is FilterError else contextlib.nullcontext():
        assert parse(text) == want


@SETTINGS
@given(
    st.lists(
        st.one_of(
            field_tests(),
            st.sampled_from(["|", "or", "not", "!", "(", ")", "+", "-", "*", "x", "1", "{", ","]),
        ),
        max_size=8,
    ).map(" ".join)
)
def test_any_text_is_the_parsers_or_left_to_it(text: str) -> None:
    got = _quick()(text)
    if got is not None:
        assert got == _slow(text), text


@pytest.mark.parametrize(
    "text",
    [
        "x = 1 | y = 2",  # a disjunction
        "not x = 1",  # a negation
        "x = y",  # two fields
        "5 < x",  # a constant on the left
        "x = 1 + 2",  # arithmetic
        "f(x) = 1",  # a call
        "x = --1",
        'x = -"a"',
        "(x = 1)",
        "x = 1 &",
        "x in {y}",
        "x between 1 and y",
        "exists 1",
        "x = 1 $",  # a character of no token
        "",
    ],
)
def test_other_shapes_are_left_to_the_parser(text: str) -> None:
    assert _quick()(text) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x < true", "compares numbers or strings"),
        ("x prefix 3", "needs a string"),
        ("x = 1" + "0" * 5000, "integer constant"),
    ],
)
def test_a_filter_that_cannot_be_used_is_still_refused_with_the_parsers_reason(
    text: str, message: str
) -> None:
    assert _quick()(text) is None
    with pytest.raises(FilterError, match=message):
        parse(text)


def test_the_fast_path_reads_the_benchmarks_subscriptions() -> None:
    from flowbus.bench.workloads import stock_filters

    texts = stock_filters(300, 7)
    assert all(_quick()(t) == _slow(t) for t in texts)


@SETTINGS
@given(conjunctions())
def test_a_filter_of_one_conjunction_is_the_one_its_constructor_makes(text: str) -> None:
    from flowbus.filters.ast import Conjunction

    try:
        f = parse(text)
    except FilterError:
        return
    for c in f.disjuncts:
        for literals in (c.literals, (*c.literals, *c.literals), tuple(lit.negate() for lit in c.literals)):
            made, want = Filter.conjunction(literals), Filter((Conjunction(literals),))
            assert made == want and hash(made) == hash(want) and made.disjuncts == want.disjuncts
