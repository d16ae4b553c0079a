"""Seeded event generators a spec can name as its input (``input: {generator: stocks}``).

How it works: a generator is ``fn(graph, events=N, seed=S, **options)`` yielding
``(publication point, event)`` pairs; ``flowbus run`` feeds them to an engine.
``stocks`` is the trading day of the 000 document's example (its Figures 1
and 2): the companies of the lookup tables ``NYS`` and ``NAS`` trade on both
exchanges under each exchange's own issue codes, at one price per company that
follows a seeded random walk (with rare sharp drops, so that region 5's alarm
fires), with log-normal volumes (so that some trades pass S1's million-dollar
bar). A small share of trades carries an issue code neither table knows (the
lookup is then undefined and the transform drops the trade), and a small share
is published straight into the integrated space.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flowbus.errors import FlowError
from flowbus.flow.graph import Graph

__all__ = ["GENERATORS", "generate", "stocks"]

Generator = Callable[..., Iterator[tuple[str, dict[str, Any]]]]


def _codes(graph: Graph, table: str) -> dict[str, str]:
    fn = graph.functions.get(table)
    if not isinstance(fn, Mapping):
        raise FlowError(f"generator stocks: the flow has no lookup table {table!r}")
    return {str(code): str(name) for code, name in fn.items()}


def stocks(
    graph: Graph,
    *,
    events: int,
    seed: int,
    nyse: str = "NYSE",
    nasdaq: str = "NASDAQ",
    direct: str | None = "combined",
    direct_share: float = 0.02,
    unknown_share: float = 0.01,
    crash_rate: float = 0.002,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``events`` trades on ``nyse`` and ``nasdaq`` (``{issue, price, vol}``), a few on ``direct``."""
    rng = random.Random(seed)
    tables = [(nyse, _codes(graph, "NYS")), (nasdaq, _codes(graph, "NAS"))]
    companies = sorted({name for _, codes in tables for name in codes.values()})
    base = {c: round(rng.uniform(40.0, 250.0), 2) for c in companies}
    price = dict(base)
    # where each company trades, and under which codes
    listed = {
        c: [(v, sorted(k for k, n in codes.items() if n == c)) for v, codes in tables] for c in companies
    }
    listed = {c: [(v, ks) for v, ks in places if ks] for c, places in listed.items()}
    direct_ok = direct is not None and graph.has_space(direct)
    for _ in range(events):
        company = rng.choice(companies)
        # a random walk pulled back towards the company's base price (so falls are recovered)
        pull = 0.002 * math.log(base[company] / price[company])
        p = price[company] * math.exp(pull + rng.gauss(0.0, 0.004))
        if rng.random() < crash_rate:
            p *= 1.0 - rng.uniform(0.12, 0.25)
        price[company] = p = max(1.0, round(p, 2))
        vol = 1 + int(rng.lognormvariate(8.0, 1.3))
        if direct_ok and rng.random() < direct_share:
            yield direct, {"com": company, "price": p, "vol": vol}  # type: ignore[misc]
            continue
        venue, codes = rng.choice(listed[company])
        issue = f"X{rng.randrange(1000):03d}" if rng.random() < unknown_share else rng.choice(codes)
        yield venue, {"issue": issue, "price": p, "vol": vol}


GENERATORS: dict[str, Generator] = {"stocks": stocks}


def generate(
    graph: Graph, *, events: int | None = None, seed: int | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of ``graph``'s ``input`` (``events`` and ``seed`` override the spec's)."""
    spec = graph.input
    if spec is None:
        raise FlowError(f"flow {graph.name!r} names no input generator (add `input: {{generator: stocks}}`)")
    fn = GENERATORS.get(spec.generator)
    if fn is None:
        raise FlowError(f"input: unknown generator {spec.generator!r} (known: {', '.join(GENERATORS)})")
    n = spec.events if events is None else events
    s = spec.seed if seed is None else seed
    options = dict(spec.options)
    try:
        inspect.signature(fn).bind(graph, events=n, seed=s, **options)
    except TypeError as exc:
        raise FlowError(f"input: generator {spec.generator!r}: {exc}") from None
    yield from fn(graph, events=n, seed=s, **options)
