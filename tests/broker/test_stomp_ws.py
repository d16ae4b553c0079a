"""STOMP over WebSocket at the console's ``/stomp`` (broker/websocket.py, broker/console.py):
the STOMP door of TCP reached through the console's HTTP port, with stomp.py's WebSocket
transport (websocket-client) and with a raw WebSocket speaking the frames for exact checks.

One broker process (with rights: every client brings a token; a console and a STOMP
listener) serves the module; the clients, the selector and its offline evaluation are
test_stomp.py's. What is checked: a selector over WebSocket selects exactly what its offline
evaluation does, with events both ways between a WebSocket client and native clients; a TCP
and a WebSocket client see the same events; upgrades that are not STOMP's get HTTP errors; a
broken WebSocket frame (1002), text that is not UTF-8 (1007), an over-size message (1009) and
a STOMP ERROR (then Close 1000) end that connection only; heart-beats over WebSocket, and a
quiet WebSocket outlives the console's HTTP deadline."""

from __future__ import annotations

import json
import queue
import socket
import struct
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import stomp  # type: ignore[import-untyped]
import websocket  # type: ignore[import-untyped]
from tests.broker.test_stomp import (
    ALICE,
    CONFIG,
    SELECTOR,
    WAIT,
    Door,
    Raw,
    _publish,
    broker,
    connect,
    events,
    native,
    offline,
    stomp_client,
    varied,
)

from flowbus.broker import console
from flowbus.broker.websocket import MAX_MESSAGE
from flowbus.filters.selector import selector
from flowbus.net.stomp import Frame, encode

pytestmark = pytest.mark.broker

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # (RFC 6455's example Sec-WebSocket-Key)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, _matching_compiled: None) -> Iterator[Door]:
    """One broker process with a console (its ``/stomp``) and a STOMP listener, for the module."""
    with broker(
        tmp_path_factory.mktemp("stomp-ws"), CONFIG, stomp="127.0.0.1:0", http="127.0.0.1:0"
    ) as started:
        yield started


# -- clients


def console_at(door: Door) -> tuple[str, int]:
    assert door.console is not None
    url = urlsplit(door.console)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


def ws_stomp(door: Door) -> stomp.WSStompConnection:
    """A stomp.py connection over the console's WebSocket (its transport offers no
    subprotocol of its own: the header does)."""
    return stomp.WSStompConnection(
        [console_at(door)], ws_path="/stomp", header={"Sec-WebSocket-Protocol": "v12.stomp"}
    )


class WSSocket:
    """A WebSocket to the console's ``/stomp`` (websocket-client) as the socket of a
    :class:`Raw` client: ``sendall`` sends one text message, ``recv`` gives the next message's
    payload, ``b""`` once the broker closed (``close_code``: the code of its Close)."""

    def __init__(self, door: Door, subprotocols: tuple[str, ...] = ("v12.stomp",)) -> None:
        host, port = console_at(door)
        self.ws = websocket.create_connection(
            f"ws://{host}:{port}/stomp", subprotocols=list(subprotocols), timeout=WAIT
        )
        self.close_code: int | None = None

    def sendall(self, data: bytes) -> None:
        self.ws.send(data.decode())

    def settimeout(self, timeout: float) -> None:
        self.ws.settimeout(timeout)

    def recv(self, _size: int) -> bytes:
        try:
            opcode, data = self.ws.recv_data()
        except websocket.WebSocketTimeoutException:
            raise TimeoutError from None
        except (websocket.WebSocketConnectionClosedException, ConnectionError):
            return b""
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            self.close_code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None
            return b""
        return bytes(data)

    def close(self) -> None:
        self.ws.close()


def raw_ws(door: Door) -> Raw:
    """A :class:`Raw` STOMP client over the console's WebSocket, connected."""
    return connect(door, raw=Raw(door, sock=WSSocket(door)))


def closed_with(raw: Raw) -> int | None:
    """The code of the Close that ended ``raw``'s connection, once nothing more comes."""
    assert raw.next() is None
    code: int | None = raw.sock.close_code
    raw.close()
    return code


def sends(*sizes: int) -> bytes:
    """SEND frames whose bodies (events) are ``sizes`` bytes long, as one message's payload."""
    frames = b""
    for size in sizes:
        pad = size - len(json.dumps({"run": "t-big", "pad": ""}))
        body = json.dumps({"run": "t-big", "pad": "x" * pad}).encode()
        frames += encode(Frame("SEND", [("destination", "events")], body))
    return frames


# -- 1. both ways, a selector exactly


def test_a_selector_over_websocket_selects_exactly_what_its_offline_evaluation_does(door: Door) -> None:
    sent = [*varied(200), {"run": "t2", "i": 200, "flag": True, "price": 0}]
    wanted = [e["i"] for e in sent if offline(e)]
    assert 20 < len(wanted) < 180
    with stomp_client(door, conn=ws_stomp(door)) as (conn, listener), native(door) as client:
        conn.subscribe("/topic/events", id="sel", headers={"selector": SELECTOR})
        time.sleep(0.2)  # (the subscription is in the ring's tables)
        for e in sent:
            client.publish("events", e)
        client.flush(WAIT)
        got = [event["i"] for _, event in listener.take(len(wanted))]
        assert listener.none_more()
    assert got == wanted


def test_a_websocket_publish_reaches_a_native_subscriber_exactly_through_the_selectors_filter(
    door: Door,
) -> None:
    """SENDs over WebSocket, a native subscriber with the selector's flowbus filter: what it
    takes is what the selector's offline evaluation selects, once each, in order; the last
    SEND's RECEIPT comes once the broker has custody (the subscriber took every event)."""
    sent = [*varied(200), {"run": "t2", "i": 200, "flag": True, "price": 0}]
    wanted = [e["i"] for e in sent if offline(e)]
    with native(door) as client, stomp_client(door, conn=ws_stomp(door)) as (conn, listener):
        sub = client.subscribe("events", selector(SELECTOR).to_text())
        time.sleep(0.2)
        for e in sent:
            receipt = {"receipt": "last"} if e is sent[-1] else {}
            conn.send("/topic/events", json.dumps(e), content_type="application/json", headers=receipt)
        got = [sub.get(timeout=WAIT)["i"] for _ in wanted]
        assert listener.has_receipts("last")  # (once the subscriber took them all: custody)
        with pytest.raises(queue.Empty):
            sub.get(timeout=0.3)
        assert listener.errors == []
    assert got == wanted


def test_a_tcp_and_a_websocket_client_see_the_same_events(door: Door) -> None:
    """A TCP and a WebSocket STOMP client subscribe with one flowbus filter; each publishes
    60 events (the next batch once the last one's RECEIPT says every subscriber has them):
    both take the same messages, in the same order, with the same event ids."""
    text = 'run = "same" & n >= 10 & n < 50'
    batches = {via: [{"run": "same", "n": n, "via": via} for n in range(60)] for via in ("tcp", "ws")}
    wanted = [(e["via"], e["n"]) for via in ("tcp", "ws") for e in batches[via] if 10 <= e["n"] < 50]
    with stomp_client(door) as tcp, stomp_client(door, conn=ws_stomp(door)) as ws:
        for conn, _ in (tcp, ws):
            conn.subscribe("/topic/events", id="same", headers={"filter": text})
        time.sleep(0.2)
        for via, (conn, listener) in (("tcp", tcp), ("ws", ws)):
            for e in batches[via]:
                conn.send("events", json.dumps(e), headers={"receipt": via} if e["n"] == 59 else {})
            assert listener.has_receipts(via)
        taken = {via: listener.take(len(wanted)) for via, (_, listener) in (("tcp", tcp), ("ws", ws))}
        assert tcp[1].none_more() and ws[1].none_more()
    for got in taken.values():
        assert [(e["via"], e["n"]) for _, e in got] == wanted
    assert [h["event-id"] for h, _ in taken["tcp"]] == [h["event-id"] for h, _ in taken["ws"]]


# -- 2. upgrades


def _http(door: Door, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` to the console; its answer (read until it closes the connection)."""
    with socket.create_connection(console_at(door), timeout=WAIT) as s:
        s.sendall(request)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _upgrade(path: str = "/stomp", protocols: str | None = None, *, key: bool = True) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: x", "Upgrade: websocket", "Connection: Upgrade"]
    lines += ["Sec-WebSocket-Version: 13"] + ([f"Sec-WebSocket-Key: {KEY}"] if key else [])
    lines += [f"Sec-WebSocket-Protocol: {protocols}"] if protocols is not None else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_upgrades_that_are_not_stomps_get_http_errors(door: Door) -> None:
    status, _, body = _http(door, _upgrade())
    assert status == 400 and b"v12.stomp or v11.stomp" in body and b"offered none" in body
    status, _, body = _http(door, _upgrade(protocols="v10.stomp, mqtt"))
    assert status == 400 and b"offered v10.stomp, mqtt" in body
    status, _, body = _http(door, _upgrade("/ws", protocols="v12.stomp"))
    assert status == 404 and b"no WebSocket at /ws" in body
    status, _, body = _http(door, _upgrade(protocols="v12.stomp", key=False))
    assert status == 400 and b"Sec-WebSocket-Key" in body
    status, headers, body = _http(door, b"GET /stomp HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 426 and headers["upgrade"] == "websocket" and b"ws://HOST:PORT/stomp" in body
    # the client's first subprotocol the broker speaks; STOMP's version is CONNECT's
    raw = connect(door, raw=Raw(door, sock=WSSocket(door, ("mqtt", "v11.stomp", "v12.stomp"))))
    assert raw.sock.ws.getsubprotocol() == "v11.stomp"
    raw.send("DISCONNECT", {"receipt": "bye"})
    raw.expect("RECEIPT")
    assert closed_with(raw) == 1000


# -- 3. errors end that connection only


def test_bad_websocket_input_and_stomp_errors_end_that_connection_only(door: Door) -> None:
    with stomp_client(door) as tcp, stomp_client(door, conn=ws_stomp(door)) as ws:
        for conn, _ in (tcp, ws):
            conn.subscribe("events", id="w", headers={"selector": "run = 't-bad'"})
        time.sleep(0.2)
        seen = 0

        def still_served() -> None:
            nonlocal seen
            _publish(door, [{"run": "t-bad", "n": seen}])
            for conn, listener in (tcp, ws):
                [(_, event)] = listener.take(1)
                assert event["n"] == seen and conn.is_connected()
            seen += 1

        raw = raw_ws(door)  # not a WebSocket frame (reserved bits, opcode 0xf)
        raw.sock.ws.sock.sendall(b"\xff\xfe garbage")
        assert closed_with(raw) == 1002
        raw = raw_ws(door)  # a client's frame not masked
        raw.sock.ws.sock.sendall(b"\x81\x05hello")
        assert closed_with(raw) == 1002
        raw = raw_ws(door)  # a text message that is not UTF-8
        raw.sock.ws.send(b"\xc3\x28", websocket.ABNF.OPCODE_TEXT)
        assert closed_with(raw) == 1007
        still_served()

        # a message over the limit: two SENDs STOMP would take (the first is published), 1009
        big = sends(MAX_MESSAGE // 2, MAX_MESSAGE // 2)
        assert len(big) > MAX_MESSAGE
        raw = raw_ws(door)
        raw.sock.ws.send(big, websocket.ABNF.OPCODE_BINARY)
        assert closed_with(raw) == 1009
        raw = raw_ws(door)  # as many bytes in two messages: taken
        half = sends(MAX_MESSAGE // 2)
        for _ in range(2):
            raw.sock.ws.send(half, websocket.ABNF.OPCODE_BINARY)
        raw.send("SUBSCRIBE", {"id": "s", "destination": "events", "receipt": "alive"})
        assert raw.expect("RECEIPT").header("receipt-id") == "alive"
        raw.close()
        still_served()

        raw = raw_ws(door)  # STOMP errors: ERROR, then Close 1000
        raw.send("SUBSCRIBE", {"id": "s", "destination": "events", "selector": "price > AND x = 1"})
        assert "line 1, column 9" in (raw.expect("ERROR").header("message") or "")
        assert closed_with(raw) == 1000
        raw = Raw(door, sock=WSSocket(door))
        raw.send("SEND", {"destination": "events"}, b"{}")  # (before CONNECT)
        assert "CONNECT" in (raw.expect("ERROR").header("message") or "")
        assert closed_with(raw) == 1000
        raw = raw_ws(door)
        raw.send("SEND", {"destination": "events", "receipt": "r"}, b'{"a": 1}')  # (alice may)
        raw.expect("RECEIPT")
        raw.send("SUBSCRIBE", {"id": "s", "destination": "/queue/nowhere"})
        assert "unknown space 'nowhere'" in (raw.expect("ERROR").header("message") or "")
        assert closed_with(raw) == 1000
        still_served()
        assert tcp[1].errors == [] and ws[1].errors == []


# -- 4. heart-beats, and no HTTP deadline


def test_heart_beats_over_websocket(door: Door) -> None:
    """As on TCP: the broker sends an EOL (a text message) when it wrote nothing for its
    keepalive (1 s), and closes a connection that promised heart-beats and went silent for
    twice the period (Close 1000)."""
    raw = Raw(door, sock=WSSocket(door))
    raw.send("CONNECT", {"accept-version": "1.2", "heart-beat": "500,500", "passcode": ALICE})
    assert raw.expect("CONNECTED").header("heart-beat") == "1000,1000"
    began = time.monotonic()
    assert raw.next(timeout=5.0) is None
    took = time.monotonic() - began
    assert raw.beats >= 1 and 1.5 < took < 3.5, (raw.beats, took)
    assert raw.sock.close_code == 1000


@pytest.mark.slow
def test_a_quiet_websocket_outlives_the_consoles_http_deadline(door: Door) -> None:
    """No heart-beats agreed, nothing sent for longer than the console lets an HTTP
    connection stay silent: the WebSocket is a STOMP connection, still served."""
    raw = raw_ws(door)
    raw.send("SUBSCRIBE", {"id": "q", "destination": "events", "selector": "run = 't-quiet'", "receipt": "s"})
    raw.expect("RECEIPT")
    time.sleep(console.IDLE + 1.5)
    _publish(door, events("t-quiet", 2))
    assert [json.loads(raw.expect("MESSAGE").body)["n"] for _ in range(2)] == [0, 1]
    raw.send("DISCONNECT", {"receipt": "bye"})
    raw.expect("RECEIPT")
    assert closed_with(raw) == 1000
