"""Turning events (mappings or Arrow batches) into the arrays the compiled stages read.

For a batch of ``E`` events and the ``A`` attributes the index knows:

* ``codes[E, A]`` -- the value's code in its attribute's table of constants
  named by equality-like predicates, ``UNKNOWN`` for a present value no such
  predicate names, ``MISSING`` for an absent attribute;
* ``vals[E, A]`` -- the value as a double when it is a number, NaN otherwise
  (only for attributes that carry ranges).

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

from flowbus.matching._types import F64, I32
from flowbus.matching.kernels import MISSING, UNKNOWN


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


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"  # unpickles to the module's singleton


BOOL_KEYS = {True: BoolKey(True), False: BoolKey(False)}
ABSENT = _Absent()
"""Stands for a missing attribute in code tables (it maps to ``MISSING``)."""

_NAN = float("nan")


def table_key(value: Any) -> Any:
    return BOOL_KEYS[value] if type(value) is bool else value


def _codes_of(column: list[Any], table: Mapping[Any, int], typed: bool) -> list[int]:
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


def _number(x: Any) -> float:
    t = type(x)
    if t is float:
        return x  # type: ignore[no-any-return]
    if t is int:
        return float(x)
    return _NAN


def encode_mappings(
    events: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    tables: Sequence[Mapping[Any, int]],
    typed: Sequence[bool],
    ranged: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, vals)`` for events given as mappings."""
    n, a = len(events), len(names)
    codes = np.empty((n, a), I32)
    vals = np.full((n, a), np.nan, F64)
    for j, name in enumerate(names):
        column = [e.get(name, ABSENT) for e in events]
        codes[:, j] = _codes_of(column, tables[j], typed[j])
        if ranged[j]:
            vals[:, j] = [_number(x) for x in column]
    return codes, vals


def _arrow_codes(column: pa.ChunkedArray | pa.Array, table: Mapping[Any, int], typed: bool) -> np.ndarray:
    n = len(column)
    out = np.full(n, UNKNOWN, I32)
    keys = [k for k in table if k is not ABSENT]
    kind = column.type
    if pa.types.is_boolean(kind):
        keys = [k.value for k in keys if isinstance(k, BoolKey)]
        codes = [table[BOOL_KEYS[k]] for k in keys]
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        keys = [k for k in keys if type(k) is str]
        codes = [table[k] for k in keys]
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        keys = [k for k in keys if type(k) in (int, float)]
        codes = [table[k] for k in keys]
        column = pc.cast(column, pa.float64())
        keys = [float(k) for k in keys]
    else:
        python = column.to_pylist()
        return np.asarray(
            [
                MISSING if x is None else c
                for x, c in zip(python, _codes_of(python, table, typed), strict=True)
            ],
            I32,
        )
    if keys:
        position = pc.index_in(column, value_set=pa.array(keys, type=column.type))
        found = position.to_numpy(zero_copy_only=False)
        hit = ~np.isnan(found) if found.dtype.kind == "f" else np.ones(n, bool)
        lookup = np.asarray(codes, I32)
        out[hit] = lookup[found[hit].astype(np.int64)]
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    out[nulls] = MISSING
    return out


def encode_arrow(
    batch: pa.Table | pa.RecordBatch,
    names: Sequence[str],
    tables: Sequence[Mapping[Any, int]],
    typed: Sequence[bool],
    ranged: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, vals)`` for an Arrow table or record batch; a null is a missing attribute."""
    n, a = batch.num_rows, len(names)
    codes = np.full((n, a), MISSING, I32)
    vals = np.full((n, a), np.nan, F64)
    columns = set(batch.schema.names)
    for j, name in enumerate(names):
        if name not in columns:
            continue
        column = batch.column(name)
        codes[:, j] = _arrow_codes(column, tables[j], typed[j])
        if ranged[j] and (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            as_float = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
            vals[:, j] = np.where(np.isnan(as_float), np.nan, as_float)
    return codes, vals
