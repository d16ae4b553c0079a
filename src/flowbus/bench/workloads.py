"""Seeded subscription and event workloads of the benchmarks.

* ``w1`` -- 20 string attributes ``a0..a19`` with 100 values ``v0..v99`` each;
  a subscription picks 3 distinct attributes uniformly, equality on each; an
  event carries all 20 attributes.
* ``w1-mixed`` -- as ``w1``, but odd-numbered attributes are integers 0..99 and
  get a range ``[lo, lo + w)`` with ``w`` uniform in 1..30 (``lo`` uniform in
  ``0..100-w``).
* ``w-rein`` -- 20 numeric attributes with domain ``[0, 10**6)``; a subscription
  picks 10 distinct attributes, each with range ``[lo, lo + 0.4*10**6]``, ``lo``
  uniform in ``[0, 0.6*10**6)``; events are uniform. About ``n * 0.4**10``
  matches per event.

Filters are built straight into the canonical form (no text parsing) and come in
chunks, so a million subscriptions never sit in memory as Python objects.

* The stock workload of the broker benchmarks (:func:`stock_events`,
  :func:`stock_filters`): events with a ``symbol`` of 50 values, a ``price``, a
  ``quantity``, an ``exchange`` of 5 values and a ``level`` 0-9; filters with equality on
  the symbol and ranges on 2-4 of the others, as text (an event matches about K / 500 of K);
  a probe event and the filter only it matches (:data:`STOCK_PROBE_FILTER`).
* The stock example's flow spec (:func:`stock_flow_spec`), which ``flowbus bench flow`` and
  ``flowbus bench spark`` run: ``examples/stocks/flow.yaml`` of a checkout (it is not in the
  wheel; without a checkout they say so).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from flowbus.errors import UserError
from flowbus.filters.ast import Conjunction, Filter, Op, Predicate

WorkloadName = Literal["w1", "w1-mixed", "w-rein"]
WORKLOADS: tuple[WorkloadName, ...] = ("w1", "w1-mixed", "w-rein")
N_ATTRS = 20
N_VALUES = 100
REIN_DOMAIN = 1_000_000.0


@dataclass(frozen=True, slots=True)
class Workload:
    name: WorkloadName
    seed: int

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise UserError(f"unknown workload {self.name!r} (expected one of {', '.join(WORKLOADS)})")

    def filters(self, n: int, *, chunk: int = 20_000, start: int = 0) -> Iterator[list[tuple[int, Filter]]]:
        """``n`` subscriptions as ``(id, filter)`` pairs, in chunks; ids are ``start, start+1, ...``."""
        rng = np.random.default_rng([self.seed, 1, start])
        for lo in range(0, n, chunk):
            k = min(chunk, n - lo)
            yield list(zip(range(start + lo, start + lo + k), self._filters(rng, k), strict=True))

    def _filters(self, rng: np.random.Generator, k: int) -> list[Filter]:
        width = 10 if self.name == "w-rein" else 3
        attrs = np.argsort(rng.random((k, N_ATTRS)), axis=1)[:, :width]
        if self.name == "w-rein":
            los = rng.uniform(0.0, 0.6 * REIN_DOMAIN, (k, width))
            return [_rein_filter(a.tolist(), lo.tolist()) for a, lo in zip(attrs, los, strict=True)]
        vals = rng.integers(0, N_VALUES, (k, width))
        widths = rng.integers(1, 31, (k, width))
        starts = rng.random((k, width))
        out = []
        for a_row, v_row, w_row, s_row in zip(attrs, vals, widths, starts, strict=True):
            lits: list[Predicate] = []
            for a, v, w, s in zip(
                a_row.tolist(), v_row.tolist(), w_row.tolist(), s_row.tolist(), strict=True
            ):
                if self.name == "w1-mixed" and a % 2 == 1:
                    lo = int(s * (N_VALUES - w + 1))
                    lits += [Predicate(f"a{a}", Op.GE, lo), Predicate(f"a{a}", Op.LT, lo + w)]
                else:
                    lits.append(Predicate(f"a{a}", Op.EQ, f"v{v}"))
            out.append(Filter((Conjunction(tuple(lits)),)))
        return out

    def events(self, m: int) -> pa.Table:
        """``m`` events as an Arrow table, one column per attribute."""
        rng = np.random.default_rng([self.seed, 2])
        columns: dict[str, Any] = {}
        names = pa.array([f"v{i}" for i in range(N_VALUES)])
        for a in range(N_ATTRS):
            if self.name == "w-rein":
                columns[f"a{a}"] = pa.array(rng.uniform(0.0, REIN_DOMAIN, m))
            elif self.name == "w1-mixed" and a % 2 == 1:
                columns[f"a{a}"] = pa.array(rng.integers(0, N_VALUES, m))
            else:
                columns[f"a{a}"] = names.take(pa.array(rng.integers(0, N_VALUES, m)))
        return pa.table(columns)


def _rein_filter(attrs: list[int], los: list[float]) -> Filter:
    lits: list[Predicate] = []
    for a, lo in zip(attrs, los, strict=True):
        lits.append(Predicate(f"a{a}", Op.GE, lo))
        lits.append(Predicate(f"a{a}", Op.LE, lo + 0.4 * REIN_DOMAIN))
    return Filter((Conjunction(tuple(lits)),))


# ------------------------------------------------------------------- the stock workload

STOCK_SYMBOLS = [f"S{i}" for i in range(50)]
STOCK_EXCHANGES = ["NYSE", "NASDAQ", "LSE", "TSE", "HKEX"]
STOCK_PRICE = (10.0, 110.0)
STOCK_QUANTITY = (1, 1000)
STOCK_PROBE = "__probe"
STOCK_PROBE_FILTER = f'symbol = "{STOCK_PROBE}"'
"""A filter no stock event matches, and :data:`STOCK_PROBE_EVENT` only: the broker benchmarks'
sentinel subscriptions, which tell that the subscriptions made before them are routed."""
STOCK_PROBE_EVENT: dict[str, Any] = {
    "symbol": STOCK_PROBE,
    "price": 1.0,
    "quantity": 1,
    "exchange": "X",
    "level": 0,
}


def stock_events(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` stock events as plain Python values."""
    rng = np.random.default_rng(seed)
    symbol = rng.integers(0, len(STOCK_SYMBOLS), n).tolist()
    price = np.round(rng.uniform(*STOCK_PRICE, n), 2).tolist()
    quantity = rng.integers(STOCK_QUANTITY[0], STOCK_QUANTITY[1] + 1, n).tolist()
    exchange = rng.integers(0, len(STOCK_EXCHANGES), n).tolist()
    level = rng.integers(0, 10, n).tolist()
    return [
        {"symbol": STOCK_SYMBOLS[s], "price": p, "quantity": q, "exchange": STOCK_EXCHANGES[x], "level": lv}
        for s, p, q, x, lv in zip(symbol, price, quantity, exchange, level, strict=True)
    ]


def _range(
    rng: random.Random, name: str, lo: float, hi: float, frac: tuple[float, float], digits: int
) -> str:
    width = (hi - lo) * rng.uniform(*frac)
    a = rng.uniform(lo, hi - width)
    if digits:
        return f"{name} >= {round(a, digits)} & {name} < {round(a + width, digits)}"
    return f"{name} >= {int(a)} & {name} <= {int(a + width)}"


def stock_filters(k: int, seed: int) -> list[str]:
    """``k`` filters (text): ``symbol = "S<i>"`` and conditions on 2-4 of price, quantity,
    level, exchange."""
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        parts = [f'symbol = "{rng.choice(STOCK_SYMBOLS)}"']
        for attr in sorted(rng.sample(["price", "quantity", "level", "exchange"], rng.randint(2, 4))):
            if attr == "price":
                parts.append(_range(rng, "price", *STOCK_PRICE, (0.2, 0.6), 1))
            elif attr == "quantity":
                parts.append(_range(rng, "quantity", *STOCK_QUANTITY, (0.3, 0.7), 0))
            elif attr == "level":
                a = rng.randint(0, 7)
                b = rng.randint(a + 2, 9)
                parts.append(f"level >= {a}" if b == 9 else f"level between {a} and {b}")
            elif rng.random() < 0.5:
                parts.append(f'exchange = "{rng.choice(STOCK_EXCHANGES)}"')
            else:
                names = ", ".join(f'"{x}"' for x in rng.sample(STOCK_EXCHANGES, rng.randint(2, 3)))
                parts.append(f"exchange in {{{names}}}")
        out.append(" & ".join(parts))
    return out


# ---------------------------------------------------------------------- the stock flow

STOCK_FLOW = Path("examples") / "stocks" / "flow.yaml"


def stock_flow_spec() -> Path:
    """``examples/stocks/flow.yaml`` of the checkout this package runs from, else of the current
    directory; a :class:`~flowbus.errors.UserError` naming both places when neither has it."""
    beside = Path(__file__).resolve().parents[3] / STOCK_FLOW
    here = Path.cwd() / STOCK_FLOW
    for path in (beside, here):
        if path.is_file():
            return path
    raise UserError(
        f"this benchmark runs the stock example {STOCK_FLOW} of a flowbus checkout: "
        f"not found at {beside} nor at {here} (run it from a checkout of flowbus)"
    )
