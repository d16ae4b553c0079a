"""The statistics of the experiments: means over seeds, 95 % t intervals, least-squares fits.

How it works: :func:`mean` and :func:`sample_sd` are the plain formulas, summed in the
order given (the CSV files depend on the last bit). :func:`interval` is the Student t
interval ``mean +- t(0.975, n-1) * sd / sqrt(n)`` (not clipped at 0); with one value the
standard deviation and the interval are undefined (None). :func:`t975` reads the quantile
from a table (degrees of freedom 1..30, 40, 60, 120, infinity), interpolated linearly in
1/df between its entries; :func:`flowbus.spark.sweep.t975_column` computes the same from
:data:`T975_TABLE` and :data:`T975_SEGMENTS` in Spark. :func:`fit_log` fits
``y = a + b log2 n`` (the O(log n) claims of the 003 document) and :func:`r_squared`
scores any fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

__all__ = [
    "T975_INF",
    "T975_SEGMENTS",
    "T975_TABLE",
    "fit_log",
    "interval",
    "mean",
    "r_squared",
    "sample_sd",
    "t975",
]

T975_TABLE: Final[Mapping[int, float]] = {
    1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060,
    9: 2.2622, 10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199,
    17: 2.1098, 18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639,
    25: 2.0595, 26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423, 40: 2.0211, 60: 2.0003,
    120: 1.9799,
}  # fmt: skip
T975_INF: Final = 1.9600

T975_SEGMENTS: Final[tuple[tuple[int, float, int | None, float], ...]] = (
    (30, T975_TABLE[30], 40, T975_TABLE[40]),
    (40, T975_TABLE[40], 60, T975_TABLE[60]),
    (60, T975_TABLE[60], 120, T975_TABLE[120]),
    (120, T975_TABLE[120], None, T975_INF),
)
"""Between table entries (df_a, t_a) and (df_b, t_b): linear in 1/df (df_b None: infinity)."""


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in T975_TABLE:
        return T975_TABLE[df]
    for a, ta, b, tb in T975_SEGMENTS:
        if b is None or df < b:
            inv_b = 0.0 if b is None else 1.0 / b
            return ta + (tb - ta) * (1.0 / a - 1.0 / df) / (1.0 / a - inv_b)
    raise AssertionError("unreachable")  # pragma: no cover


def mean(xs: Sequence[float]) -> float:
    """The arithmetic mean of a non-empty sequence, summed in order."""
    return sum(xs) / len(xs)


def sample_sd(xs: Sequence[float], centre: float) -> float | None:
    """The sample standard deviation (n - 1) around ``centre`` (the mean); None for one value."""
    n = len(xs)
    return math.sqrt(sum((x - centre) ** 2 for x in xs) / (n - 1)) if n > 1 else None


def interval(centre: float, sd: float | None, n: int) -> tuple[float | None, float | None, float | None]:
    """(half width, low, high) of the 95 % t interval; Nones for ``sd`` None (one value)."""
    if sd is None or n < 2:
        return None, None, None
    half = t975(n - 1) * sd / math.sqrt(n)
    return half, centre - half, centre + half


def r_squared(ys: Sequence[float] | np.ndarray, predicted: Sequence[float] | np.ndarray) -> float:
    """1 - residual / total sum of squares (1.0 when the ``ys`` do not vary)."""
    y = np.asarray(ys, dtype=float)
    pred = np.asarray(predicted, dtype=float)
    ss = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0


def fit_log(ns: Sequence[int], ys: Sequence[float]) -> dict[str, float]:
    """Least squares ``y = a + b log2 n``: the slope, intercept and R^2 (NaNs below two points)."""
    x = np.log2(np.asarray(ns, dtype=float))
    y = np.asarray(ys, dtype=float)
    if len(x) < 2:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan}
    b, a = np.polyfit(x, y, 1)
    return {"slope": float(b), "intercept": float(a), "r2": r_squared(y, a + b * x)}
