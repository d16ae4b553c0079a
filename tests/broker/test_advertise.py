"""``advertise``: a broker listening on one address and known (in the ring, to clients) by
another, where a forwarder to it listens; a bad advertised address is refused by name."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import pytest

import flowbus
from flowbus.broker.server import Broker
from flowbus.errors import ConfigError
from flowbus.net.runtime import addr_of

pytestmark = pytest.mark.broker


class Forwarder:
    """A plain TCP forwarder on 127.0.0.1 (port 0) to ``target``, set once it is known."""

    def __init__(self) -> None:
        self.target: tuple[str, int] | None = None
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.target is not None
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(1 << 16):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


def test_a_broker_is_known_by_its_advertised_address() -> None:
    async def main() -> None:
        forwarder = Forwarder()
        port = await forwarder.start()
        b = await Broker.start(host="127.0.0.1", port=0, advertise=f"127.0.0.1:{port}")
        try:
            await b.joined()
            forwarder.target = ("127.0.0.1", b.port)
            assert b.port != port
            assert b.address == f"127.0.0.1:{port}"
            assert b.addr == addr_of("127.0.0.1", port)
            async with flowbus.connect(f"127.0.0.1:{port}") as c:
                assert c.broker == f"127.0.0.1:{port}"  # (the Welcome names the advertised address)
                sub = await c.subscribe("stocks", "level >= 1")
                event = {"symbol": "IBM", "price": 1.0, "quantity": 7, "exchange": "NYSE", "level": 1}
                await c.publish("stocks", event)
                assert await sub.get(10) == event
                await asyncio.wait_for(c.flush(), 10)
            assert forwarder.connections >= 1
        finally:
            await b.close()
            await forwarder.close()

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("bad", ["nowhere", "127.0.0.1:0", "127.0.0.1:70000", "no.such.host.invalid:7000"])
def test_a_bad_advertised_address_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigError, match="--advertise"):
        asyncio.run(Broker.start(advertise=bad))


def test_broker_start_refuses_a_bad_advertise() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flowbus", "broker", "start", "--advertise", "127.0.0.1:x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--advertise" in done.stderr
