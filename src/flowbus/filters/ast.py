"""The canonical form of a filter, and its plain evaluator.

Every filter, whatever it was written as, becomes one :class:`Filter`: a
disjunction of :class:`Conjunction` s, each a sorted tuple of literals. A literal
is either

* a :class:`Predicate` -- ``attribute OP constant`` (the 001 document's
  attribute-operator-value triple), which the matcher indexes, or
* an :class:`ExprPredicate` -- ``expression OP expression`` over attributes,
  constants, arithmetic and named functions (``price*vol >= 1000000``,
  ``NYS(issue) = "IBM"``), evaluated only for subscriptions whose simple
  predicates all hold;

and may be negated (``!(price < 10)``), which is *not* the same as the
complementary operator: a predicate on a missing attribute is false, so its
negation is true.

Value semantics, shared by every evaluator flowbus compiles from this form (the
values themselves -- classes, the types that stand for them, None -- are in
:mod:`flowbus.filters.values`):

* values fall in three classes: numbers, strings and booleans; ``=`` and ``in``
  hold only within a class (``1 = 1.0`` holds, ``1 = true`` does not); ``!=`` and
  ``not in`` are their complements on a present attribute;
* ``< <= > >=`` hold only between two numbers, compared by exact value as Python
  compares ``int`` and ``float`` (``2**53 + 1 > 2**53``), or two strings (by code
  point); ``prefix``/``suffix``/``contains`` only between strings;
* a predicate on a missing attribute is false (``exists`` tests presence); an
  attribute holding ``None`` is missing;
* NaN is unequal to everything and ordered with nothing;
* an expression that cannot be evaluated (a missing field, a non-number in
  arithmetic, division by zero, a key absent from a lookup table, a function or
  lookup that raises any exception) makes its predicate false.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from operator import methodcaller
from typing import Any

from flowbus.errors import FilterError, Undefined
from flowbus.filters.values import canonical
from flowbus.model import Value


class Op(StrEnum):
    """The operators of a predicate, by their spelling in the text form."""

    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    PREFIX = "prefix"
    SUFFIX = "suffix"
    CONTAINS = "contains"
    IN = "in"
    NOT_IN = "not in"
    EXISTS = "exists"

    @property
    def rank(self) -> int:
        return _OP_RANK[self]


_OP_RANK = {op: i for i, op in enumerate(Op)}
ORDERING_OPS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})
STRING_OPS = frozenset({Op.PREFIX, Op.SUFFIX, Op.CONTAINS})
SET_OPS = frozenset({Op.IN, Op.NOT_IN})
COMPARISON_OPS = frozenset({Op.EQ, Op.NE}) | ORDERING_OPS
_PLAIN_OPS = COMPARISON_OPS | STRING_OPS
FLIPPED = {Op.EQ: Op.EQ, Op.NE: Op.NE, Op.LT: Op.GT, Op.LE: Op.GE, Op.GT: Op.LT, Op.GE: Op.LE}
"""``c OP x`` is ``x FLIPPED[OP] c``."""


# --------------------------------------------------------------------------- values


def value_class(v: object) -> int:
    """0 for booleans, 1 for numbers, 2 for strings, -1 for anything else (of canonical values,
    see :func:`flowbus.filters.values.canonical`)."""
    t = type(v)
    if t is bool:
        return 0
    if t is int or t is float:
        return 1
    if t is str:
        return 2
    return -1


def value_key(v: Value) -> tuple[int, float, str]:
    """A total order over constants of all classes (used to sort and compare canonical forms)."""
    c = value_class(v)
    if c == 2:
        return (2, 0.0, v)  # type: ignore[return-value]
    # Numbers keep their exact value (Python orders int and float exactly): float(v)
    # would merge ints past 2**53 and overflow on huge ones.
    return (c, v if c == 1 else int(v), "")  # type: ignore[return-value]


def values_equal(a: object, b: object) -> bool:
    """``=`` between two values: same class and equal (NaN equals nothing)."""
    ca = value_class(a)
    return ca >= 0 and ca == value_class(b) and a == b


def compare(x: object, op: Op, c: object) -> bool:
    """Evaluate ``x OP c`` for a present canonical value ``x`` (set operators take a tuple ``c``)."""
    if op is Op.EQ:
        return values_equal(x, c)
    if op is Op.NE:
        return not values_equal(x, c)
    if op in ORDERING_OPS:
        cx = value_class(x)
        if cx < 1 or cx != value_class(c):
            return False
        if op is Op.LT:
            return bool(x < c)  # type: ignore[operator]
        if op is Op.LE:
            return bool(x <= c)  # type: ignore[operator]
        if op is Op.GT:
            return bool(x > c)  # type: ignore[operator]
        return bool(x >= c)  # type: ignore[operator]
    if op in STRING_OPS:
        if type(x) is not str or type(c) is not str:
            return False
        if op is Op.PREFIX:
            return x.startswith(c)
        if op is Op.SUFFIX:
            return x.endswith(c)
        return c in x
    if op is Op.IN:
        return any(values_equal(x, m) for m in c)  # type: ignore[attr-defined]
    if op is Op.NOT_IN:
        return not any(values_equal(x, m) for m in c)  # type: ignore[attr-defined]
    if op is Op.EXISTS:
        return True
    raise FilterError(f"unknown operator {op!r}")


def _check_constant(v: object, where: str) -> None:
    if value_class(v) < 0:
        raise FilterError(f"{where}: constant {v!r} is not a string, number or boolean")
    if type(v) is float and not math.isfinite(v):
        raise FilterError(f"{where}: constant {v!r} is not a finite number")


def canonical_set(values: Iterable[Value]) -> tuple[Value, ...]:
    """A value set as a sorted tuple without duplicates (``1`` and ``true`` stay distinct)."""
    seen: dict[tuple[int, float, str], Value] = {}
    for v in values:
        seen.setdefault(value_key(v), v)
    return tuple(seen[k] for k in sorted(seen))


# ----------------------------------------------------------------------- expressions


Functions = Mapping[str, Callable[..., Any] | Mapping[Any, Any]]
"""Named functions and lookup tables an expression may call: a callable, or a mapping
looked up by its one argument."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str

    def evaluate(self, event: Mapping[str, Any], functions: Functions) -> Any:
        v = event.get(self.name)
        if v is None:
            raise Undefined(self.name)
        return canonical(v)

    def fields(self) -> frozenset[str]:
        return frozenset({self.name})

    def calls(self) -> frozenset[str]:
        return frozenset()


@dataclass(frozen=True, slots=True)
class Const:
    value: Value

    def __post_init__(self) -> None:
        _check_constant(self.value, "expression")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Const)
            and value_key(self.value) == value_key(other.value)
            and (type(self.value) is type(other.value))
        )

    def __hash__(self) -> int:
        return hash(value_key(self.value))

    def evaluate(self, event: Mapping[str, Any], functions: Functions) -> Any:
        return self.value

    def fields(self) -> frozenset[str]:
        return frozenset()

    def calls(self) -> frozenset[str]:
        return frozenset()


ARITHMETIC = ("+", "-", "*", "/")


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in ARITHMETIC:
            raise FilterError(f"unknown arithmetic operator {self.op!r}")

    def evaluate(self, event: Mapping[str, Any], functions: Functions) -> Any:
        a = self.left.evaluate(event, functions)
        b = self.right.evaluate(event, functions)
        if value_class(a) != 1 or value_class(b) != 1:
            raise Undefined(f"{self.op} on a non-number")
        try:
            return self._apply(a, b)
        except (OverflowError, ZeroDivisionError):
            raise Undefined(f"{self.op} overflows") from None

    def _apply(self, a: Any, b: Any) -> Any:
        if self.op == "+":
            return a + b
        if self.op == "-":
            return a - b
        if self.op == "*":
            return a * b
        if b == 0:
            raise Undefined("division by zero")
        return a / b

    def fields(self) -> frozenset[str]:
        return self.left.fields() | self.right.fields()

    def calls(self) -> frozenset[str]:
        return self.left.calls() | self.right.calls()


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Expr, ...]

    def evaluate(self, event: Mapping[str, Any], functions: Functions) -> Any:
        try:
            fn = functions[self.name]
        except KeyError:
            raise FilterError(f"unknown function or lookup table {self.name!r}") from None
        args = [a.evaluate(event, functions) for a in self.args]
        if isinstance(fn, Mapping):
            if len(args) != 1:
                raise FilterError(f"lookup table {self.name!r} takes one argument, got {len(args)}")
            try:
                result = canonical(fn[args[0]])
            except Exception:  # a missing key, or anything the mapping raises
                raise Undefined(f"{self.name}({args[0]!r})") from None
        else:
            try:
                result = canonical(fn(*args))
            except Exception as exc:  # whatever the user's function raises
                raise Undefined(f"{self.name}: {exc!r}") from None
        if value_class(result) < 0:
            raise Undefined(f"{self.name} returned {result!r}")
        return result

    def fields(self) -> frozenset[str]:
        return frozenset().union(*(a.fields() for a in self.args))

    def calls(self) -> frozenset[str]:
        return frozenset({self.name}).union(*(a.calls() for a in self.args))


Expr = Field | Const | BinOp | Call


# ------------------------------------------------------------------------ literals


@dataclass(frozen=True, slots=True, eq=False)
class Predicate:
    """``attr OP value``: a simple predicate, indexable by the matcher.

    ``value`` is a constant, a sorted tuple of constants for ``in``/``not in``, or
    ``None`` for ``exists``. ``negated`` makes it the literal ``!(attr OP value)``.
    """

    attr: str
    op: Op
    value: Value | tuple[Value, ...] | None = None
    negated: bool = False
    _k: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    _h: int = field(init=False, repr=False, compare=False)  # (hash(_k): literals key many sets)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)  # (its text
    # form once written: filters share their literals, see the parser's fast path)

    def __post_init__(self) -> None:
        self._validate()
        v = self.value
        if v is None:
            vk: Any = ()
        elif isinstance(v, tuple):
            vk = tuple(value_key(m) for m in v)
        else:
            vk = (value_key(v),)
        k = (self.attr, "", _OP_RANK[self.op], vk, self.negated)
        object.__setattr__(self, "_k", k)
        object.__setattr__(self, "_h", hash(k))

    def _validate(self) -> None:
        if type(self.attr) is not str or not self.attr:
            raise FilterError(f"predicate attribute {self.attr!r} is not a name")
        op = self.op if type(self.op) is Op else Op(self.op)
        object.__setattr__(self, "op", op)
        v = self.value
        tv = type(v)
        if (tv is str or tv is int or (tv is float and math.isfinite(v))) and op in _PLAIN_OPS:  # type: ignore[arg-type]
            if tv is not str and op in STRING_OPS:
                raise FilterError(f"predicate on {self.attr!r}: {op} needs a string, got {v!r}")
            return
        where = f"predicate on {self.attr!r}"
        if op is Op.EXISTS:
            if self.value is not None:
                raise FilterError(f"{where}: exists takes no value")
        elif op in SET_OPS:
            if not isinstance(self.value, (tuple, list, set, frozenset)):
                raise FilterError(f"{where}: {op} needs a set of values")
            for v in self.value:
                _check_constant(v, where)
            object.__setattr__(self, "value", canonical_set(self.value))
        else:
            _check_constant(self.value, where)
            if op in ORDERING_OPS and value_class(self.value) not in (1, 2):
                raise FilterError(f"{where}: {op} needs a number or a string, got {self.value!r}")
            if op in STRING_OPS and type(self.value) is not str:
                raise FilterError(f"{where}: {op} needs a string, got {self.value!r}")

    def sort_key(self) -> tuple[Any, ...]:
        return self._k

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Predicate) and self._k == other._k

    def __hash__(self) -> int:
        return self._h

    def __reduce__(self) -> tuple[type[Predicate], tuple[Any, ...]]:
        """Pickled without the hash, which differs between processes (string hashing)."""
        return (Predicate, (self.attr, self.op, self.value, self.negated))

    def holds(self, event: Mapping[str, Any]) -> bool:
        """The predicate (before negation) on ``event`` (``None`` is a missing attribute)."""
        v = event.get(self.attr)
        if v is None:
            return False
        return self.op is Op.EXISTS or compare(canonical(v), self.op, self.value)

    def matches(self, event: Mapping[str, Any], functions: Functions | None = None) -> bool:
        return self.holds(event) != self.negated

    def fields(self) -> frozenset[str]:
        return frozenset({self.attr})

    def negate(self) -> Predicate:
        return Predicate(self.attr, self.op, self.value, not self.negated)


@dataclass(frozen=True, slots=True)
class ExprPredicate:
    """``left OP right`` over expressions; ``OP`` is a comparison or string operator."""

    left: Expr
    op: Op
    right: Expr
    negated: bool = False

    def __post_init__(self) -> None:
        op = Op(self.op)
        if op in SET_OPS or op is Op.EXISTS:
            raise FilterError(f"operator {op} cannot compare two expressions")
        object.__setattr__(self, "op", op)

    def sort_key(self) -> tuple[Any, ...]:
        from flowbus.filters.text import literal_to_text

        # The text of the positive literal: the key differs from its negation's only in
        # the last element, which Conjunction.is_contradiction relies on.
        positive = self.negate() if self.negated else self
        return ("\uffff", literal_to_text(positive), self.op.rank, (), self.negated)

    def holds(self, event: Mapping[str, Any], functions: Functions | None = None) -> bool:
        fns = functions if functions is not None else {}
        try:
            a = self.left.evaluate(event, fns)
            b = self.right.evaluate(event, fns)
        except Undefined:
            return False
        return compare(a, self.op, b)

    def matches(self, event: Mapping[str, Any], functions: Functions | None = None) -> bool:
        return self.holds(event, functions) != self.negated

    def fields(self) -> frozenset[str]:
        return self.left.fields() | self.right.fields()

    def calls(self) -> frozenset[str]:
        return self.left.calls() | self.right.calls()

    def negate(self) -> ExprPredicate:
        return ExprPredicate(self.left, self.op, self.right, not self.negated)


Literal = Predicate | ExprPredicate


# -------------------------------------------------------------------- the filter


_SORT_KEY = methodcaller("sort_key")  # (a literal's place in its conjunction)


@dataclass(frozen=True, slots=True)
class Conjunction:
    """All of ``literals`` hold. Literals are sorted and unique; the empty conjunction is true."""

    literals: tuple[Literal, ...] = ()

    def __post_init__(self) -> None:
        unique = {lit: None for lit in self.literals}
        object.__setattr__(self, "literals", tuple(sorted(unique, key=_SORT_KEY)))

    @property
    def simple(self) -> tuple[Predicate, ...]:
        return tuple(lit for lit in self.literals if isinstance(lit, Predicate))

    @property
    def expressions(self) -> tuple[ExprPredicate, ...]:
        return tuple(lit for lit in self.literals if isinstance(lit, ExprPredicate))

    def is_contradiction(self) -> bool:
        """True when the conjunction holds a literal and its negation."""
        if not any(lit.negated for lit in self.literals):
            return False
        keys = {lit.sort_key() for lit in self.literals}
        return any((*k[:-1], not k[-1]) in keys for k in keys)

    def matches(self, event: Mapping[str, Any], functions: Functions | None = None) -> bool:
        return all(lit.matches(event, functions) for lit in self.literals)

    def sort_key(self) -> tuple[Any, ...]:
        return tuple(lit.sort_key() for lit in self.literals)


MAX_CONJUNCTIONS = 256
"""A filter whose disjunctive normal form grows past this many conjunctions is refused."""


@dataclass(frozen=True, slots=True)
class Filter:
    """A disjunction of conjunctions: the one canonical form of every filter.

    No conjunctions: matches nothing (``false``). One empty conjunction: matches
    everything (``true``). Build one with :func:`flowbus.filters.parse`.
    """

    disjuncts: tuple[Conjunction, ...]
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kept = {c: None for c in self.disjuncts if not c.is_contradiction()}
        if len(kept) > MAX_CONJUNCTIONS:
            raise FilterError(
                f"filter too complex: {len(kept)} conjunctions in normal form (at most {MAX_CONJUNCTIONS})"
            )
        if any(not c.literals for c in kept):  # (the empty conjunction: true)
            kept = {Conjunction(()): None}
        disjuncts = tuple(sorted(kept, key=lambda c: c.sort_key())) if len(kept) > 1 else tuple(kept)
        object.__setattr__(self, "disjuncts", disjuncts)
        object.__setattr__(self, "_hash", hash(disjuncts))

    def __hash__(self) -> int:
        """Computed once: filters key many caches and tables (routing, covering)."""
        return self._hash

    def __reduce__(self) -> tuple[type[Filter], tuple[tuple[Conjunction, ...]]]:
        """Pickled without the hash, which differs between processes (string hashing)."""
        return (Filter, (self.disjuncts,))

    @classmethod
    def conjunction(cls, literals: Iterable[Literal]) -> Filter:
        """The filter of one conjunction of ``literals``: what ``Filter((Conjunction(...),))``
        makes, without its checks when no literal is negated (no contradiction can be in it,
        and one conjunction needs no sorting): subscriptions are made this way by the million."""
        conj = Conjunction(tuple(literals))
        if any(lit.negated for lit in conj.literals):
            return cls((conj,))
        f = object.__new__(cls)
        object.__setattr__(f, "disjuncts", (conj,))
        object.__setattr__(f, "_hash", hash((conj,)))
        return f

    @classmethod
    def true(cls) -> Filter:
        return cls((Conjunction(()),))

    @classmethod
    def false(cls) -> Filter:
        return cls(())

    def matches(self, event: Mapping[str, Any], *, functions: Functions | None = None) -> bool:
        """Does ``event`` satisfy the filter? ``functions`` resolves named functions and lookup tables."""
        return any(c.matches(event, functions) for c in self.disjuncts)

    def fields(self) -> frozenset[str]:
        """The attributes the filter reads."""
        out: set[str] = set()
        for c in self.disjuncts:
            for lit in c.literals:
                if type(lit) is Predicate:
                    out.add(lit.attr)
                else:
                    out |= lit.fields()
        return frozenset(out)

    def calls(self) -> frozenset[str]:
        """The named functions and lookup tables the filter calls."""
        return frozenset().union(
            *(lit.calls() for c in self.disjuncts for lit in c.literals if isinstance(lit, ExprPredicate))
        )

    def to_text(self) -> str:
        """The text form; ``parse(f.to_text()) == f``."""
        from flowbus.filters.text import to_text

        return to_text(self)

    def covers(self, other: Filter) -> bool:
        """True only if every event ``other`` matches, this filter matches too (sound; complete
        for conjunctions of simple predicates)."""
        from flowbus.filters.covering import covers

        return covers(self, other)

    def __and__(self, other: Filter) -> Filter:
        return Filter(
            tuple(Conjunction(a.literals + b.literals) for a in self.disjuncts for b in other.disjuncts)
        )

    def __or__(self, other: Filter) -> Filter:
        return Filter(self.disjuncts + other.disjuncts)

    def __str__(self) -> str:
        return self.to_text()
