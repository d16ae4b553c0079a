"""Turning events (mappings or Arrow batches) into the arrays the compiled stages read.

For a batch of ``E`` events and the ``A`` attributes the index knows:

* ``codes[E, A]`` -- the value's code in its attribute's table of constants
  named by equality-like predicates, ``UNKNOWN`` for a present value no such
  predicate names, ``MISSING`` for an absent attribute;
* ``vals[E, A]`` and ``res[E, A]`` -- the value as a number, a double and a
  residual (:mod:`flowbus.matching.numbers`; ``res`` is None when every residual
  is 0), NaN when it is not a number (only for attributes that carry ranges).

Values are read as every filter reads them (:mod:`flowbus.filters.values`): a
``None`` or an Arrow null is a missing attribute, and numpy scalars, decimals
and the like are looked up as the Python values they stand for. An Arrow column
of a common type (integers, floats, strings, booleans) is encoded with array
operations, int64 included (no double can hold it, the residuals do); other
columns (decimals, uint64 past int64) go value by value.

Booleans and numbers share Python's hash (``True == 1``) but not flowbus's
equality, so an attribute whose table holds a non-string constant looks booleans
up under distinct keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowbus.filters.values import canonical, floor_double
from flowbus.matching._types import F64, I16, I32, I64
from flowbus.matching.kernels import MISSING, UNKNOWN
from flowbus.matching.numbers import split, split_int64

_NAN = float("nan")

Numbers = tuple[np.ndarray, np.ndarray | None]
"""A column's numbers: doubles, and residuals (None when all are 0)."""


class BoolKey:
    """The code-table key of a boolean constant, never equal to a number (one instance per value)."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"BoolKey({self.value})"

    def __reduce__(self) -> tuple[Any, tuple[bool]]:
        return (bool_key, (self.value,))  # unpickles to the same instance


def bool_key(value: bool) -> BoolKey:
    return BOOL_KEYS[value]


BOOL_KEYS = {True: BoolKey(True), False: BoolKey(False)}
_PLAIN = frozenset({str, int, float, bool, type(None)})
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def table_key(value: Any) -> Any:
    return BOOL_KEYS[value] if type(value) is bool else value


def _canonical(column: list[Any]) -> list[Any]:
    """``column`` with every value as filters read it (a pass in C when all are of the common types)."""
    if _PLAIN.issuperset(map(type, column)):
        return column
    return [canonical(x) for x in column]


def _codes_of(column: list[Any], table: Mapping[Any, int], typed: bool) -> list[int]:
    """The codes of canonical values (``None`` is in every table, as ``MISSING``)."""
    get = table.get
    try:
        if typed:
            return [get(BOOL_KEYS[x] if type(x) is bool else x, UNKNOWN) for x in column]
        return [get(x, UNKNOWN) for x in column]
    except TypeError:  # an unhashable value somewhere: no constant equals it
        out = []
        for x in column:
            try:
                out.append(get(BOOL_KEYS[x] if type(x) is bool else x, UNKNOWN))
            except TypeError:
                out.append(UNKNOWN)
        return out


_FLOAT = frozenset({float})
_FLOAT_OR_NONE = frozenset({float, type(None)})
_NUMBER_OR_NONE = frozenset({float, int, type(None)})
_EXACT = 2**53  # (an int this size or less is a double exactly)


def _numbers(column: list[Any]) -> tuple[list[Any] | None, list[int] | None]:
    """The numbers of canonical values (NaN for a value that is not one): doubles, and
    residuals (None when all are 0); None for the doubles when no value is a number. A column
    of floats, and of ints that doubles hold exactly, and None, costs a pass in C and one in
    a comprehension (numpy makes each int its double)."""
    types = set(map(type, column))
    if _FLOAT.issuperset(types):
        return column, None
    if types == {type(None)}:  # (no event of the batch has the attribute)
        return None, None
    if _FLOAT_OR_NONE.issuperset(types):
        return [_NAN if x is None else x for x in column], None
    if _NUMBER_OR_NONE.issuperset(types):
        ints = [x for x in column if type(x) is int]
        if min(ints) >= -_EXACT and max(ints) <= _EXACT:
            return [_NAN if x is None else x for x in column], None
    vals: list[float] = []
    append = vals.append
    res: list[int] | None = None
    for i, x in enumerate(column):
        if type(x) is float:
            append(x)
            continue
        if x is None:  # (an event without the attribute: most events, for most of them)
            append(_NAN)
            continue
        k, r = split(x)
        append(k)
        if r:
            if res is None:
                res = [0] * len(column)
            res[i] = r
    return vals, res


def encode_mappings(
    events: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    tables: Sequence[Mapping[Any, int]],
    typed: Sequence[bool],
    ranged: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(codes, vals, res)`` for events given as mappings: a Python column per attribute,
    put into the arrays made for the batch (what a batch of a few events costs is mostly per
    call, not per value; the doubles start as NaN, and a column no event has a number in
    stays so)."""
    n, a = len(events), len(names)
    codes = np.empty((n, a), I32)
    values = np.full((n, a), np.nan, F64)
    res: np.ndarray | None = None
    for j, name in enumerate(names):
        column = _canonical([e.get(name) for e in events])
        codes[:, j] = _codes_of(column, tables[j], typed[j])
        if ranged[j]:
            vals, r = _numbers(column)
            if vals is not None:
                values[:, j] = vals
            if r is not None:
                if res is None:
                    res = np.zeros((n, a), I16)
                res[:, j] = r
    return codes, values, res


def _put_numbers(vals: np.ndarray, res: np.ndarray | None, j: int, numbers: Numbers) -> np.ndarray | None:
    """Column ``j`` of ``vals`` and ``res`` (made when a first residual is not 0); returns ``res``."""
    vals[:, j], column_res = numbers
    if column_res is not None:
        if res is None:
            res = np.zeros(vals.shape, I16)
        res[:, j] = column_res
    return res


# ---------------------------------------------------------------------- Arrow


def _int64(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array | None:
    """An integer column as int64, or None when it holds a value past int64 (a uint64)."""
    if pa.types.is_uint64(column.type):
        top = pc.max(column).as_py()
        if top is not None and top > _I64_MAX:
            return None
    return pc.cast(column, pa.int64())


def _lookup(column: Any, keys: list[Any], codes: list[int], kind: pa.DataType) -> np.ndarray:
    """The codes of ``column``'s values found among ``keys`` (``codes`` in the same order), else UNKNOWN;
    MISSING for a null."""
    out = np.full(len(column), UNKNOWN, I32)
    if keys:
        position = pc.index_in(column, value_set=pa.array(keys, type=kind))
        found = position.to_numpy(zero_copy_only=False)
        hit = ~np.isnan(found) if found.dtype.kind == "f" else np.ones(len(column), bool)
        out[hit] = np.asarray(codes, I32)[found[hit].astype(I64)]
    out[column.is_null().to_numpy(zero_copy_only=False)] = MISSING
    return out


def _arrow_codes(column: pa.ChunkedArray | pa.Array, table: Mapping[Any, int], typed: bool) -> np.ndarray:
    entries = [(k, c) for k, c in table.items() if k is not None]
    kind = column.type
    pairs: list[tuple[Any, int]]
    if pa.types.is_boolean(kind):
        pairs = [(k.value, c) for k, c in entries if isinstance(k, BoolKey)]
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        pairs = [(k, c) for k, c in entries if type(k) is str]
    elif pa.types.is_floating(kind):
        column, kind = pc.cast(column, pa.float64()), pa.float64()
        pairs = [(float(k), c) for k, c in entries if _is_double(k)]
        pairs += [(-0.0, c) for k, c in entries if _is_double(k) and k == 0]  # Arrow tells -0.0 from 0.0
    elif pa.types.is_integer(kind) and (as_int := _int64(column)) is not None:
        column, kind = as_int, pa.int64()
        pairs = [(int(k), c) for k, c in entries if _is_int64(k)]
    else:
        return np.asarray(_codes_of(_canonical(column.to_pylist()), table, typed), I32)
    return _lookup(column, [k for k, _ in pairs], [c for _, c in pairs], kind)


def _is_double(k: Any) -> bool:
    t = type(k)
    return t is float or (t is int and floor_double(k) == k)


def _is_int64(k: Any) -> bool:
    t = type(k)
    return (t is int or (t is float and k.is_integer())) and _I64_MIN <= k <= _I64_MAX


def _arrow_numbers(column: pa.ChunkedArray | pa.Array) -> Numbers:
    kind = column.type
    if pa.types.is_floating(kind):
        return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), None
    if pa.types.is_integer(kind) and (as_int := _int64(column)) is not None:
        k, res = split_int64(pc.fill_null(as_int, 0).to_numpy(zero_copy_only=False))
        nulls = as_int.is_null().to_numpy(zero_copy_only=False)
        k[nulls] = np.nan
        if res is not None:
            res[nulls] = 0
        return k, res
    if pa.types.is_decimal(kind) or pa.types.is_integer(kind):
        vals, r = _numbers(_canonical(column.to_pylist()))
        if vals is None:
            return np.full(len(column), np.nan, F64), None
        return np.asarray(vals, F64), None if r is None else np.asarray(r, I16)
    return np.full(len(column), np.nan, F64), None


def encode_arrow(
    batch: pa.Table | pa.RecordBatch,
    names: Sequence[str],
    tables: Sequence[Mapping[Any, int]],
    typed: Sequence[bool],
    ranged: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(codes, vals, res)`` for an Arrow table or record batch; a null is a missing attribute."""
    n, a = batch.num_rows, len(names)
    codes = np.full((n, a), MISSING, I32)
    vals = np.full((n, a), np.nan, F64)
    res: np.ndarray | None = None
    columns = set(batch.schema.names)
    for j, name in enumerate(names):
        if name not in columns:
            continue
        column = batch.column(name)
        codes[:, j] = _arrow_codes(column, tables[j], typed[j])
        if ranged[j]:
            res = _put_numbers(vals, res, j, _arrow_numbers(column))
    return codes, vals, res
