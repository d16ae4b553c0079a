"""Client sessions without sockets: what one turn of the event loop has for a client goes out
in one write; a message a client may not send closes only its connection; ``Bye`` ends the
client's non-durable subscriptions and withdraws its advertisements."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.broker.fakes import FakeCore, Writer, apply

from flowbus.broker.adverts import Adverts
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.flows import BrokerFlows
from flowbus.broker.ledger import Ledger
from flowbus.broker.queues import Flight, Queues, SubQueue
from flowbus.broker.sessions import Session, Sessions
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.errors import ConfigError
from flowbus.net.codec import FrameDecoder, decode, encode, frame

WELCOME = p.Welcome("127.0.0.1:1", (), {})


def written(writer: Writer) -> list[Any]:
    return [decode(body) for body in FrameDecoder().feed(b"".join(writer.writes))]


def sessions() -> tuple[Sessions, FakeCore]:
    core, store, spaces = FakeCore(), Store(":memory:"), Spaces(DEFAULT.with_(advertising=True))
    adverts = Adverts(core=core, apply=apply, spaces=spaces, enabled=True)
    ledger = Ledger(core=core, apply=apply, store=store, spaces=spaces, adverts=adverts)
    queues = Queues(core=core, apply=apply, store=store, spaces=spaces, config=DEFAULT)
    flows = BrokerFlows(core=None, overlay="test", apply=apply, store=store, own_spaces=())
    sessions = Sessions(welcome=lambda: WELCOME, ledger=ledger, queues=queues, adverts=adverts, flows=flows)
    return sessions, core


async def serve(server: Sessions, client: str, msgs: list[Any]) -> list[Any]:
    """A connection of ``client`` that sends ``msgs`` and closes; what it was sent."""
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_eof()
    await server.serve(p.Hello(client), reader, writer, [encode(m) for m in msgs], FrameDecoder())
    assert writer.closed
    return written(writer)


def test_a_turn_of_the_loop_goes_out_in_one_write() -> None:
    async def main() -> None:
        writer = Writer()
        session = Session("c", writer)
        session.send(p.Reply(1, True))
        session.pub_ack(1)
        session.pub_ack(2)
        sub = SubQueue("s", "c", "events", "x > 0", False, None)
        Flight().deliver(session, sub, [(("p", n), {"x": n}, None) for n in range(1, 2501)])
        assert writer.writes == []
        await asyncio.sleep(0)
        assert len(writer.writes) == 1
        reply, acks, first, second = written(writer)
        assert reply == p.Reply(1, True) and acks.pseqs == [1, 2]
        assert [len(first.items()), len(second.items())] == [2000, 500]
        assert second.items()[-1] == (["s"], 2500, ("p", 2500), {"x": 2500})

    asyncio.run(main())


def test_a_message_a_client_may_not_send_closes_only_its_connection() -> None:
    async def main() -> None:
        server, _ = sessions()
        got = await serve(server, "c", [p.Subscribe(1, "s", "events", "x > 1"), p.Events(p.pack_events([]))])
        assert got == [WELCOME, p.Reply(1, True), p.Error("a client may not send Events")]
        assert server.by_client == {}
        assert set(server.queues.subs) == {"s"}  # (the connection was lost: it lingers)
        assert await serve(server, "c", [p.Subscribe(2, "s", "events", "x > 1", resume=True)]) == [
            WELCOME,
            p.Reply(2, True),
        ]
        server.queues.close()

    asyncio.run(main())


def test_bye_ends_the_clients_subscriptions_and_advertisements() -> None:
    async def main() -> None:
        server, core = sessions()
        msgs = [
            p.Advertise(1, "ibm", "stocks", 'symbol = "IBM"'),
            p.Subscribe(2, "s", "events", "x > 1"),
            p.Subscribe(3, "d", "events", "x > 1", durable=True),
            p.Bye(),
        ]
        assert await serve(server, "c", msgs) == [
            WELCOME,
            p.Reply(1, True),
            p.Reply(2, True),
            p.Reply(3, True),
        ]
        assert set(server.queues.subs) == {"d"}
        assert core.called("unadvertise") == [("c/ibm",)] and core.called("unsubscribe") == [("s",)]

    asyncio.run(main())


def test_a_publishing_connection_is_read_once_a_step_interval_a_quiet_one_or_a_requester_at_once() -> None:
    def publish(pseq: int) -> bytes:
        return frame(encode(p.Publish("events", p.pack_publish([(pseq, {"x": pseq})]))))

    async def turns() -> None:  # the loop turns, no time passes
        for _ in range(10):
            await asyncio.sleep(0)

    async def main() -> None:
        server, core = sessions()
        server.step_interval = 0.4
        reader, writer = asyncio.StreamReader(), Writer()
        advertise = encode(p.Advertise(1, "all", "events", "x > 0"))
        task = asyncio.create_task(server.serve(p.Hello("c"), reader, writer, [advertise], FrameDecoder()))
        await turns()
        reader.feed_data(publish(1))  # the connection was quiet: taken at once
        await turns()
        assert [len(c[1]) for c in core.calls if c[0] == "publish"] == [1]
        for pseq in range(2, 7):  # a stream: waits for the interval, then one step
            reader.feed_data(publish(pseq))
            await turns()
        assert [len(c[1]) for c in core.calls if c[0] == "publish"] == [1]
        await asyncio.sleep(0.6)
        assert [len(c[1]) for c in core.calls if c[0] == "publish"] == [1, 5]
        await asyncio.sleep(0.5)  # quiet for longer than the interval
        reader.feed_data(publish(7))
        await turns()
        assert [len(c[1]) for c in core.calls if c[0] == "publish"] == [1, 5, 1]
        reader.feed_eof()
        await task
        other, writer = asyncio.StreamReader(), Writer()  # no publishes: never held back
        task = asyncio.create_task(server.serve(p.Hello("d"), other, writer, [], FrameDecoder()))
        for req in (1, 2):
            other.feed_data(frame(encode(p.Advertise(req, f"a{req}", "events", "x > 0"))))
            await turns()
        assert [m.req for m in written(writer) if isinstance(m, p.Reply)] == [1, 2]
        other.feed_eof()
        await task
        server.queues.close()

    asyncio.run(main())


def test_step_interval_is_seconds_from_0_to_1() -> None:
    assert BrokerConfig.from_mapping({"step_interval": 0}).step_interval == 0
    assert DEFAULT.step_interval == 0.005
    for bad in (-0.1, 2, "5ms", True):
        with pytest.raises(ConfigError, match="step_interval"):
            BrokerConfig.from_mapping({"step_interval": bad})


def test_a_keepalive_tick_writes_keepalive_only_to_the_sessions_idle_since_the_last_tick() -> None:
    async def turns() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    async def main() -> None:
        server, _ = sessions()
        server.keepalive = 3600.0  # (the ticks are called below, one by one)
        readers = {c: asyncio.StreamReader() for c in "ab"}
        writers = {c: Writer() for c in "ab"}
        tasks = [
            asyncio.create_task(server.serve(p.Hello(c), readers[c], writers[c], [], FrameDecoder()))
            for c in "ab"
        ]
        await turns()
        assert server._tick is not None  # (one timer for all the sessions)
        server._keepalive()  # both wrote their Welcome since the start: nothing
        readers["a"].feed_data(frame(encode(p.Subscribe(1, "s", "events", "x > 1"))))
        await turns()
        server._keepalive()  # a wrote its Reply: nothing; b idle: a keepalive
        server._keepalive()  # both idle since the last tick (a keepalive is no news)
        assert written(writers["a"]) == [WELCOME, p.Reply(1, True), p.Keepalive()]
        assert written(writers["b"]) == [WELCOME, p.Keepalive(), p.Keepalive()]
        for c in "ab":
            readers[c].feed_eof()
        await asyncio.gather(*tasks)
        server._keepalive()  # no session left: the timer stops
        assert server._tick is None
        server.queues.close()
        server.close()

    asyncio.run(main())


def test_keepalive_is_seconds_over_0() -> None:
    assert BrokerConfig.from_mapping({"keepalive": 0.25}).keepalive == 0.25
    assert DEFAULT.keepalive == 1.0
    for bad in (0, -1, "1s", True, None):
        with pytest.raises(ConfigError, match="keepalive: seconds > 0"):
            BrokerConfig.from_mapping({"keepalive": bad})
