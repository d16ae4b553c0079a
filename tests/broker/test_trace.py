"""The brokers' message trace (``FLOWBUS_TRACE``, ``flowbus chaos run --trace``): a published
event's id is in the line of the run of messages that carried it out of its publisher's
broker and into the subscriber's, with both brokers' addresses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.broker.test_server import ring, run, take, trade

import flowbus
from flowbus.net.trace import TRACE_ENV

pytestmark = pytest.mark.broker


def test_a_trace_follows_an_event_from_broker_to_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))

    async def main() -> None:
        async with ring(2) as (b0, b1), flowbus.connect(b1.address) as sc, flowbus.connect(b0.address) as pc:
            sub = await sc.subscribe("stocks", "quantity = 7")
            while True:  # (until b0 routes b1's subscription)
                await pc.publish("stocks", trade(7))
                try:
                    await sub.get(0.2)
                    break
                except TimeoutError:
                    continue
            await pc.publish("stocks", trade(7, "HP"))
            (e,) = await take(sub, 1)
            assert e["symbol"] == "HP"
            await pc.flush(10)

    run(main())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(len(line) == 4 and line[1] in ("in", "out") for line in lines)
    carried = [
        (way, peer) for _, way, peer, msgs in lines for m in msgs if m[0] == "Publish" and len(m) > 1 and m[1]
    ]
    assert carried, lines[:5]
    assert {way for way, _ in carried} == {"in", "out"}
