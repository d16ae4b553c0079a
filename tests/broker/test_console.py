"""The broker's web console over real sockets, in process (broker/console.py, metrics.py,
status.py, pages.py): every page answers, /metrics is the Prometheus text format of this
broker's own registry and its counts follow the traffic, and bad HTTP -- garbage, huge
headers, bodies, unknown paths and methods, silent and slow clients, too many connections --
gets an answer or a closed connection while every delivery still arrives."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.broker.test_server import eventually, ring, run

import flowbus
from flowbus.broker import console as console_module
from flowbus.broker.console import Console
from flowbus.broker.server import Broker
from flowbus.errors import ConfigError
from flowbus.flow.deploy import Deployment

pytestmark = pytest.mark.broker

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"


async def _http(console: Console, raw: bytes, *, read_for: float = 5.0) -> bytes:
    """Send ``raw`` to the console; what it answers until it closes the connection."""
    reader, writer = await asyncio.open_connection(console.host, console.port)
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), read_for)
    except ConnectionResetError:  # (closed with our request unread)
        return b""
    finally:
        writer.close()


async def _get(console: Console, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    raw = await _http(console, f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _console_of(b: Broker) -> Console:
    assert b.console is not None
    return b.console


def test_pages_metrics_and_counts_on_a_ring_of_two_in_one_process() -> None:
    async def main() -> None:
        async with ring(1) as (b0,):
            b1 = await Broker.start(join=[b0.address], http="127.0.0.1:0")
            b2 = await Broker.start(join=[b0.address], http="127.0.0.1:0")  # (two registries, one process)
            try:
                await b1.joined()
                await b2.joined()
                c1, c2 = await _console_of(b1), await _console_of(b2)
                assert c1.url == f"http://127.0.0.1:{c1.port}/"
                async with flowbus.connect(b1.address) as c:
                    await c.deploy(STOCKS)
                    await eventually(
                        lambda: "stocks" in b2.flows.list()[0]["name"] if b2.flows.list() else False
                    )
                    sub = await c.subscribe("big_trades", "cap > 0")
                    events = [
                        ("NYSE", {"issue": "IBM", "price": 200.0, "vol": 10_000 + i}) for i in range(40)
                    ]
                    for space, event in events:
                        await c.publish(space, event)
                    got = [await sub.get(10) for _ in events]
                    await c.flush(10)
                    assert len(got) == 40
                    await _check_pages(c1, b1)
                    status, headers, body = await _get(c1, "/metrics")
                    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
                    m = _metrics(body.decode())
                    assert m[("flowbus_events_in_total", (("space", "NYSE"),))] == 40
                    assert m[("flowbus_deliveries_total", (("space", "big_trades"),))] == 40
                    assert m[("flowbus_events_out_total", (("space", "big_trades"),))] == 40
                    assert m[("flowbus_subscriptions", (("space", "big_trades"),))] == 1
                    assert m[("flowbus_publish_latency_seconds_count", (("space", "NYSE"),))] == 40
                    assert m[("flowbus_ring_links", ())] == 2 and m[("flowbus_ring_changes_total", ())] >= 1
                    other = _metrics((await _get(c2, "/metrics"))[2].decode())
                    assert ("flowbus_events_in_total", (("space", "NYSE"),)) not in other
                    state = json.loads((await _get(c1, "/api/state"))[2])
                    big = next(s for s in state["spaces"] if s["name"] == "big_trades")
                    assert (big["flow"], big["kind"], big["deliveries"]) == ("stocks", "sink", 40)
                    assert big["subscriptions"][0]["filter"] == "cap > 0"
                    arcs = state["arcs"]["stocks"]  # (what the subscriber's broker saw as the edge)
                    assert arcs["NYSE->big_trades"] == arcs["T1"] == arcs["T3"] == arcs["S"] == 40
                    assert {x["address"] for x in state["ring"]["brokers"]} == {
                        b0.address,
                        b1.address,
                        b2.address,
                    }
            finally:
                await b2.close()
                await b1.close()

    run(main())


async def _check_pages(c: Console, b: Broker) -> None:
    version = Deployment.from_file(STOCKS).version
    for path, seen in [
        ("/", ['href="/flows/stocks"', 'data-stat="published"']),
        ("/flows/stocks", [version, 'data-space="max_cur"', 'class="arc arc-route"', "<script>"]),
        ("/ring", [b.address, "this broker"]),
        ("/spaces", ['data-space-stat="big_trades|deliveries"', "cap &gt; 0"]),
    ]:
        status, headers, body = await _get(c, path)
        assert status == 200 and headers["content-type"] == "text/html; charset=utf-8", path
        page = body.decode()
        for text in seen:
            assert text in page, (path, text)
        assert "http://" not in page.replace("http://www.w3.org/2000/svg", ""), (
            path
        )  # (nothing from elsewhere)
    assert (await _get(c, "/flows/nothing"))[0] == 404
    assert (await _get(c, "/nowhere"))[0] == 404
    status, headers, body = await _get(c, "/", "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert (await _get(c, "/", "DELETE"))[0] == 405


def test_bad_requests_while_events_flow_leave_the_broker_and_every_delivery_alone(monkeypatch: Any) -> None:
    monkeypatch.setattr(console_module, "IDLE", 0.5)
    monkeypatch.setattr(console_module, "REQUEST_TIME", 1.0)
    n = 3000

    async def main() -> None:
        b = await Broker.start(http="127.0.0.1:0")
        try:
            await b.joined()
            c = await _console_of(b)
            async with (
                flowbus.connect(b.address, name="pub") as pub,
                flowbus.connect(b.address, name="sub") as s,
            ):
                sub = await s.subscribe("stocks", "price > 0")

                async def publish() -> None:
                    for i in range(n):
                        await pub.publish("stocks", {"symbol": "IBM", "price": 1.0 + i, "quantity": i,
                                                     "exchange": "X", "level": 1})  # fmt: skip
                        if i % 100 == 0:
                            await asyncio.sleep(0.01)
                    await pub.flush(30)

                async def take() -> list[int]:
                    return [(await sub.get(20))["quantity"] for _ in range(n)]

                flowing = asyncio.gather(publish(), take())
                answers = await asyncio.gather(*(_abuse(c) for _ in range(3)))
                _, got = await flowing
                assert got == list(range(n))  # every delivery, in order, once
                for a in answers:
                    assert a["garbage"].startswith(b"HTTP/1.1 400")
                    assert a["huge"].startswith(b"HTTP/1.1 431")
                    assert a["body"].startswith(b"HTTP/1.1 405") and a["body"].count(b"HTTP/1.1") == 1
                    assert a["silent"] == b"" and a["slow"] == b""
                    assert a["pipelined"].count(b"HTTP/1.1 200") == 2
                    assert a["unknown"].startswith(b"HTTP/1.1 404")
                assert (await _get(c, "/metrics"))[0] == 200  # the console still serves
        finally:
            await b.close()

    run(main())


async def _slow(c: Console) -> bytes:
    """A request line sent a byte every 0.3 s: closed once the request has taken a second."""
    reader, writer = await asyncio.open_connection(c.host, c.port)
    try:
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\n":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.3)
            if reader.at_eof():
                break
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def _abuse(c: Console) -> dict[str, bytes]:
    huge = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Junk: " + b"a" * 40_000 + b"\r\n\r\n"
    body = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" + b"GET / HTTP/1.1\r\n\r\n"
    pipelined = (
        b"GET /ring HTTP/1.1\r\nHost: x\r\n\r\nGET /spaces HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    return {
        "garbage": await _http(c, b"\x16\x03\x01\x02\x00garbage\r\n\r\n"),
        "huge": await _http(c, huge),
        "body": await _http(c, body),
        "silent": await _http(c, b""),
        "slow": await _slow(c),
        "pipelined": await _http(c, pipelined),
        "unknown": await _http(
            c, b"GET /%00/../etc/passwd?x=%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ),
    }


def test_connections_beyond_the_limit_are_closed_at_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(console_module, "MAX_CONNECTIONS", 4)

    async def main() -> None:
        b = await Broker.start(http="127.0.0.1:0")
        try:
            c = await _console_of(b)
            held = [await asyncio.open_connection(c.host, c.port) for _ in range(4)]
            await eventually(lambda: len(c._connections) == 4)
            assert await _http(c, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", read_for=2) == b""
            for _, w in held:
                w.close()
            await eventually(lambda: not c._connections)
            assert (await _get(c, "/ring"))[0] == 200
        finally:
            await b.close()

    run(main())


def test_a_console_address_that_is_bad_or_taken_is_refused_naming_it() -> None:
    async def main() -> None:
        with pytest.raises(ConfigError, match=r"an address is HOST:PORT, got 'nowhere'"):
            await Broker.start(http="nowhere")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(ConfigError, match=rf"--http 127.0.0.1:{port}: .*address already in use"):
                await Broker.start(http=f"127.0.0.1:{port}")

    run(main())
