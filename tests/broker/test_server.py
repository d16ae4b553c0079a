"""Brokers and clients on loopback, in one process: publish/subscribe in a space and across a
ring, bad input refused with a named error and no change, flow control by spilling to SQLite,
durable subscriptions, the synchronous client."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

import flowbus
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.server import Broker
from flowbus.client import ClientError, PublishError, SubscribeError
from flowbus.client import protocol as p
from flowbus.errors import ConfigError, SchemaError
from flowbus.net.codec import FrameDecoder, decode, encode, frame

pytestmark = pytest.mark.broker


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


@asynccontextmanager
async def ring(
    n: int = 1, config: BrokerConfig = DEFAULT, data: Path | None = None, overlay: str = "chordal-ring"
) -> AsyncIterator[list[Broker]]:
    brokers: list[Broker] = []
    try:
        for i in range(n):
            join = [brokers[0].address] if i else []
            where = data / f"b{i}" if data else None
            b = await Broker.start(join=join, config=config, data=where, overlay=overlay)
            brokers.append(b)
            await b.joined()
        if n > 1:
            await eventually(lambda: _settled(brokers, overlay))
        yield brokers
    finally:
        for b in brokers:
            await b.close()


def _settled(brokers: list[Broker], overlay: str) -> bool:
    """Every broker links to every other (the ring's tree: the two ends to one)."""
    if overlay == "pastry-irbr":
        return all(len(b.peers()) == len(brokers) - 1 for b in brokers)
    ends = [b.core.router.neighbours for b in brokers]  # type: ignore[attr-defined]
    return sorted(len(x) for x in ends) == [1, 1] + [2] * (len(brokers) - 2)


async def eventually(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    assert cond()


def trade(i: int, symbol: str = "IBM", price: float = 100.0) -> dict[str, Any]:
    return {"symbol": symbol, "price": price, "quantity": i, "exchange": "NYSE", "level": i % 10}


async def take(sub: flowbus.client.Subscription, n: int) -> list[dict[str, Any]]:
    return [await sub.get(10) for _ in range(n)]


def test_publish_subscribe_in_a_space() -> None:
    async def main() -> None:
        async with ring() as (b,), flowbus.connect(b.address) as c:
            sub = await c.subscribe("stocks", 'symbol = "IBM" & price > 100')
            for i in range(6):
                await c.publish("stocks", trade(i, "IBM" if i % 2 else "HPQ", 98.0 + i))
            got = await take(sub, 2)
            await c.flush(10)
            assert [e["quantity"] for e in got] == [3, 5]
            assert got[0] == trade(3, "IBM", 101.0)
            assert b.stats()["in_custody"] == 0

    run(main())


def test_spaces_are_separate() -> None:
    async def main() -> None:
        async with ring() as (b,), flowbus.connect(b.address) as c:
            a = await c.subscribe("events", "x > 1")
            s = await c.subscribe("stocks", "quantity > 1")
            await c.publish("events", {"x": 5, "quantity": 5})
            await c.publish("stocks", trade(7))
            assert (await a.get(10)) == {"x": 5, "quantity": 5}
            assert (await s.get(10))["quantity"] == 7
            await c.flush(10)
            with pytest.raises(asyncio.TimeoutError):
                await a.get(0.2)

    run(main())


def test_bad_input_is_refused_by_name_and_changes_nothing() -> None:
    async def main() -> None:
        async with ring() as (b,), flowbus.connect(b.address) as c, flowbus.connect(b.address) as other:
            good = await other.subscribe("stocks", "price > 0")
            before = b.stats()
            cases = [
                ("nope", "price > 1", "unknown space 'nope'"),
                ("stocks", "price >", "filter: unexpected end of filter at line 1, column 8"),
                ("stocks", "colour = 1", "unknown field 'colour'"),
                ("stocks", 'symbol = "A" & (', "filter:"),
            ]
            for space, text, message in cases:
                with pytest.raises(SubscribeError, match=message.replace("(", r"\(")):
                    await c.subscribe(space, text)
            with pytest.raises(SubscribeError, match="unknown collapse rule set 'last'"):
                await c.subscribe("stocks", "price > 1", collapse="last")
            with pytest.raises(SchemaError, match="field 'price' must be float"):
                await c.publish("stocks", {**trade(1), "price": "high"})
            with pytest.raises(ClientError, match="unknown space 'nope'"):
                await c.publish("nope", {"x": 1})
            c.spaces = {}  # skip the client's own checks: the broker checks too
            await c.publish("stocks", {"symbol": "IBM"})
            with pytest.raises(PublishError, match="field 'price' is missing"):
                await c.flush(10)
            after = b.stats()
            assert after["subscriptions"] == before["subscriptions"] == 1
            assert after["published"] == before["published"] == 0
            await other.publish("stocks", trade(1))
            assert (await good.get(10))["quantity"] == 1
            await other.flush(10)

    run(main())


def _unchecked(cls: type[Any], *values: Any) -> Any:
    """A message made without its own checks (what a broken client could send)."""
    msg = object.__new__(cls)
    for name, value in zip(cls.__dataclass_fields__, values, strict=False):
        object.__setattr__(msg, name, value)
    for name, f in cls.__dataclass_fields__.items():
        if not hasattr(msg, name):
            object.__setattr__(msg, name, f.default)
    return msg


@pytest.mark.parametrize(
    ("junk", "what"),
    [
        (b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", "malformed"),  # msgpack's one reserved byte
        (struct.pack(">I", 1 << 30), "over the limit"),  # a frame far over the size limit
        (frame(encode(p.Events(p.pack_events([])))), "may not send Events"),  # a message only brokers send
        (frame(encode(p.Ack(msgpack.packb([1, 2, 3])))), "Ack: each item is [first, last]"),
        (frame(encode(_unchecked(p.SubscribeMany, 1, "stocks", ("a", "b"), ("x > 1",)))), "2 sub_ids for 1"),
    ],
    ids=["malformed", "oversized", "wrong-direction", "bad-ack", "bad-bulk"],
)
def test_bad_frames_close_only_that_connection(junk: bytes, what: str) -> None:
    async def main() -> None:
        async with ring() as (b,), flowbus.connect(b.address) as c:
            sub = await c.subscribe("stocks", "price > 0")
            reader, writer = await asyncio.open_connection(b.host, b.port)
            writer.write(frame(encode(p.Hello("raw"))))
            frames = FrameDecoder()
            got: list[Any] = []
            while not got:
                got = [decode(body) for body in frames.feed(await reader.read(1 << 16))]
            assert isinstance(got[0], p.Welcome)
            writer.write(junk)
            data = await asyncio.wait_for(reader.read(), 10)  # up to EOF: the broker closed it
            writer.close()
            (error,) = [m for m in map(decode, frames.feed(data)) if not isinstance(m, p.Keepalive)]
            assert isinstance(error, p.Error) and what in error.what
            assert b.stats()["subscriptions"] == 1
            await c.publish("stocks", trade(2))
            assert (await sub.get(10))["quantity"] == 2

    run(main())


def test_a_slow_subscriber_spills_to_disk_in_order(tmp_path: Path) -> None:
    config = DEFAULT.with_(window=10, memory=50)

    async def main() -> None:
        async with (
            ring(config=config, data=tmp_path) as (b,),
            flowbus.connect(b.address) as slow,
            flowbus.connect(b.address) as pub,
        ):
            sub = await slow.subscribe("stocks", 'symbol = "IBM"')
            for i in range(500):
                await pub.publish("stocks", trade(i))
            while b.stats()["spilled"] < 450:  # nobody reads: past window + memory, on disk
                await asyncio.sleep(0.02)
            assert b.stats()["queued_in_memory"] == 50
            await eventually(lambda: pub.unacknowledged == 50)  # those on disk are acknowledged
            got = await take(sub, 500)
            await pub.flush(20)
            assert [e["quantity"] for e in got] == list(range(500))
            assert b.store is not None and b.store.depth(sub.id) <= 10

    run(main())


def test_durable_subscription_waits_for_its_client() -> None:
    async def main() -> None:
        async with ring() as (b,):
            async with flowbus.connect(b.address, name="reader") as c:
                await c.subscribe("stocks", "quantity >= 10", durable="audit")
                await c.subscribe("stocks", "quantity >= 10")  # not durable: ends with the client
            await eventually(lambda: b.stats()["subscriptions"] == 1)
            async with flowbus.connect(b.address) as pub:
                for i in range(20):
                    await pub.publish("stocks", trade(i))
                async with flowbus.connect(b.address, name="reader") as c:
                    sub = await c.subscribe("stocks", "quantity >= 10", durable="audit")
                    got = await take(sub, 10)
                    await pub.flush(10)
            assert [e["quantity"] for e in got] == list(range(10, 20))

    run(main())


@pytest.mark.parametrize("overlay", ["chordal-ring", "pastry-irbr"])
def test_a_ring_routes_between_brokers(overlay: str) -> None:
    async def main() -> None:
        async with ring(3, overlay=overlay) as brokers:
            clients = [flowbus.connect(b.address) for b in brokers]
            for c in clients:
                await c.open()
            try:
                subs = [await c.subscribe("stocks", f"level = {i}") for i, c in enumerate(clients)]
                await asyncio.sleep(0.3)  # the subscriptions travel the ring
                for i in range(30):
                    await clients[i % 3].publish("stocks", trade(i))
                for i, sub in enumerate(subs):
                    got = await take(sub, 3)
                    assert sorted(e["quantity"] for e in got) == [i, i + 10, i + 20]  # one per publisher
                for c in clients:
                    await c.flush(10)
                assert all(b.stats()["in_custody"] == 0 for b in brokers)
            finally:
                for c in clients:
                    await c.close()

    run(main())


def _forwarded(brokers: list[Broker]) -> list[str]:
    """The filters every broker holds from its neighbours (not its own subscriptions)."""
    out = []
    for b in brokers:
        tables, _ = b.core.router.routing_state()  # type: ignore[attr-defined]
        out += [f.to_text() for d, t in tables.items() if d != b.addr for f in t.values()]
    return out


@pytest.mark.parametrize("advertising", [False, True])
def test_advertisements_prune_subscription_forwarding(advertising: bool) -> None:
    """With ``advertising`` on, a subscription travels only towards a broker whose
    advertisements overlap it: the one subscription an advertised publisher can match is
    forwarded, the two others stay at their broker; events flow as before, and a publish no
    advertisement of its client matches is refused."""

    async def main() -> None:
        async with ring(3, config=DEFAULT.with_(advertising=advertising)) as brokers:
            pub = flowbus.connect(brokers[0].address, name="publisher")
            subscriber = flowbus.connect(brokers[2].address, name="subscriber")
            await pub.open()
            await subscriber.open()
            try:
                if advertising:
                    await pub.advertise("stocks", 'symbol = "IBM"', name="ibm")
                ibm = await subscriber.subscribe("stocks", 'symbol = "IBM" & price > 100')
                await subscriber.subscribe("stocks", 'symbol = "HPQ"')
                await subscriber.subscribe("events", "x > 1")
                await eventually(lambda: any('"IBM"' in f for f in _forwarded(brokers)))
                await asyncio.sleep(0.3)  # (the others would have travelled by now)
                forwarded = _forwarded(brokers)
                if advertising:
                    assert forwarded and all('"IBM"' in f for f in forwarded)
                else:
                    assert any('"HPQ"' in f for f in forwarded) and any("x > 1" in f for f in forwarded)
                for i in range(4):
                    await pub.publish("stocks", trade(i, "IBM", 99.0 + i))
                assert [e["quantity"] for e in await take(ibm, 2)] == [2, 3]
                await pub.flush(10)  # (acknowledged once the subscriber took them)
                if advertising:
                    await pub.publish("stocks", trade(9, "HPQ"))
                    with pytest.raises(PublishError, match="no advertisement of this client"):
                        await pub.flush(10)
                    await pub.unadvertise("ibm")
                    await eventually(lambda: not _forwarded(brokers))  # withdrawn with it
                else:
                    with pytest.raises(ClientError, match="advertising is off"):
                        await pub.advertise("stocks", 'symbol = "IBM"')
            finally:
                await pub.close()
                await subscriber.close()

    run(main())


def test_sync_client() -> None:
    async def serve(ready: asyncio.Future[str], stop: asyncio.Event) -> None:
        async with ring() as (b,):
            ready.set_result(b.address)
            await stop.wait()

    import queue
    import threading

    loop = asyncio.new_event_loop()
    ready: asyncio.Future[str] = loop.create_future()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(ready, stop),))
    thread.start()
    try:
        address = asyncio.run_coroutine_threadsafe(_wait(ready), loop).result(10)
        with flowbus.SyncClient(address) as c:
            sub = c.subscribe("stocks", "price > 10")
            c.publish("stocks", trade(4))
            assert sub.get(timeout=10)["quantity"] == 4
            c.flush(10)
            with pytest.raises(queue.Empty):
                sub.get(timeout=0.2)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


async def _wait(fut: asyncio.Future[str]) -> str:
    return await fut


def test_connect_errors() -> None:
    with pytest.raises(ClientError, match="HOST:PORT"):
        flowbus.connect("localhost")
    with pytest.raises(ClientError, match="at least one"):
        flowbus.connect()

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with pytest.raises(ClientError, match="no broker answered"):
            await flowbus.connect(f"127.0.0.1:{port}", connect_timeout=0.5).open()

    run(main())


def test_a_collapse_subscription_catches_up_with_the_shortest_sequence() -> None:
    rules = {
        "max_cur": {
            "key": {"symbol": "symbol"},
            "rules": [
                {"when": "price > maxP", "set": {"maxP": "price", "curP": "price"}},
                {"set": {"curP": "price"}},
            ],
        }
    }
    config = DEFAULT.with_(rulesets=rules)

    async def main() -> None:
        async with ring(config=config) as (b,), flowbus.connect(b.address) as pub:
            async with flowbus.connect(b.address, name="viewer") as c:
                sub = await c.subscribe("stocks", "price > 0", durable="board", collapse="max_cur")
                for i, price in enumerate([160.0, 140.0]):
                    await pub.publish("stocks", trade(i, "IBM", price))
                seen = await take(sub, 2)
            prices = [
                ("IBM", 150),
                ("HPQ", 30),
                ("IBM", 200),
                ("HPQ", 35),
                ("IBM", 180),
                ("IBM", 120),
                ("HPQ", 31),
            ]
            backlog = [trade(10 + i, s, float(p)) for i, (s, p) in enumerate(prices)]
            for e in backlog:
                await pub.publish("stocks", e)
            await pub.flush(10)  # the absent subscriber's events wait on disk
            async with flowbus.connect(b.address, name="viewer") as c:
                sub = await c.subscribe("stocks", "price > 0", durable="board", collapse="max_cur")
                got = await take(sub, 4)  # per symbol: the new maximum, then the current price
                with pytest.raises(asyncio.TimeoutError):
                    await sub.get(0.3)
            interp = b.spaces.interpretation("max_cur", "stocks")
            start = interp.fold(None, seen)
            assert interp.fold(start, got) == interp.fold(start, backlog)
            by_symbol = {s: [e["price"] for e in got if e["symbol"] == s] for s in ("IBM", "HPQ")}
            assert by_symbol == {"IBM": [200.0, 120.0], "HPQ": [35.0, 31.0]}

    run(main())


def test_start_refuses_bad_options_by_name() -> None:
    async def main() -> None:
        with pytest.raises(ConfigError, match="unknown overlay 'mesh'"):
            await Broker.start(overlay="mesh")
        with pytest.raises(ConfigError, match="an address is HOST:PORT, got 'nowhere'"):
            await Broker.start(join=["nowhere"])
        with pytest.raises(ConfigError, match="advertising: the pastry-irbr overlay has no advertisements"):
            await Broker.start(overlay="pastry-irbr", config=DEFAULT.with_(advertising=True))

    run(main())


def test_pastry_irbr_brokers_acknowledge_every_range_message() -> None:
    """IRBR's hop-by-hop acknowledgements run between brokers over TCP: every range message a
    broker sends is acknowledged, none times out, none is left waiting."""

    async def main() -> None:
        async with ring(3, overlay="pastry-irbr") as brokers:
            clients = [flowbus.connect(b.address) for b in brokers]
            for c in clients:
                await c.open()
            try:
                subs = [await c.subscribe("stocks", f"level = {i}") for i, c in enumerate(clients[1:], 1)]
                await asyncio.sleep(0.3)  # the subscriptions travel
                for i in range(10):
                    await clients[0].publish("stocks", trade(i))
                for i, sub in enumerate(subs, 1):
                    assert sorted(e["quantity"] for e in await take(sub, 1)) == [i]
                acks = [b.core.node.acks for b in brokers]  # type: ignore[attr-defined]
                await eventually(lambda: all(len(a) == 0 for a in acks))
                assert sum(a.acked for a in acks) > 0 and sum(a.expired for a in acks) == 0
            finally:
                for c in clients:
                    await c.close()

    run(main())
