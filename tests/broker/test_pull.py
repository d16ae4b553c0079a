"""Pulled durable subscriptions: read by position, nothing changes until acknowledged, a
restarted reader finds its subscription, refusals name what is wrong."""

from __future__ import annotations

import asyncio

import pytest
from tests.broker.test_server import ring, run, trade

import flowbus
from flowbus.client.pull import PulledSubscription
from flowbus.errors import SubscribeError


def test_a_pulled_subscription_is_read_by_position_and_acknowledged() -> None:
    async def main() -> None:
        async with ring(2) as (a, b):
            async with flowbus.connect(a.address, name="reader") as c:
                q = await PulledSubscription.open(c, "spark/stocks", "stocks", "quantity >= 5")
                assert await q.top() == 0
                async with flowbus.connect(b.address) as pub:  # (published at the other broker)
                    await asyncio.sleep(0.3)  # (the subscription travels the ring)
                    for i in range(12):
                        await pub.publish("stocks", trade(i))
                    await pub.flush(10)
                top = await q.top()
                rows = await q.read(after=0, upto=top)
                assert [e["quantity"] for _, _, e in rows] == list(range(5, 12))
                positions = [pos for pos, _, _ in rows]
                assert positions == sorted(positions) and positions[-1] == top
                assert all(eid[0] == pub.name for _, eid, _ in rows)
                again = await q.read(after=positions[2], upto=positions[4])  # reading changes nothing
                assert [e["quantity"] for _, _, e in again] == [8, 9]
                assert await q.ack(positions[2]) == 4
            async with flowbus.connect(a.address, name="reader-2") as c:  # a restarted reader
                q = await PulledSubscription.open(c, "spark/stocks", "stocks", "quantity >= 5")
                rows = await q.read(after=0, upto=await q.top())
                assert [e["quantity"] for _, _, e in rows] == [8, 9, 10, 11]
                clash = r"open 'spark/stocks' at broker .*: .* reads space 'stocks', not 'events'"
                with pytest.raises(SubscribeError, match=clash):
                    await PulledSubscription.open(c, "spark/stocks", "events")
                with pytest.raises(SubscribeError, match="unknown space 'nope'"):
                    await PulledSubscription.open(c, "spark/nope", "nope")
                with pytest.raises(SubscribeError, match="no pulled subscription 'other'"):
                    await PulledSubscription(c, "other", "stocks").top()

    run(main())
