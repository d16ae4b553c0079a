"""Silent brokers and unacknowledged publishes: a client leaves a broker it hears nothing from
for ``idle_timeout`` (after its ``Welcome``, or before it: a paused broker's kernel still
accepts connections) for the next one, where its subscription and publishes carry on; a live
broker's keepalives hold an idle client; a publish not acknowledged within
``publish_timeout`` is given up with a ``PublishError`` saying where the client was, and its
late acknowledgement is ignored. (Fake brokers on 127.0.0.1 speak just enough of the client
protocol; the healthy ones are real.)"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Callable
from typing import Any

import pytest

import flowbus
from flowbus.broker.config import DEFAULT
from flowbus.broker.server import Broker
from flowbus.client import ClientError, PublishError, Status
from flowbus.client import protocol as p
from flowbus.net.codec import FrameDecoder, decode, encode, frame

pytestmark = pytest.mark.broker


async def _eventually(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    assert cond()


class FakeBroker:
    """A server on 127.0.0.1 that answers ``Hello`` with ``Welcome`` (a schemaless
    ``events`` space), ``Subscribe`` with an ok ``Reply`` if ``replies``; keeps the pseqs of
    the publishes it gets and acknowledges them only while ``acking``; writes a ``Keepalive``
    every ``keepalive`` seconds (None: never). :meth:`pause` stops it reading and writing,
    as a SIGSTOP would (the connections stay open)."""

    def __init__(self, *, replies: bool = False, keepalive: float | None = None) -> None:
        self.replies = replies
        self.keepalive = keepalive
        self.acking = False
        self.paused = False
        self.published: list[int] = []
        self.writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self.address = ""

    async def start(self) -> FakeBroker:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    def pause(self) -> None:
        self.paused = True

    def send(self, *msgs: Any) -> None:
        """Write ``msgs`` to the last connection."""
        self.writers[-1].write(b"".join(frame(encode(m)) for m in msgs))

    async def close(self) -> None:
        self._closed.set()
        self.server.close()
        for writer in self.writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if self.keepalive is not None:
            task = asyncio.ensure_future(self._keepalives(writer, self.keepalive))
            self._tasks.add(task)
        frames = FrameDecoder()
        while not self.paused:
            data = await reader.read(1 << 16)
            if not data or self.paused:
                break
            for body in frames.feed(data):
                self._take(writer, decode(body))
        if self.paused:
            await self._closed.wait()  # (stopped: the connection stays, nothing moves)

    def _take(self, writer: asyncio.StreamWriter, msg: Any) -> None:
        out: list[Any] = []
        match msg:
            case p.Hello():
                out.append(p.Welcome(self.address, (), {"events": None}))
            case p.Subscribe() if self.replies:
                out.append(p.Reply(msg.req, True))
            case p.Publish():
                pseqs = [pseq for pseq, _, _ in msg.items()]
                self.published.extend(pseqs)
                if self.acking:
                    out.append(p.PubAck(p.pack_pubacks(pseqs)))
        if out:
            writer.write(b"".join(frame(encode(m)) for m in out))

    async def _keepalives(self, writer: asyncio.StreamWriter, every: float) -> None:
        while not self.paused and not writer.is_closing():
            writer.write(frame(encode(p.Keepalive())))
            await asyncio.sleep(every)


def test_a_broker_silent_after_welcome_is_left_for_the_next_where_subscription_and_publishes_go_on() -> None:
    async def go() -> None:
        fake = await FakeBroker(replies=True, keepalive=0.1).start()
        healthy = await Broker.start(config=DEFAULT.with_(keepalive=0.1))  # (heard within 1 s)
        try:
            await healthy.joined()
            async with flowbus.connect(
                fake.address, healthy.address, idle_timeout=1.0, resume_timeout=0.5
            ) as client:
                assert client.broker == fake.address
                sub = await client.subscribe("events", "x >= 0")
                for x in range(3):
                    await client.publish("events", {"x": x})
                await _eventually(lambda: fake.published == [1, 2, 3])
                fake.pause()  # (as a SIGSTOP: the connection stays open, nothing comes)
                await _eventually(
                    lambda: client.broker == healthy.address and client.status is Status.CONNECTED
                )
                assert client.reconnects >= 1 and client._last_error is not None
                assert f"{fake.address} sent nothing for 1 s" in client._last_error
                await client.publish("events", {"x": 3})
                got = [(await sub.get(10))["x"] for _ in range(4)]  # (the three sent again)
                assert got == [0, 1, 2, 3]
                await client.flush(10)
                assert list(client.pending) == []
        finally:
            await healthy.close()
            await fake.close()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_broker_whose_kernel_accepts_but_that_never_answers_hello_is_left() -> None:
    with socket.socket() as stopped:  # listening, never accepting: the kernel completes the
        stopped.bind(("127.0.0.1", 0))  # handshake of a SIGSTOPped broker's port the same way
        stopped.listen(64)
        address = f"127.0.0.1:{stopped.getsockname()[1]}"

        async def go() -> None:
            healthy = await Broker.start()
            try:
                await healthy.joined()
                async with flowbus.connect(address, healthy.address, idle_timeout=0.5) as client:
                    assert client.broker == healthy.address
                    assert client._last_error == f"{address} sent nothing for 0.5 s (idle_timeout)"
                    await client.publish("events", {"x": 1})
                    await client.flush(10)
            finally:
                await healthy.close()
            waits = flowbus.connect(address, idle_timeout=None, connect_timeout=1.0)
            with pytest.raises(ClientError, match="no broker answered") as e:
                await waits.open()  # (without an idle timeout: held until connect_timeout)
            assert "sent nothing" not in str(e.value)
            alone = flowbus.connect(address, idle_timeout=0.3, connect_timeout=2.0)
            with pytest.raises(ClientError, match=re.escape(f"{address} sent nothing for 0.3 s")):
                await alone.open()

        asyncio.run(asyncio.wait_for(go(), 60))


def test_keepalives_hold_an_idle_client_longer_than_its_idle_timeout() -> None:
    async def go() -> None:
        broker = await Broker.start(config=DEFAULT.with_(keepalive=0.1))
        try:
            await broker.joined()
            async with flowbus.connect(broker.address, idle_timeout=0.6) as client:
                host, port = broker.address.rsplit(":", 1)
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(frame(encode(p.Hello("raw"))))
                frames, got = FrameDecoder(), []
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.5):  # (what a raw connection gets in 1.5 s)
                        while True:
                            got += [decode(body) for body in frames.feed(await reader.read(1 << 16))]
                writer.close()
                assert isinstance(got[0], p.Welcome)
                assert all(isinstance(m, p.Keepalive) for m in got[1:]) and len(got[1:]) >= 3
                # the client was idle for 1.5 s with an idle timeout of 0.6 s: the keepalives held it
                assert client.status is Status.CONNECTED and client.reconnects == 0
                sub = await client.subscribe("events", "x > 0")
                await client.publish("events", {"x": 1})
                assert (await sub.get(10)) == {"x": 1}
        finally:
            await broker.close()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_publish_not_acknowledged_in_time_is_given_up_and_its_late_acknowledgement_ignored() -> None:
    async def go() -> None:
        fake = await FakeBroker(keepalive=0.1).start()
        try:
            async with flowbus.connect(fake.address, idle_timeout=1.0, publish_timeout=0.3) as client:
                assert [await client.publish("events", {"x": x}) for x in range(3)] == [1, 2, 3]
                assert list(client.pending) == [1, 2, 3]
                connected = rf"connected to {re.escape(fake.address)} since \d+\.\d s"
                for pseq in (1, 2, 3):  # (flush without a timeout: bounded by publish_timeout)
                    with pytest.raises(PublishError) as e:
                        await asyncio.wait_for(client.flush(), 10)
                    assert e.value.pseq == pseq
                    assert re.fullmatch(rf"not acknowledged within 0\.3 s \({connected}\)", e.value.reason)
                    assert list(client.pending) == []
                await client.flush()  # (all reported)
                assert fake.published == [1, 2, 3]  # (sent, never acknowledged)
                fake.send(p.PubAck(p.pack_pubacks([1, 2, 3])), p.Nack(2, "too late"))  # ignored
                fake.acking = True
                assert await client.publish("events", {"x": 3}) == 4
                await asyncio.wait_for(client.flush(), 10)  # (the late Nack raised nothing)
                assert list(client.pending) == [] and fake.published == [1, 2, 3, 4]
                await fake.close()  # the only broker goes: nobody to publish to
                await _eventually(lambda: client.status is Status.CONNECTING)
                assert await client.publish("events", {"x": 4}) == 5
                with pytest.raises(PublishError) as e:
                    await asyncio.wait_for(client.flush(), 10)
                assert e.value.pseq == 5 and list(client.pending) == []
                unreachable = rf"no broker reachable for \d+\.\d s: last error {re.escape(fake.address)}: .+"
                assert re.fullmatch(rf"not acknowledged within 0\.3 s \({unreachable}\)", e.value.reason)
        finally:
            await fake.close()

    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("option", ["idle_timeout", "publish_timeout"])
@pytest.mark.parametrize("bad", [0, -1.0, True, "5", float("nan")])
def test_timeouts_are_seconds_over_0_or_none(option: str, bad: Any) -> None:
    def options(value: Any) -> dict[str, Any]:
        return {option: value}

    with pytest.raises(ClientError, match=f"{option}: seconds > 0 or None, got"):
        flowbus.connect("127.0.0.1:7001", **options(bad))
    assert getattr(flowbus.connect("127.0.0.1:7001", **options(None)), option) is None
    assert getattr(flowbus.connect("127.0.0.1:7001", **options(2.5)), option) == 2.5
