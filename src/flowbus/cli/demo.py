"""``flowbus demo``: the stock exchanges of the 000 document, matched against many subscriptions.

Two exchanges publish trades: NYSE as ``(issue, price, vol)`` and NASDAQ as
``(issue, price, capital)`` with their own issue codes; the lookup tables
``NYS()`` and ``NAS()`` map codes to company names. A few named subscriptions
(including the document's big-trade select ``price*vol >= 1000000``) sit among
many random ones; the trades stream through the matcher in Arrow batches.

numpy, pyarrow and the matcher are imported by the functions that use them, so that
mounting the command costs ``flowbus --help`` nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from flowbus.cli.common import fail, out
from flowbus.errors import FlowbusError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["demo", "run_demo"]

COMPANIES = ("IBM", "Apple", "Microsoft", "Oracle", "Intel", "Cisco", "Amgen", "Honeywell")
NYS = {"IBM": "IBM", "AAPL.N": "Apple", "MSFT.N": "Microsoft", "ORCL.N": "Oracle", "HON": "Honeywell"}
NAS = {"IBMQ": "IBM", "AAPL": "Apple", "MSFT": "Microsoft", "INTC": "Intel", "CSCO": "Cisco", "AMGN": "Amgen"}

NAMED = {
    "big NYSE trades (S1)": 'exchange = "NYSE" & price*vol >= 1000000',
    "big NASDAQ trades (S1)": 'exchange = "NASDAQ" & capital >= 1000000',
    "IBM above 150": 'NYS(issue) = "IBM" & price > 150 | NAS(issue) = "IBM" & price > 150',
    "cheap Intel": 'issue = "INTC" & price < 60',
    "Apple anywhere": 'issue in {"AAPL", "AAPL.N"}',
    "odd lots": "exists vol & vol < 100",
}


def demo(
    subscriptions: Annotated[int, typer.Option(help="Random subscriptions besides the named ones.")] = 20_000,
    trades: Annotated[int, typer.Option(help="Trades to generate (both exchanges).")] = 200_000,
    seed: Annotated[int, typer.Option(help="Seed of the generator.")] = 7,
) -> None:
    """Match a stream of stock trades (the 000 document's example) against many subscriptions."""
    try:
        run_demo(subscriptions=subscriptions, trades=trades, seed=seed, console=out)
    except FlowbusError as exc:
        fail(str(exc))


def make_trades(n: int, seed: int) -> pa.Table:
    """``n`` trades, half from each exchange (columns absent on one exchange are null)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    nyse = rng.random(n) < 0.5
    codes = np.where(nyse, rng.choice(list(NYS), n), rng.choice(list(NAS), n))
    price = np.round(rng.lognormal(4.5, 0.5, n), 2)
    vol = rng.integers(1, 20_000, n)
    return pa.table(
        {
            "exchange": np.where(nyse, "NYSE", "NASDAQ"),
            "issue": codes,
            "price": price,
            "vol": pa.array(vol, mask=~nyse),
            "capital": pa.array(np.round(price * vol, 2), mask=nyse),
        }
    )


def random_filters(n: int, seed: int) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    issues = list(NYS) + list(NAS)
    out = []
    for _ in range(n):
        issue = issues[int(rng.integers(len(issues)))]
        lo = int(rng.integers(20, 200))
        hi = lo + int(rng.integers(1, 6))
        out.append(f'issue = "{issue}" & price between {lo} and {hi}')

    return out


def run_demo(*, subscriptions: int, trades: int, seed: int, console: Console) -> dict[str, Any]:
    from flowbus.matching import Matcher

    console.rule("[bold]flowbus demo[/]: stock trades through the matcher")
    matcher = Matcher(functions={"NYS": NYS, "NAS": NAS})
    t0 = time.perf_counter()
    matcher.add_many((name, text) for name, text in NAMED.items())
    matcher.add_many(enumerate(random_filters(subscriptions, seed)))
    build_s = time.perf_counter() - t0
    table = make_trades(trades, seed)
    t0 = time.perf_counter()
    results = matcher.match_batch(table)
    match_s = time.perf_counter() - t0
    hits: Counter[Any] = Counter()
    for ids in results:
        hits.update(ids.tolist())
    named = Table(title=f"named subscriptions over {trades:,} trades")
    named.add_column("subscription")
    named.add_column("filter")
    named.add_column("matched", justify="right")
    for name, text in NAMED.items():
        named.add_row(name, text, f"{hits[name]:,}")
    console.print(named)
    deliveries = sum(len(r) for r in results)
    summary = {
        "subscriptions": len(matcher),
        "trades": trades,
        "deliveries": deliveries,
        "parse_and_index_s": round(build_s, 3),
        "match_s": round(match_s, 3),
        "trades_per_s": round(trades / match_s),
    }
    console.print(
        f"{len(matcher):,} subscriptions parsed and indexed in {build_s:.2f} s; "
        f"{trades:,} trades matched in {match_s:.2f} s "
        f"([bold]{trades / match_s:,.0f} trades/s[/]), {deliveries:,} deliveries."
    )
    return summary
