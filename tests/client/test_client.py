"""The client's life as one Status: NEW, CONNECTING, CONNECTED, back to CONNECTING when its
broker goes, CLOSED; a client no broker answers is CLOSED with a ClientError naming where it
looked. (Publishing and subscribing through brokers: tests/broker/test_server.py.)"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest

import flowbus
from flowbus.broker.server import Broker
from flowbus.client import ClientError, Status, Subscription

pytestmark = pytest.mark.broker


async def _eventually(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    assert cond()


def test_status_follows_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    """... and each move is logged on ``flowbus.client``: where it connected, where it left
    and why."""
    caplog.set_level("INFO", logger="flowbus.client")

    async def go() -> None:
        broker = await Broker.start()
        try:
            await broker.joined()
            client = flowbus.connect(broker.address, connect_timeout=10)
            assert client.status is Status.NEW and not client.closed
            await client.open()
            assert client.status is Status.CONNECTED and client.broker == broker.address
        finally:
            await broker.close()
        await _eventually(lambda: client.status is Status.CONNECTING)
        await client.close()
        assert client.status is Status.CLOSED and client.closed
        said = [r.getMessage() for r in caplog.records if r.name == "flowbus.client"]
        assert said[0] == f"client {client.name}: connected to {broker.address}, 0 subscriptions attached"
        assert said[1].startswith(f"client {client.name}: left {broker.address}: ")
        with pytest.raises(ClientError, match="closed"):
            await client.publish("stocks", {})

    asyncio.run(asyncio.wait_for(go(), 60))


def test_no_broker_answers() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"

    async def go() -> None:
        client = flowbus.connect(address, connect_timeout=0.3)
        with pytest.raises(ClientError, match=address):
            await client.open()
        assert client.status is Status.CLOSED

    asyncio.run(asyncio.wait_for(go(), 30))


def test_batches_hand_over_what_has_come_in_order_and_acknowledge_it() -> None:
    async def go() -> None:
        broker = await Broker.start()
        try:
            await broker.joined()
            async with flowbus.connect(broker.address) as c:
                sub = await c.subscribe("events", "x >= 0")
                with pytest.raises(ValueError, match="at least 1"):
                    sub.batches(0)
                for i in range(500):
                    await c.publish("events", {"x": i})
                got: list[list[dict[str, object]]] = []

                async def take() -> None:
                    async for batch in sub.batches(100):
                        got.append(batch)
                        if sum(map(len, got)) == 500:
                            return

                await asyncio.gather(take(), c.flush(30))  # (flush: every event acknowledged)
                assert [e["x"] for b in got for e in b] == list(range(500))
                assert all(1 <= len(b) <= 100 for b in got) and len(got) < 500  # (some batched)
                assert sub.received == 500 and broker.stats()["in_custody"] == 0
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_merged_subscriptions_hand_over_their_events_together_each_with_its_subscription() -> None:
    async def go() -> None:
        broker = await Broker.start()
        try:
            await broker.joined()
            async with flowbus.connect(broker.address) as c:
                low = await c.subscribe("events", "x < 300", merged=True)
                even = await c.subscribe("events", "x >= 0 & x < 1000", merged=True)
                alone = await c.subscribe("events", "x >= 400")  # (its own queue)
                with pytest.raises(ClientError, match="merged"):
                    low.batches()
                for i in range(500):
                    await c.publish("events", {"x": i})
                got: list[tuple[str, int]] = []

                async def take() -> None:
                    async for batch in c.merged(200):
                        assert len(batch) <= 200
                        got.extend((sub.id, e["x"]) for sub, e in batch)
                        if len(got) == 800:
                            return

                async def take_alone() -> list[int]:
                    return [e["x"] async for e in _first(alone, 100)]

                _, rest, _ = await asyncio.gather(take(), take_alone(), c.flush(30))
                assert [x for s, x in got if s == low.id] == list(range(300))
                assert [x for s, x in got if s == even.id] == list(range(500))
                assert rest == list(range(400, 500))
                # (an event for two subscriptions of the connection: one row, acknowledged once
                # both took it; nothing left in custody)
                assert low.received == 300 and even.received == 500
                assert broker.stats()["in_custody"] == 0
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(go(), 60))


async def _first(sub: Subscription, n: int) -> AsyncIterator[dict[str, object]]:
    async for event in sub:
        yield event
        n -= 1
        if not n:
            return


def test_a_not_here_answer_may_name_the_broker_that_serves_the_subscription() -> None:
    from flowbus.client import protocol as p

    named = p.not_here(at="10.0.0.4:7000")
    assert named.startswith(p.NOT_HERE) and p.served_at(named) == "10.0.0.4:7000"
    assert p.served_at(p.not_here("the ring did not say within 5 s")) is None
    assert p.served_at(p.NOT_HERE) is None and p.not_here() == p.NOT_HERE
    assert p.served_at("refused: broker 10.0.0.4:7000 serves it") is None  # (not a "not here")
