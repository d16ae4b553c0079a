"""How the matcher holds exact numbers in arrays of doubles: a double and a residual.

How it works: an event's number is an ``int`` or a ``float`` (:mod:`flowbus.filters.values`),
compared exactly. The interval indexes hold doubles, and a double cannot tell ``2**53 + 1``
from ``2**53``. So a number ``v`` becomes a pair ``(k, r)`` (:func:`split`): ``k`` is the
largest double at most ``v``, ``r`` what is left over:

* ``r = 0`` when ``v`` is a double (every float, and every int a double holds exactly);
* ``r = v - k`` for an int64 that is not a double (past 2**53 neighbouring doubles are 2 to
  1024 apart, so ``1 <= r <= 1023``);
* ``r = 1`` for an int beyond int64 that is not a double: no bound the indexes hold lies
  strictly between two such doubles (see :func:`is_range`), so the whole gap is one class,
  "just above ``k``".

Pairs ordered lexicographically order the numbers exactly. An interval is the smallest and
the largest pair it holds, kept as two doubles and two residuals (:func:`range_bounds`):
``lo``/``hi`` are the smallest and largest *double* in it -- all that a double value needs,
so the common case tests ``lo <= v <= hi`` as before -- and ``lo_r``/``hi_r`` say what it
holds in the gaps beside them: from ``(prev(lo), lo_r)`` up when ``lo_r > 0``, up to
``(hi, hi_r)``. A range whose constant is an int beyond int64 and not a double
(``x > 10**400``) has no such bounds: it stays a predicate, tested exactly in Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from flowbus.filters.ast import Op, Predicate
from flowbus.filters.values import floor_double
from flowbus.matching._types import F64, I16, I64

__all__ = ["gap_top", "inside", "is_range", "range_bounds", "split", "split_int64"]

_EXACT = 2**53
"""Every int of at most this size is a double."""
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_TWO63 = 2.0**63
_INF = math.inf
_NAN = math.nan
_RANGE_OPS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})


@njit(cache=True, nogil=True)
def gap_top(k: float) -> int:
    """The largest residual of a number in the gap just above the double ``k`` (0: it holds none)."""
    if k != k or k == np.inf:
        return 0
    nk = np.nextafter(k, np.inf)
    if k < -_TWO63 or nk > _TWO63:
        return 1
    u = nk - k
    return int(u) - 1 if u >= 2.0 else 0


@njit(cache=True, nogil=True, inline="always")
def inside(v: float, r: int, nv: float, lo: float, lo_r: int, hi: float, hi_r: int) -> bool:
    """Is the number ``(v, r)`` in the interval ``(lo, lo_r, hi, hi_r)``? (``nv`` is the double after
    ``v``; for ``r == 0`` this is ``lo <= v <= hi``.)"""
    low = v >= lo or (lo_r > 0 and r >= lo_r and nv == lo)
    return low and (v < hi or (v == hi and r <= hi_r))


def split(v: Any) -> tuple[float, int]:
    """The pair ``(k, r)`` of a canonical value (NaN for a value that is not a number)."""
    t = type(v)
    if t is float:
        return v, 0
    if t is not int:
        return _NAN, 0
    if -_EXACT <= v <= _EXACT:
        return float(v), 0
    k = floor_double(v)
    if k == v:
        return k, 0
    return k, v - int(k) if _I64_MIN <= v <= _I64_MAX else 1


def split_int64(v: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`split` of an int64 array, with array operations; the residuals are None when all are 0."""
    d = v.astype(F64)
    if not (np.abs(d) >= _EXACT).any():
        return d, None
    top = d >= _TWO63  # rounded up past int64: above v
    back = np.where(top, 0.0, d).astype(I64)
    k = np.where(top | (back > v), np.nextafter(d, -_INF), d)
    return k, (v - k.astype(I64)).astype(I16)


def is_range(p: Predicate) -> bool:
    """Is ``p`` a range literal the interval indexes take (``< <= > >=`` on a number they can bound
    exactly, not negated)?"""
    if p.op not in _RANGE_OPS or p.negated:
        return False
    c: Any = p.value
    t = type(c)
    return t is float or (t is int and (_I64_MIN <= c <= _I64_MAX or floor_double(c) == c))


_PLAIN_BOUNDS: dict[Op, Callable[[float], tuple[float, int, float, int]]] = {
    # a constant below 2**53 in size: no int lies in the gap beside a bound
    Op.GE: lambda c: (c, 0, _INF, 0),
    Op.GT: lambda c: (math.nextafter(c, _INF), 0, _INF, 0),
    Op.LE: lambda c: (-_INF, 0, c, 0),
    Op.LT: lambda c: (-_INF, 0, math.nextafter(c, -_INF), 0),
}


def range_bounds(p: Predicate) -> tuple[float, int, float, int]:
    """``(lo, lo_r, hi, hi_r)`` of the range literal ``p`` (see :func:`is_range`)."""
    c: Any = p.value
    if -_EXACT < c < _EXACT:  # the common case (ints and floats alike)
        return _PLAIN_BOUNDS[p.op](float(c))
    k, r = split(c)
    if p.op is Op.GE or p.op is Op.GT:
        if p.op is Op.GT:
            k, r = (k, r + 1) if r < gap_top(k) else (math.nextafter(k, _INF), 0)
        return (k, 0, _INF, 0) if r == 0 else (math.nextafter(k, _INF), r, _INF, 0)
    if p.op is Op.LT:
        if r > 0:
            r -= 1
        else:
            k = math.nextafter(k, -_INF)
            r = gap_top(k)
    return -_INF, 0, k, r
