"""The event and subscription tables the cluster and Connect tests match (with a brute-force oracle)."""

from __future__ import annotations

import random

import pyarrow as pa

SYMBOLS = ["IBM", "MSFT", "AAPL", "AMZN", "MU", "ORCL"]
VENUES = ["NYSE", "NASDAQ", "LSE"]


def match_events(n: int, rng: random.Random) -> pa.Table:
    rows = [
        {
            "event_id": 10_000 + 3 * i,  # not 0..n-1: the ids must come from the column
            "sym": rng.choice(SYMBOLS),
            "price": round(rng.uniform(0, 200), 2),
            "vol": rng.randrange(0, 1000),
            "venue": rng.choice(VENUES) if i % 5 else None,  # a missing attribute
        }
        for i in range(n)
    ]
    schema = pa.schema(
        [("event_id", pa.int64()), ("sym", pa.string()), ("price", pa.float64()), ("vol", pa.int64()),
         ("venue", pa.string())]
    )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)


def match_filters(n: int, rng: random.Random) -> list[str]:
    fixed = [
        'price > 100 & sym = "IBM"',
        'sym = "MSFT" | vol < 50',
        'sym prefix "A" & price <= 42.5',
        "vol between 100 and 120",
        'exists venue & venue = "LSE" & price > 150',
        'not exists venue & sym in {"MU", "ORCL"}',
        'sym != "IBM" & vol >= 990',
    ]
    made = [
        f'sym = "{rng.choice(SYMBOLS)}" & price {rng.choice(["<", ">", "<=", ">="])} {rng.randrange(0, 200)}'
        if i % 2
        else f'venue = "{rng.choice(VENUES)}" & vol > {rng.randrange(0, 1000)}'
        for i in range(n - len(fixed))
    ]
    return fixed + made
