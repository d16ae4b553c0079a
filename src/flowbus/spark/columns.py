"""Filters and expressions compiled to Spark Columns, with the plain evaluator's exact semantics.

How it works: a Spark column has one type, but a flowbus value has a *class*
(boolean, number, string) that the semantics depend on (``1 = true`` is false,
``"a" < 1`` is false, arithmetic on a string is undefined). So every expression
compiles, at compile time and from the DataFrame's schema, to its *parts*: a
mapping from the value kind it can yield (``bool``, ``int``, ``float``, ``str``,
``other``) to a Column that is non-null exactly when the expression is defined
and of that kind. A field of a ``long`` column has one part ``{"int": col}``; a
``decimal(p, s)`` column two, ``int`` where the value is whole and ``float``
elsewhere (a decimal is the int it equals, else the nearest double); a field the
schema lacks, or arithmetic on a string column, has none (it is never defined);
a lookup table whose values mix strings and numbers has one part per value
class. The parts of an expression are mutually exclusive per row.

A predicate ``a OP b`` is then the OR, over the pairs of parts whose kinds the
operator accepts, of a Spark comparison between those two columns -- pairs of
different classes contribute nothing, so Spark never sees a comparison it would
coerce or refuse (no analysis error for ``s < 1`` on a string column ``s``):

* numbers compare by exact value, as Python compares ``int`` and ``float``: two
  ``long`` parts as longs; a ``long`` against a ``double`` through the double's
  floor or ceiling as a long (``i < x`` is ``i < ceil(x)``), the doubles past
  2**63 and the infinities decided without a cast; a NaN equals nothing and is
  ordered with nothing (Spark would say ``NaN = NaN``, hence the guards);
* a number constant is brought to the part's own type exactly, in Python: against
  a ``long``, ``i < 2.5`` is ``i <= 2`` and ``i < 10**400`` holds for any ``i``;
  against a ``double``, an int no double holds is replaced by the doubles around
  it (``x < 2**53 + 1`` is ``x <= 2**53``);
* strings order by UTF-8 bytes, which is code point order;
* ``prefix``/``suffix``/``contains`` between strings;
* ``!=``/``not in`` are ``defined AND NOT (=/in)``; ``exists`` is ``defined``.

A null (undefined) comparison becomes false with ``coalesce(p, false)``, and a
negated literal is ``NOT`` of that, so a literal over a missing attribute (a
null) is false and its negation true, as in
:meth:`flowbus.filters.ast.Filter.matches`.

Arithmetic uses ``try_add``/``try_subtract``/``try_multiply`` on two ``long``
parts and plain double arithmetic otherwise; ``/`` is ``try_divide`` on doubles,
null (undefined) when the divisor is zero. A lookup table becomes literal maps
(``create_map``), one per (argument kind, value class), read with
``try_element_at`` (a missing key is null); the keys an argument kind can hit are
found by asking the Python table itself, so ``table[True]`` finding the key ``1``
behaves as in Python.

Not supported (documented deviations): Python callables (``max``, user functions)
raise :class:`ColumnUnsupported` naming the function, so a caller can fall back
to a Python UDF, and so does a ``decimal`` column whose whole part may not fit 64
bits (precision minus scale above 18); integer arithmetic whose operands or result
leave 64 bits is undefined here (Python's ints are unbounded), and so is a lookup
value past 64 bits; a division of ints past 2**53 rounds twice (to doubles, then
the quotient), so its last bit may differ from Python's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from functools import reduce
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    VarcharType,
)

from flowbus.errors import ColumnUnsupported, FilterError, UserError
from flowbus.filters.ast import (
    FLIPPED,
    ORDERING_OPS,
    STRING_OPS,
    BinOp,
    Call,
    Conjunction,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Literal,
    Op,
    compare,
    value_class,
)
from flowbus.filters.values import canonical, ceil_double, floor_double

__all__ = [
    "ColumnCompiler",
    "ColumnUnsupported",
    "WideDecimal",
    "expr_to_column",
    "filter_to_column",
    "parts_defined",
    "schema_types",
]

Parts = dict[str, Column]
"""Value kind (``bool``, ``int``, ``float``, ``str``, ``other``; ``bigint`` for a constant past 64
bits) -> a Column non-null when of that kind."""
FunctionsLike = Mapping[str, Callable[..., Any] | Mapping[Any, Any]]

_NUMBERS = ("int", "float")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_TWO63 = 2.0**63
_KIND_OF_TYPE: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str", Decimal: "decimal"}


class WideDecimal:
    """The schema type of a ``decimal`` column whose whole part may not fit 64 bits (refused when read)."""


def schema_types(schema: StructType) -> dict[str, type]:
    """A DataFrame schema as field -> ``bool``/``int``/``float``/``str``/``Decimal`` (``object`` for
    other types, :class:`WideDecimal` for a decimal of more than 18 digits before the point)."""
    return {f.name: _python_type(f.dataType) for f in schema.fields}


def _python_type(dt: DataType) -> type:
    if isinstance(dt, BooleanType):
        return bool
    if isinstance(dt, (ByteType, ShortType, IntegerType, LongType)):
        return int
    if isinstance(dt, (FloatType, DoubleType)):
        return float
    if isinstance(dt, (StringType, CharType, VarcharType)):
        return str
    if isinstance(dt, DecimalType):
        return Decimal if dt.precision - dt.scale <= 18 else WideDecimal
    return object


def filter_to_column(
    f: Filter, *, functions: FunctionsLike | None = None, schema: Mapping[str, type] | None
) -> Column:
    """A boolean, never-null Column that is true exactly where ``f.matches(event)`` is.

    ``schema`` maps the DataFrame's fields to their Python types (see
    :func:`schema_types`); a field it lacks is missing from every event.
    """
    return ColumnCompiler(functions or {}, schema).filter(f)


def expr_to_column(
    e: Expr, *, functions: FunctionsLike | None = None, schema: Mapping[str, type] | None
) -> Column:
    """The value of ``e`` as one Column, null where ``e`` is undefined.

    An expression whose values mix classes (a lookup table of strings and numbers)
    has no single Spark type: :class:`ColumnUnsupported` is raised.
    """
    c = ColumnCompiler(functions or {}, schema)
    return c.single(c.value(e), e)


def _or(cols: list[Column]) -> Column:
    return reduce(lambda a, b: a | b, cols) if cols else F.lit(False)


def _and(cols: list[Column]) -> Column:
    return reduce(lambda a, b: a & b, cols) if cols else F.lit(True)


def _false_if_null(c: Column) -> Column:
    return F.coalesce(c, F.lit(False))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class ColumnCompiler:
    """Compiles expressions and filters over one schema with one set of functions."""

    def __init__(self, functions: FunctionsLike, schema: Mapping[str, type] | None, struct: str = "") -> None:
        self._functions = functions
        self._schema = schema
        self._struct = _quote(struct) + "." if struct else ""  # fields of this struct column, if named
        self._maps: dict[tuple[str, str], dict[str, Column]] = {}  # built once: each lit is a JVM call

    # ------------------------------------------------------------ expressions

    def value(self, e: Expr) -> Parts:
        """The parts of ``e`` (see the module docstring)."""
        if isinstance(e, Field):
            return self._field(e.name)
        if isinstance(e, Const):
            return _const(e.value)
        if isinstance(e, BinOp):
            return _binop(e.op, self.value(e.left), self.value(e.right))
        return self._call(e)

    def defined(self, e: Expr) -> Column:
        """True where ``e`` has a value (never null)."""
        return parts_defined(self.value(e))

    def single(self, parts: Parts, e: Expr | None = None) -> Column:
        """The parts as one Column (numbers of both kinds as doubles); null where undefined."""
        if not parts:
            return F.lit(None)
        if len(parts) == 1:
            return next(iter(parts.values()))
        if set(parts) <= {*_NUMBERS, "bigint"}:
            return F.coalesce(*(c.cast("double") for c in parts.values()))
        what = f" {e!r}" if e is not None else ""
        raise ColumnUnsupported(
            f"expression{what} yields values of several classes ({', '.join(sorted(parts))}): "
            "a Spark column has one type",
            function="",
        )

    def _field(self, name: str) -> Parts:
        if self._schema is None:
            raise UserError(
                f"field {name!r}: compiling to a Spark Column needs the DataFrame's schema "
                "(pass schema=schema_types(df.schema))"
            )
        kind = self._schema.get(name)
        if kind is None:
            return {}  # not a column: missing from every event
        if kind is WideDecimal:
            raise ColumnUnsupported(
                f"field {name!r}: a decimal column with more than 18 digits before the point may hold "
                "ints past 64 bits (cast it to decimal(18 + scale, scale), long or double)",
                function="",
            )
        col = F.col(self._struct + _quote(name))
        k = _KIND_OF_TYPE.get(kind, "other")
        if k == "int":
            col = col.cast("long")
        elif k == "float":
            col = col.cast("double")
        elif k == "decimal":  # the int it equals when whole, else the nearest double
            whole = col == F.floor(col)
            return {"int": F.when(whole, col.cast("long")), "float": F.when(~whole, col.cast("double"))}
        return {k: col}

    def _call(self, e: Call) -> Parts:
        try:
            fn = self._functions[e.name]
        except KeyError:
            raise FilterError(f"unknown function or lookup table {e.name!r}") from None
        if not isinstance(fn, Mapping):
            raise ColumnUnsupported(
                f"function {e.name!r} is a Python callable: it cannot be compiled to a Spark Column "
                "(evaluate it with a Python UDF instead)",
                function=e.name,
            )
        if len(e.args) != 1:
            raise FilterError(f"lookup table {e.name!r} takes one argument, got {len(e.args)}")
        arg = self.value(e.args[0])
        out: dict[str, list[Column]] = {}
        for kind, col in arg.items():
            maps = self._maps.get((e.name, kind))
            if maps is None:
                maps = self._maps[e.name, kind] = _lookup_maps(fn, kind)
            for vkind, m in maps.items():
                out.setdefault(vkind, []).append(F.try_element_at(m, col))
        return _merge(out)

    # ------------------------------------------------------------ conditions

    def literal(self, lit: Literal) -> Column:
        """The literal as a never-null boolean Column (negation applied)."""
        positive = _false_if_null(self._positive(lit))
        return ~positive if lit.negated else positive

    def _positive(self, lit: Literal) -> Column:
        if isinstance(lit, ExprPredicate):
            left, right = lit.left, lit.right
            if isinstance(left, Const) and isinstance(right, Const):
                return F.lit(compare(left.value, lit.op, right.value))
            if isinstance(right, Const):
                return _compare_const(self.value(left), lit.op, right.value)
            if isinstance(left, Const) and lit.op in FLIPPED:
                return _compare_const(self.value(right), FLIPPED[lit.op], left.value)
            return _compare(self.value(left), lit.op, self.value(right))
        x = self._field(lit.attr)
        if lit.op is Op.EXISTS:
            return parts_defined(x)
        if lit.op in (Op.IN, Op.NOT_IN):
            assert isinstance(lit.value, tuple)
            member = _false_if_null(_or([_compare_const(x, Op.EQ, m) for m in lit.value]))
            return member if lit.op is Op.IN else parts_defined(x) & ~member
        assert lit.value is not None and not isinstance(lit.value, tuple)
        return _compare_const(x, lit.op, lit.value)

    def conjunction(self, conj: Conjunction) -> Column:
        return _and([self.literal(lit) for lit in conj.literals])

    def filter(self, f: Filter) -> Column:
        return _or([self.conjunction(c) for c in f.disjuncts])


# ------------------------------------------------------------------ helpers


def parts_defined(parts: Parts) -> Column:
    """True where one of the parts is non-null (the expression is defined); never null."""
    return _or([c.isNotNull() for c in parts.values()])


def _merge(out: dict[str, list[Column]]) -> Parts:
    return {k: cols[0] if len(cols) == 1 else F.coalesce(*cols) for k, cols in out.items()}


def _const(v: Any) -> Parts:
    """A constant's parts; an int past 64 bits takes part in arithmetic with doubles only (as the
    nearest double, as Python converts it), and has none when no double holds it."""
    c = value_class(v)
    if c == 0:
        return {"bool": F.lit(bool(v))}
    if c == 2:
        return {"str": F.lit(v)}
    if type(v) is not int:
        return {"float": F.lit(float(v))}
    if _LONG_MIN <= v <= _LONG_MAX:
        return {"int": F.lit(v).cast("long")}
    try:
        return {"bigint": F.lit(float(v))}
    except OverflowError:
        return {}


_ARITHMETIC = {"int", "float", "bigint"}
_TRY: dict[str, Callable[[Column, Column], Column]] = {
    "+": F.try_add,
    "-": F.try_subtract,
    "*": F.try_multiply,
}
_PLAIN: dict[str, Callable[[Column, Column], Column]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def _binop(op: str, a: Parts, b: Parts) -> Parts:
    out: dict[str, list[Column]] = {}
    for ka, ca in a.items():
        for kb, cb in b.items():
            kinds = {ka, kb}
            if not kinds <= _ARITHMETIC or ("bigint" in kinds and "float" not in kinds):
                continue  # arithmetic on a non-number, or on an int past 64 bits and a long: undefined
            if op == "/":
                out.setdefault("float", []).append(F.try_divide(ca.cast("double"), cb.cast("double")))
            elif ka == kb == "int":
                out.setdefault("int", []).append(_TRY[op](ca, cb))
            else:
                out.setdefault("float", []).append(_PLAIN[op](ca.cast("double"), cb.cast("double")))
    return _merge(out)


_ORDER: dict[Op, Callable[[Column, Column], Column]] = {
    Op.EQ: lambda a, b: a == b,
    Op.LT: lambda a, b: a < b,
    Op.LE: lambda a, b: a <= b,
    Op.GT: lambda a, b: a > b,
    Op.GE: lambda a, b: a >= b,
}


def _numbers(ka: str, ca: Column, op: Op, kb: str, cb: Column) -> Column:
    """``a OP b`` (``=`` or an ordering) for two number parts, by exact value."""
    cmp = _ORDER[op]
    if ka == kb == "int":
        return cmp(ca, cb)
    if ka == kb:
        return cmp(ca, cb) & ~F.isnan(ca) & ~F.isnan(cb)
    if ka == "int":
        return _long_vs_double(ca, op, cb)
    return _long_vs_double(cb, FLIPPED[op], ca)


def _long_vs_double(i: Column, op: Op, x: Column) -> Column:
    """``i OP x`` for a ``long`` and a ``double``, exactly: through ``x``'s floor or ceiling as a long,
    the doubles past the longs (and NaN) decided without a cast."""
    nan, above, below = F.isnan(x), x >= F.lit(_TWO63), x < F.lit(-_TWO63)
    if op is Op.EQ:
        whole = F.when(x == F.floor(x), i == x.cast("long")).otherwise(F.lit(False))
        return F.when(nan | above | below, F.lit(False)).otherwise(whole)
    edge = F.ceil(x) if op in (Op.LT, Op.GE) else F.floor(x)
    i_below = op in (Op.LT, Op.LE)
    test = F.when(nan, F.lit(False)).when(above, F.lit(i_below)).when(below, F.lit(not i_below))
    return test.otherwise(_ORDER[op](i, edge)) & i.isNotNull()


def _pair(ka: str, ca: Column, op: Op, kb: str, cb: Column) -> Column | None:
    """``a OP b`` for two parts (None when the kinds never satisfy ``OP``)."""
    if op is Op.EQ or op in ORDERING_OPS:
        if ka in _NUMBERS and kb in _NUMBERS:
            return _numbers(ka, ca, op, kb, cb)
        if ka == kb == "str" or (op is Op.EQ and ka == kb == "bool"):
            return _ORDER[op](ca, cb)
        return None
    if op in STRING_OPS:
        if ka != "str" or kb != "str":
            return None
        if op is Op.PREFIX:
            return ca.startswith(cb)
        if op is Op.SUFFIX:
            return ca.endswith(cb)
        return ca.contains(cb)
    raise FilterError(f"operator {op} cannot compare two expressions")


def _compare(a: Parts, op: Op, b: Parts) -> Column:
    """The positive predicate ``a OP b`` (may be null; callers coalesce it to false)."""
    if op is Op.NE:
        eq = _false_if_null(_compare(a, Op.EQ, b))
        return parts_defined(a) & parts_defined(b) & ~eq
    terms = [_pair(ka, ca, op, kb, cb) for ka, ca in a.items() for kb, cb in b.items()]
    return _or([_false_if_null(t) for t in terms if t is not None])


def _compare_const(a: Parts, op: Op, c: Any) -> Column:
    """The positive predicate ``a OP c`` for a constant ``c`` (may be null; callers coalesce it)."""
    if op is Op.NE:
        return parts_defined(a) & ~_false_if_null(_compare_const(a, Op.EQ, c))
    if value_class(c) != 1:
        return _compare(a, op, _const(c))
    terms = [
        _long_vs(col, op, c) if kind == "int" else _double_vs(col, op, c)
        for kind, col in a.items()
        if kind in _NUMBERS and op not in STRING_OPS
    ]
    return _or([_false_if_null(t) for t in terms if t is not None])


def _long_vs(col: Column, op: Op, c: int | float) -> Column | None:
    """``col OP c`` for a ``long`` column and a number: ``c`` turned, in Python, into the long bound it
    means (``i < 2.5`` is ``i <= 2``); None when no long satisfies it."""
    if op is Op.EQ:
        whole = type(c) is int or c.is_integer()  # type: ignore[union-attr]
        return col == F.lit(int(c)).cast("long") if whole and _LONG_MIN <= c <= _LONG_MAX else None
    if op is Op.LT or op is Op.LE:
        top = math.floor(c) if op is Op.LE else math.ceil(c) - 1
        if top >= _LONG_MAX:
            return col.isNotNull()
        return col <= F.lit(top).cast("long") if top >= _LONG_MIN else None
    low = math.ceil(c) if op is Op.GE else math.floor(c) + 1
    if low <= _LONG_MIN:
        return col.isNotNull()
    return col >= F.lit(low).cast("long") if low <= _LONG_MAX else None


def _double_vs(col: Column, op: Op, c: int | float) -> Column | None:
    """``col OP c`` for a ``double`` column and a number: an int no double holds becomes the doubles
    around it (``x < 2**53 + 1`` is ``x <= 2**53``)."""
    if type(c) is int and floor_double(c) != c:
        if op is Op.EQ:
            return None
        if op is Op.LT or op is Op.LE:
            return (col <= F.lit(floor_double(c))) & ~F.isnan(col)
        return (col >= F.lit(ceil_double(c))) & ~F.isnan(col)
    return _ORDER[op](col, F.lit(float(c))) & ~F.isnan(col)


# ------------------------------------------------------------------ lookup tables


def _key_candidates(table: Mapping[Any, Any], kind: str) -> list[Any]:
    """The values of kind ``kind`` an argument could have that may hit a key of ``table``."""
    if kind == "str":
        return [k for k in table if type(k) is str]
    if kind == "bool":
        return [False, True]
    if kind not in _NUMBERS:
        return []
    out: list[Any] = []
    for key in table:
        k = canonical(key)
        if value_class(k) not in (0, 1) or (type(k) is float and not math.isfinite(k)):
            continue
        if kind == "float" and floor_double(k) == k:
            out.append(float(k))
        elif kind == "int" and k == int(k) and _LONG_MIN <= int(k) <= _LONG_MAX:
            out.append(int(k))
    return out


def _lookup_maps(table: Mapping[Any, Any], kind: str) -> dict[str, Column]:
    """Value kind -> a literal map from the ``kind`` keys that hit ``table`` to its values of that kind.

    Each candidate key is looked up in the Python table itself, so Python's key
    equality (``1 == 1.0 == True``) decides what hits.
    """
    entries: dict[str, dict[Any, Any]] = {}
    for key in _key_candidates(table, kind):
        try:
            v = canonical(table[key])
        except Exception:  # a missing key, or anything the mapping raises: undefined
            continue
        vkind = _KIND_OF_TYPE.get(type(v))
        if vkind is None or (vkind == "int" and not _LONG_MIN <= v <= _LONG_MAX):
            continue  # not a flowbus value: undefined, as in the plain evaluator
        entries.setdefault(vkind, {})[key] = v
    key_type = {"str": "string", "bool": "boolean", "int": "long", "float": "double"}[kind]
    value_type = {"str": "string", "bool": "boolean", "int": "long", "float": "double"}
    maps: dict[str, Column] = {}
    for vkind, items in entries.items():
        args: list[Column] = []
        for k, v in items.items():
            args += [F.lit(k).cast(key_type), F.lit(v).cast(value_type[vkind])]
        maps[vkind] = F.create_map(*args)
    return maps
