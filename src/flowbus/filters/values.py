"""The values a filter compares: their classes, the Python types that stand for them, and
the doubles around a number.

How it works: every evaluator (the plain one of :mod:`flowbus.filters.ast`, the compiled
closures, the matcher, the Spark Columns) reads an event's value through the same rules.

* ``None`` is no value: an attribute that holds ``None`` is a missing attribute (Arrow and
  Spark cannot tell a null from an absent field, so neither can a dict).
* A value falls in one of three classes (:func:`flowbus.filters.ast.value_class`):
  booleans, numbers, strings; anything else (a list, bytes...) is present but in no class:
  equal to nothing and ordered with nothing.
* :func:`canonical` maps the Python types that stand for a value to it: ``str``
  subclasses (``numpy.str_``) to ``str``; ``numpy.bool_`` to ``bool`` (a boolean is never a
  number); integer types (``numpy.int64``, any ``numbers.Integral``) to the ``int``; numpy
  floating scalars (any other ``numbers.Real``) to the nearest ``float`` (exact for
  float16/32/64); ``decimal.Decimal`` and ``fractions.Fraction`` to the ``int`` they equal
  when whole, else the nearest ``float`` (NaN and infinities included). The common types
  pass through untouched, so the cost falls on foreign values only.
* Numbers compare by exact value, as Python compares ``int`` and ``float``: ints of any
  size exactly, an int against a float exactly, NaN unequal to everything and ordered with
  nothing. Huge ints (``10**400``) are ints like any other; nothing overflows.

Evaluators that hold numbers as doubles (the matcher's arrays, Spark's ``double``
columns) place an exact number between doubles with :func:`floor_double` and
:func:`ceil_double`.
"""

from __future__ import annotations

import math
import numbers
import sys
from decimal import Decimal
from fractions import Fraction
from typing import Any

__all__ = ["canonical", "ceil_double", "floor_double"]

_MAX = sys.float_info.max


def canonical(v: Any) -> Any:
    """The flowbus value ``v`` stands for (see the module's note); ``None`` stays ``None`` (missing),
    a value of no class is returned as it is."""
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if isinstance(v, str):
        return str(v)
    numpy = sys.modules.get("numpy")  # (a numpy value means numpy is loaded: no import here)
    if numpy is not None and isinstance(v, numpy.bool_):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, (Decimal, Fraction)):
        return _exact_number(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return v


def _exact_number(v: Decimal | Fraction) -> int | float:
    """A decimal or a fraction: the int it equals when whole, else the nearest float."""
    if isinstance(v, Decimal) and not v.is_finite():
        return math.nan if v.is_nan() else float(v)
    if v == int(v):
        return int(v)
    try:
        return float(v)
    except OverflowError:  # a fraction beyond the doubles: it rounds to an infinity
        return math.inf if v > 0 else -math.inf


# ------------------------------------------------------------- doubles around a number


def floor_double(v: int | float) -> float:
    """The largest double that is at most ``v`` (``-inf`` below every finite double)."""
    if type(v) is float:
        return v
    try:
        d = float(v)
    except OverflowError:
        return _MAX if v > 0 else -math.inf
    return math.nextafter(d, -math.inf) if d > v else d


def ceil_double(v: int | float) -> float:
    """The smallest double that is at least ``v`` (``inf`` above every finite double)."""
    return -floor_double(-v)
