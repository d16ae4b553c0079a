"""What a delivery costs at the least, whatever the broker's design: the steps every
delivery of an event to a subscriber's application takes in this stack, timed alone
(``flowbus bench floor --json``).

* ``encode_us`` -- msgpack-packing one delivery row ``[subscription, number, publisher,
  pseq, event]`` in a batch of 2,000 (the broker's ``Events`` frame);
* ``decode_us`` -- unpacking it (the client);
* ``handoff_us`` -- an ``asyncio.Queue`` put and get to the task that consumes the
  subscription (the client's ``async for event in sub``).

Their sum times the deliveries a second a goal needs is the CPU it takes before any
matching, custody, acknowledgement or application code: ``cores_at`` gives it for
20,000 events/s with 20 deliveries each (the broker benchmark at K = 10,000).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack  # type: ignore[import-untyped]

EVENT = {"symbol": "S1", "price": 12.5, "quantity": 10, "exchange": "LSE", "level": 3, "t": 1.0}
BATCH = 2_000


def _per_row(fn: object, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - start) / (rounds * BATCH) * 1e6


async def _handoff(n: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def consume() -> None:
        for _ in range(n):
            await queue.get()

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0)
    start = time.perf_counter()
    for _ in range(0, n, BATCH):
        for j in range(BATCH):
            queue.put_nowait(j)
        await asyncio.sleep(0)
    await task
    return (time.perf_counter() - start) / n * 1e6


def measure(rounds: int = 200, deliveries_per_s: float = 400_000.0) -> dict[str, float]:
    rows = [[f"sub-{i}", i, "publisher", i, EVENT] for i in range(BATCH)]
    blob = msgpack.packb(rows, use_bin_type=True)
    encode = _per_row(lambda: msgpack.packb(rows, use_bin_type=True), rounds)
    decode = _per_row(lambda: msgpack.unpackb(blob, raw=False), rounds)
    handoff = asyncio.run(_handoff(rounds * BATCH))
    total = encode + decode + handoff
    return {
        "encode_us": encode,
        "decode_us": decode,
        "handoff_us": handoff,
        "floor_us": total,
        "deliveries_per_s": deliveries_per_s,
        "cores_at": total * deliveries_per_s / 1e6,
    }


def run(*, rounds: int = 200, deliveries_per_s: float = 20_000 * 20.0) -> dict[str, Any]:
    """:func:`measure`, named: what ``flowbus bench floor`` prints."""
    return {"benchmark": "broker_floor", **measure(rounds, deliveries_per_s)}
