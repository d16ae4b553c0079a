"""Pulled durable subscriptions: read by position, nothing changes until acknowledged, a
restarted reader finds its subscription, refusals name what is wrong."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from tests.broker.conftest import StartBroker
from tests.broker.test_crash import _free_ports
from tests.broker.test_server import ring, run, trade

import flowbus
from flowbus.client.pull import Mark, PulledSubscription, serving
from flowbus.errors import SubscribeError

pytestmark = pytest.mark.broker


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


def test_a_reader_keeps_exactly_once_when_its_subscriptions_broker_is_killed_and_restarted(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    """Three broker processes; a pulled subscription at the first. The reader reads a batch
    and commits it, reads a second and is stopped before its commit; the broker is killed
    (``kill -9``), the publisher goes on, the broker is restarted on its data (it hands its
    queue over to the subscription's taker, whose positions are its own). The reader, as a
    query restarted from its checkpoint, reads the second batch again, commits it, reads the
    rest: every event once, in order. Before, the reader opened its subscription at the first
    broker that answered, the restarted one, which serves it no more: a second subscription
    was made there and read, and everything after the first batch was lost; and the
    taker's positions (its own) were read as the dead broker's."""
    listen = f"127.0.0.1:{_free_ports(1)[0]}"
    first, a = start_broker(listen, data=tmp_path / "a")
    addresses = [a] + [start_broker(join=[a], data=tmp_path / n)[1] for n in ("b", "c")]
    time.sleep(1.0)  # (the ring settles)
    sent: list[int] = []

    async def publish(n: int) -> None:
        async with flowbus.connect(addresses[2], name=f"publisher-{len(sent)}") as pub:
            for _ in range(n):
                sent.append(len(sent))
                await pub.publish("stocks", trade(sent[-1]))
            await pub.flush(60)

    async def batch(start: Mark, *, commit: bool) -> tuple[Mark, list[int]]:
        async with serving(addresses, "r", "stocks", resume=True, timeout=60) as q:
            end = await q.advance(start)
            rows = await q.between(start, end)
            if commit:
                await q.commit(end)
            return end, [e["quantity"] for _, _, e in rows]

    async def before() -> tuple[Mark, Mark, list[int]]:
        async with serving(addresses, "r", "stocks", resume=False) as q:
            start = Mark(0, q.store)
        await asyncio.sleep(0.5)  # (the subscription travels the ring)
        await publish(150)
        one, got = await batch(start, commit=True)
        await publish(150)
        two, _ = await batch(one, commit=False)  # (the reader stops before its commit)
        assert two.seq > one.seq and two.store == one.store
        return one, two, got

    one, two, got = asyncio.run(asyncio.wait_for(before(), 120))
    assert got == list(range(150))
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    asyncio.run(asyncio.wait_for(publish(150), 120))
    start_broker(listen, data=tmp_path / "a")  # (its queue goes to the taker)

    async def after() -> list[int]:
        async with serving(addresses, "r", "stocks", resume=True, timeout=60) as q:
            assert q.store != two.store  # (served by its taker now: other positions)
            out = [e["quantity"] for _, _, e in await q.between(one, two)]  # (the replay)
            await q.commit(two)
        end = two
        for _ in range(60):
            end, rows = await batch(end, commit=True)
            out += rows
            if len(got) + len(out) >= len(sent):
                break
            await asyncio.sleep(0.5)
        return out

    rest = asyncio.run(asyncio.wait_for(after(), 300))
    assert got + rest == sent
