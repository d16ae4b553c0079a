"""Fuzzing ``parse``: any text gives a Filter or a FilterError that says where and what, never a crash.

Three sources of input: (a) arbitrary text, (b) valid filter texts mutated (a
character inserted, deleted or replaced, or a prefix taken), (c) soups of the
grammar's own tokens (grammar.lark: keywords in any case, operators, names,
numbers, strings with escapes, whitespace and newlines), and (d) expressions
nested around the parser's depth limit. For each input
:func:`parse` either returns a :class:`Filter` whose ``to_text()`` reads back
as the same filter, or raises :class:`FilterError`. A text syntax error is a
:class:`FilterSyntaxError` whose line and column point into the text and whose
message names them; a triple/JSON error or a well-formed filter that cannot be
used (``x < true``) may come without a position but always with a message.
Examples are small and each has a deadline, so a pathological slowdown fails.
What the fuzzing found (and parser.py now refuses cleanly) is pinned in
``test_found_by_fuzzing``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flowbus.errors import FilterError, FilterSyntaxError
from flowbus.filters import Filter, parse
from flowbus.filters.parser import MAX_EXPR_DEPTH, _lark
from strategies import trees

FUZZ = settings(
    max_examples=300,
    deadline=timedelta(milliseconds=500),
    suppress_health_check=[HealthCheck.too_slow],
)

VALID = [
    "x = 1",
    "x != 1.5 & y < -3",
    'name prefix "IB" | name suffix "M" | name contains "B"',
    'x in {1, 2, 3} & y not in {"a", "b"}',
    "x between 1 and 5",
    "exists vol & not exists cap",
    "!(a = 1 | b = 2) & c >= 2e3",
    "price * vol >= 1000000",
    "(a + b) / 2 > c - 1",
    "-vol < -5",
    'NYS(issue) = "IBM" & max(a, b, 3) > 0',
    "f() = 1",
    r's = "a\"b\\c\nd\u00e9"',
    "TRUE | False",
    "a.b_c9 <= .5 and d >= 1.e-3 or e = 7E2",
    "x = 1 &\n  (y = 2 |\r\n z = 3)",
    "x in {}",
    "x in {1, 2,}",
]


_lark()  # build the parser once, before any deadline applies


def _check(text: str) -> None:
    """``parse(text)`` returns a Filter that round-trips, or raises a FilterError that says where."""
    try:
        f = parse(text)
    except FilterSyntaxError as err:
        assert str(err), text
        if text.lstrip().startswith("["):
            return  # the triple form: JSON errors have a position, a bad triple names the triple
        assert err.text == text
        lines = text.split("\n")
        assert 1 <= err.line <= len(lines), (text, err.line, str(err))
        assert 1 <= err.column <= len(lines[err.line - 1]) + 1, (text, err.column, str(err))
        assert f"at line {err.line}, column {err.column}" in str(err), str(err)
        assert all(not word.isupper() for word in err.expected), err.expected  # no raw terminal names
        return
    except FilterError as err:
        assert str(err), text
        return
    assert isinstance(f, Filter)
    printed = f.to_text()
    assert parse(printed) == f, (text, printed)
    assert parse(printed).to_text() == printed


# ------------------------------------------------------------ (a) any text


@FUZZ
@given(st.text(max_size=40))
@example("")
@example("[")
@example("[[")
@example('[["x", "=", 1]')
@example("\x00")
@example("x = \ud800")
@example('x = "\ud800"')
@example("x\u2028= 1")
@example("x = 1\r\ny = 2")
def test_any_text(text: str) -> None:
    _check(text)


@FUZZ
@given(st.text(alphabet=st.characters(codec="ascii"), max_size=30))
def test_any_ascii_text(text: str) -> None:
    _check(text)


# ---------------------------------------------------------- (b) mutations

MUTATION_CHARS = st.sampled_from(list(' \n"\\(){},=!<>&|-+*/.0123456789eEabxyz_[]\t\ud800é'))


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A valid filter text with a few characters inserted, deleted or replaced, or cut short."""
    text = draw(st.one_of(st.sampled_from(VALID), trees().map(lambda t: t.text)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "prefix", "swap"]))
        i = draw(st.integers(0, len(text)))
        if kind == "insert":
            text = text[:i] + draw(MUTATION_CHARS) + text[i:]
        elif kind == "delete" and text:
            i = min(i, len(text) - 1)
            text = text[:i] + text[i + 1 :]
        elif kind == "replace" and text:
            i = min(i, len(text) - 1)
            text = text[:i] + draw(MUTATION_CHARS) + text[i + 1 :]
        elif kind == "prefix":
            text = text[:i]
        elif kind == "swap" and len(text) >= 2:
            i = min(i, len(text) - 2)
            text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    return text


@FUZZ
@given(mutated())
def test_mutations_of_valid_texts(text: str) -> None:
    _check(text)


def test_the_seed_texts_are_valid() -> None:
    for text in VALID:
        assert isinstance(parse(text), Filter), text


@FUZZ
@given(st.sampled_from(VALID))
def test_every_prefix_of_a_valid_text(text: str) -> None:
    for i in range(len(text) + 1):
        _check(text[:i])


# ---------------------------------------------------------- (c) token soups


def _any_case(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda ups: "".join(c.upper() if u else c for c, u in zip(word, ups, strict=True))
    )


KEYWORDS = ["or", "and", "not", "in", "between", "exists", "true", "false", "prefix", "suffix", "contains"]
SYMBOLS = ["|", "&", "!", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", "{", "}", ","]
TOKENS = st.one_of(
    st.sampled_from(SYMBOLS),
    st.sampled_from(KEYWORDS).flatmap(_any_case),
    st.sampled_from(["a", "b", "x", "price", "a.b", "_z9", "f", "NYS", "max", "orx", "in_", "true1"]),
    st.sampled_from(["0", "1", "42", "007", "1.5", ".5", "1.", "2e3", "1E-2", "1e999", "9" * 30]),
    st.sampled_from(['""', '"a"', '"IBM"', r'"\""', r'"\\"', r'"\n\t"', r'"\u00e9"', r'"\ud800"', '"é"']),
)
SEPARATORS = st.sampled_from([" ", " ", " ", "", "\n", "\t", "\r\n"])


@st.composite
def token_soups(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(TOKENS, max_size=14))
    out = []
    for tok in tokens:
        out += [tok, draw(SEPARATORS)]
    return "".join(out)


@FUZZ
@given(token_soups())
def test_token_soups(text: str) -> None:
    _check(text)


@st.composite
def shaped_soups(draw: st.DrawFn) -> str:
    """Token soups with more structure: operand (operator operand)*, sometimes parenthesised."""
    operand = st.one_of(
        st.sampled_from(["a", "b", "x", "1", "2.5", '"s"', "true", "f(a)", "f()", "-a", "{1, 2}"]),
        TOKENS,
    )
    operator = st.one_of(
        st.sampled_from(["=", "!=", "<", ">=", "&", "|", "+", "*", "/", "in", "not in", "between"]),
        st.sampled_from(KEYWORDS).flatmap(_any_case),
    )
    parts = [draw(operand)]
    for _ in range(draw(st.integers(0, 6))):
        parts += [draw(operator), draw(operand)]
        if draw(st.booleans()) and draw(st.booleans()):
            parts = ["(", *parts, ")"]
        if draw(st.integers(0, 5)) == 0:
            parts.insert(0, draw(st.sampled_from(["!", "not", "exists", "-"])))
    return " ".join(parts)


@FUZZ
@given(shaped_soups())
def test_shaped_token_soups(text: str) -> None:
    _check(text)


# ------------------------------------------------------------- deep nesting

WRAPPERS = [("-", ""), ("f(", ")"), ("(", ")"), ("a + (", ")"), ("(", " * 2)"), ("g(1, ", ")"), ("1 - ", "")]


@st.composite
def deep(draw: st.DrawFn) -> str:
    """An expression wrapped 0..150 times (around the parser's depth limit), compared or negated."""
    layers = draw(st.lists(st.sampled_from(WRAPPERS), max_size=150))
    inner = draw(st.sampled_from(["x", "1", "x > 1"]))
    text = "".join(o for o, _ in layers) + inner + "".join(c for _, c in reversed(layers))
    return draw(st.sampled_from(["{} > 0", "{}", "!({} = 1)", "{} in {{1, 2}}"])).format(text)


@settings(max_examples=100, deadline=timedelta(milliseconds=500))
@given(deep())
def test_deep_nesting(text: str) -> None:
    _check(text)


# ------------------------------------------------- found by fuzzing (fixed)

BIG = "9" * 3000


@pytest.mark.parametrize(
    "text",
    [
        f"x = {BIG} * {BIG}",  # parsed, then to_text() failed: 6000 digits are too many to print
        f"x = {BIG} * {BIG} / 3",  # ValueError escaped: the error message printed the huge int
        f"x = {BIG} * 1.0",  # OverflowError's message, likewise
        f'x = {BIG} * {BIG} + "s"',
        "-" * (MAX_EXPR_DEPTH + 1) + "x > 1",  # parsed (up to ~490 deep), then == hit RecursionError
        "x" + " - x" * MAX_EXPR_DEPTH + " > 1",
        "f(" * MAX_EXPR_DEPTH + "x" + ")" * MAX_EXPR_DEPTH + " = 1",
    ],
    ids=["int-product", "int-division", "int-to-float", "int-plus-string", "neg", "sum", "calls"],
)
def test_found_by_fuzzing(text: str) -> None:
    with pytest.raises(FilterError) as info:
        parse(text)
    assert len(str(info.value)) < 300, str(info.value)


def test_the_deepest_expression_parsed_compares_and_round_trips() -> None:
    text = "x" + " - x" * (MAX_EXPR_DEPTH - 1) + " > 1"
    f, g = parse(text), parse(text + " ")  # two objects (parse remembers texts)
    assert f is not g and f == g
    assert parse(f.to_text()) == f
    assert parse("-" * (MAX_EXPR_DEPTH - 1) + "x > 1") == parse(" " + "-" * (MAX_EXPR_DEPTH - 1) + "x > 1")
    assert parse("(" * 300 + "x" + ")" * 300 + " = 1") == parse("x = 1")  # parentheses do not count


# ---------------------------------------------------------- round trips


@settings(max_examples=200, deadline=timedelta(milliseconds=500))
@given(trees())
def test_valid_trees_round_trip(tree: object) -> None:
    f = parse(tree.text)  # type: ignore[attr-defined]
    assert parse(f.to_text()) == f
