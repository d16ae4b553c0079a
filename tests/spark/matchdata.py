"""What the cluster and Connect tests share: the tables they match, and the oracles they check against."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flowbus.filters import parse

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


STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"
RUN_ARGS = ["--events", "800", "--seed", "2", "--batch-events", "400", "--format", "jsonl"]
"""The ``flowbus run`` of the stock example both kinds of cluster run (what :func:`check_run` expects)."""


def written_pairs(path: Path) -> list[tuple[Any, Any]]:
    """The (event_id, sub_id) pairs ``flowbus match`` wrote, sorted."""
    out = pq.read_table(path)
    return sorted(zip(out.column("event_id").to_pylist(), out.column("sub_id").to_pylist(), strict=True))


def brute_force_pairs(events: pa.Table, sub_ids: list[str], texts: list[str]) -> list[tuple[Any, str]]:
    """Every (event_id, sub_id) whose filter the event satisfies, by the plain evaluator, sorted."""
    filters = [(sid, parse(text)) for sid, text in zip(sub_ids, texts, strict=True)]
    return sorted(
        (row["event_id"], sid)
        for row in events.to_pylist()
        for sid, f in filters
        if f.matches({k: v for k, v in row.items() if v is not None and k != "event_id"})
    )


def check_run(out: Path, doc: dict[str, Any]) -> None:
    """``flowbus run`` of :data:`RUN_ARGS` wrote, per point, the interpreter's events in its order."""
    from flowbus.flow import LocalRun, load_spec, rewrite
    from flowbus.flow.generators import generate

    g = load_spec(STOCKS)
    expected = LocalRun(rewrite(g)).run(generate(g, events=800, seed=2)).outputs
    for point, events in expected.items():
        rows = [json.loads(line) for f in sorted((out / point).glob("*/part-*.json")) for line in f.open()]
        rows.sort(key=lambda r: r["_order"])
        assert [{k: v for k, v in r.items() if k != "_order"} for r in rows] == [dict(e) for e in events], (
            point
        )
        assert doc["outputs"][point]["events"] == len(events)
