"""The STOMP door of a broker process (``--stomp``): STOMP clients (stomp.py, and a raw socket
speaking the frames for exact checks) publish to and take from the same spaces, queues and
custody as native clients.

One broker process (with rights: every client brings a token) serves the whole module; each
test keeps to its own events (a ``run`` field its filters select). What is checked: a STOMP
publish reaches a native subscriber and the other way round, a RECEIPT only once the broker
has custody; a JMS selector selects exactly what its offline evaluation does; acknowledged
messages are never sent again, unacknowledged ones are after the connection drops and the
durable subscription is resumed, and a NACK sends one again; every kind of error is an ERROR
frame that closes that connection only; an aborted transaction delivers nothing and a
committed one everything; heart-beats both ways."""

from __future__ import annotations

import contextlib
import json
import queue
import random
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]
import yaml
from tests.broker.conftest import LOG_TAIL, _ready, stop

from flowbus.broker.acl import new_token
from flowbus.broker.config import parse_address
from flowbus.broker.process import console_of, start_process, stomp_of
from flowbus.client.sync import SyncClient
from flowbus.filters.selector import selector
from flowbus.net import certs
from flowbus.net.stomp import Frame, FrameReader, Heartbeat, encode
from flowbus.net.tls import client_context

pytestmark = pytest.mark.broker

ALICE, ALICE_HASH = new_token()
BOB, BOB_HASH = new_token()
CONFIG = {
    "spaces": {
        "stocks": {"symbol": "str", "price": "float", "quantity": "int", "exchange": "str", "level": "int"},
        "events": None,
    },
    "acl": {"alice": {"publish": ["*"], "subscribe": ["*"]}, "bob": {"subscribe": ["events"]}},
    "tokens": {"alice": ALICE_HASH, "bob": BOB_HASH},
}
WAIT = 10.0  # seconds a test waits for what must come


@dataclass(frozen=True)
class Door:
    address: str  # the broker's native address
    host: str  # its STOMP listener's ("" and 0: none)
    port: int
    console: str | None = None  # its console's URL, if started with http (STOMP over WebSocket: /stomp)


@contextlib.contextmanager
def broker(tmp: Path, config: dict[str, Any], **options: Any) -> Iterator[Door]:
    """A broker process with ``config`` (and ``start_process``'s ``options``: ``stomp``, a
    STOMP listener; ``http``, a console), always stopped; its log's tail printed (pytest
    shows it when a test fails)."""
    path, log = tmp / "broker.yaml", tmp / "broker-log.txt"
    path.write_text(yaml.safe_dump(config))
    proc = start_process("127.0.0.1:0", join=[], config=path, log=log, **options)
    try:
        address = _ready(proc, 30.0)
        listening = stomp_of(proc)
        host, port = parse_address(listening) if listening is not None else ("", 0)
        yield Door(address, host, port, console_of(proc))
    finally:
        stop(proc)
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        print(f"--- broker (pid {proc.pid}): last {LOG_TAIL} of {len(lines)} log lines")
        print("\n".join(lines[-LOG_TAIL:]))


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, _matching_compiled: None) -> Iterator[Door]:
    """One broker process with a STOMP listener on a free port (``--stomp``), for the module."""
    with broker(tmp_path_factory.mktemp("stomp"), CONFIG, stomp="127.0.0.1:0") as started:
        yield started


# -- clients


class Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """What a stomp.py connection was sent: MESSAGEs (headers, event), RECEIPT ids, ERRORs."""

    def __init__(self) -> None:
        self.messages: queue.Queue[tuple[dict[str, str], dict[str, Any]]] = queue.Queue()
        self.receipts: set[str] = set()
        self.errors: list[dict[str, str]] = []
        self.changed = threading.Condition()

    def on_message(self, frame: Any) -> None:
        self.messages.put((frame.headers, json.loads(frame.body)))

    def on_receipt(self, frame: Any) -> None:
        with self.changed:
            self.receipts.add(frame.headers["receipt-id"])
            self.changed.notify_all()

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers)

    def take(self, n: int, timeout: float = WAIT) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [self.messages.get(timeout=timeout) for _ in range(n)]

    def none_more(self, wait: float = 0.3) -> bool:
        with contextlib.suppress(queue.Empty):
            self.messages.get(timeout=wait)
            return False
        return True

    def has_receipts(self, *ids: str, timeout: float = WAIT) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: set(ids) <= self.receipts, timeout)


@contextlib.contextmanager
def stomp_client(
    door: Door, client_id: str | None = None, token: str = ALICE, conn: stomp.Connection12 | None = None
) -> Iterator[tuple[stomp.Connection12, Listener]]:
    """A stomp.py client connected to ``door`` (``conn``: one made already, not connected)."""
    conn = conn if conn is not None else stomp.Connection12([(door.host, door.port)])
    listener = Listener()
    conn.set_listener("test", listener)
    headers = {"client-id": client_id} if client_id is not None else {}
    conn.connect("someone", token, wait=True, headers=headers)
    try:
        yield conn, listener
    finally:
        if conn.is_connected():
            conn.disconnect()


class Raw:
    """A STOMP client on a plain socket, with flowbus's own codec: frames exactly as sent.
    ``sock``: another transport with a socket's ``sendall``, ``recv``, ``settimeout`` and
    ``close`` (a WebSocket: tests/broker/test_stomp_ws.py) instead of TCP to the door."""

    def __init__(self, door: Door, tls: ssl.SSLContext | None = None, sock: Any = None) -> None:
        if sock is None:
            sock = socket.create_connection((door.host, door.port), timeout=WAIT)
        self.sock = sock
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname=door.host)
        self.reader = FrameReader("client")
        self.frames: deque[Frame] = deque()
        self.beats = 0

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.sock.sendall(encode(Frame(command, list((headers or {}).items()), body)))

    def next(self, timeout: float = WAIT) -> Frame | None:
        """The next frame; None if the broker closed the connection first; a
        :class:`TimeoutError` if neither happens within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while not self.frames:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            for event in self.reader.feed(data):
                if isinstance(event, Heartbeat):
                    self.beats += 1
                else:
                    self.frames.append(event)
        return self.frames.popleft()

    def expect(self, command: str) -> Frame:
        got = self.next()
        assert got is not None and got.command == command, got
        return got

    def closed(self) -> bool:
        """Whether the broker closed the connection (nothing more came)."""
        return self.next(timeout=2.0) is None

    def quiet(self, wait: float = 0.5) -> bool:
        """Whether nothing comes for ``wait`` seconds (and the connection stays open)."""
        try:
            return self.next(timeout=wait) is None and False
        except TimeoutError:
            return True

    def close(self) -> None:
        self.sock.close()


def connect(
    door: Door, client_id: str | None = None, token: str = ALICE, *, raw: Raw | None = None, **headers: str
) -> Raw:
    """A :class:`Raw` client (``raw``: one not connected yet) after its CONNECT."""
    raw = raw if raw is not None else Raw(door)
    more = {"client-id": client_id} if client_id is not None else {}
    raw.send(
        "CONNECT", {"accept-version": "1.1,1.2", "host": "flowbus", "passcode": token, **more, **headers}
    )
    raw.expect("CONNECTED")
    return raw


def native(door: Door) -> SyncClient:
    return SyncClient(door.address, token=ALICE)


def events(run: str, n: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"run": run, "n": i, **fields} for i in range(n)]


# -- 1. both ways, and receipts at custody


def test_a_stomp_publish_reaches_a_native_subscriber_with_its_receipt(door: Door) -> None:
    with native(door) as client, stomp_client(door) as (conn, listener):
        sub = client.subscribe("events", 'run = "t1"')
        time.sleep(0.2)  # (the subscription is in the ring's tables)
        for i, event in enumerate(events("t1", 3)):
            conn.send("/topic/events", json.dumps(event), content_type="application/json", receipt=f"r{i}")
        assert [sub.get(timeout=WAIT)["n"] for _ in range(3)] == [0, 1, 2]
        assert listener.has_receipts("r0", "r1", "r2")
        assert listener.errors == []


def test_a_native_publish_reaches_a_stomp_subscriber(door: Door) -> None:
    sent = events("t1b", 3, price=1.5, tags=["a", "b"])
    with stomp_client(door) as (conn, listener), native(door) as client:
        conn.subscribe("/queue/events", id="mine", headers={"selector": "run = 't1b'"})
        time.sleep(0.2)
        for event in sent:
            client.publish("events", event)
        client.flush(WAIT)
        got = listener.take(3)
    assert [event for _, event in got] == sent  # (no hidden field: the event as published)
    for headers, _ in got:
        assert headers["subscription"] == "mine" and headers["destination"] == "/queue/events"
        assert headers["content-type"] == "application/json" and "ack" not in headers
        assert headers["event-id"].startswith(f"{client.client.name}:")
    assert len({headers["message-id"] for headers, _ in got}) == 3


def test_a_receipt_waits_until_the_broker_has_custody(door: Door) -> None:
    """A SEND's RECEIPT is the publish's acknowledgement: it comes once every subscriber has
    the event, here once a client-individual subscriber has acknowledged it."""
    with stomp_client(door) as (slow, taken), stomp_client(door) as (pub, told):
        slow.subscribe("events", id="s", ack="client-individual", headers={"selector": "run = 't1c'"})
        time.sleep(0.2)
        pub.send("events", json.dumps({"run": "t1c"}), receipt="custody")
        [(headers, _)] = taken.take(1)
        assert not told.has_receipts("custody", timeout=0.5)  # (in flight, not acknowledged)
        slow.ack(headers["ack"])
        assert told.has_receipts("custody")


def test_a_row_for_two_subscriptions_is_acknowledged_once_both_its_messages_are(door: Door) -> None:
    """One event for two subscriptions of a connection is one native row (one delivery
    number) and two MESSAGEs: the row is acknowledged, and the publish in custody, only once
    each message is."""
    with stomp_client(door) as (both, taken), stomp_client(door) as (pub, told):
        both.subscribe("events", id="a", ack="client-individual", headers={"selector": "run = 't1d'"})
        both.subscribe("events", id="b", ack="client", headers={"filter": 'run = "t1d" & n >= 0'})
        time.sleep(0.2)
        pub.send("events", json.dumps({"run": "t1d", "n": 1}), receipt="both")
        got = {headers["subscription"]: headers for headers, _ in taken.take(2)}
        assert set(got) == {"a", "b"} and got["a"]["event-id"] == got["b"]["event-id"]
        assert got["a"]["message-id"] != got["b"]["message-id"]
        both.ack(got["a"]["ack"])
        assert not told.has_receipts("both", timeout=0.5)
        both.ack(got["b"]["ack"])
        assert told.has_receipts("both")


# -- 2. selectors


SELECTOR = (
    "run = 't2' AND (price > 50 AND sym IN ('IBM', 'MSFT') OR sym LIKE 'A%' "
    "OR flag = TRUE AND NOT (price BETWEEN 10 AND 20))"
)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _cmp(v: Any, op: str, c: Any) -> bool | None:
    """``v op c`` in SQL's three values (None: UNKNOWN), JMS's types: another type is FALSE."""
    if v is None:
        return None
    if _number(c):
        if not _number(v):
            return False
        return {"=": v == c, ">": v > c, ">=": v >= c, "<=": v <= c}[op]
    if isinstance(c, bool):
        return isinstance(v, bool) and v == c
    return isinstance(v, str) and v == c


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


def _and(*xs: bool | None) -> bool | None:
    return False if False in xs else None if None in xs else True


def _or(*xs: bool | None) -> bool | None:
    return True if True in xs else None if None in xs else False


def offline(e: dict[str, Any]) -> bool:
    """:data:`SELECTOR` on ``e``, evaluated by hand: selected only when TRUE."""
    price, sym, flag = e.get("price"), e.get("sym"), e.get("flag")
    like = None if sym is None else isinstance(sym, str) and sym.startswith("A")
    between = _and(_cmp(price, ">=", 10), _cmp(price, "<=", 20))
    return (
        _and(
            _cmp(e.get("run"), "=", "t2"),
            _or(
                _and(_cmp(price, ">", 50), _or(_cmp(sym, "=", "IBM"), _cmp(sym, "=", "MSFT"))),
                like,
                _and(_cmp(flag, "=", True), _not(between)),
            ),
        )
        is True
    )


def varied(n: int) -> list[dict[str, Any]]:
    rng = random.Random(2)
    prices = [None, 0, 5, 10, 15.5, 20, 20.5, 51, 99, 50, "cheap", True]
    symbols = [None, "IBM", "MSFT", "AAPL", "AMZN", "XYZ", "", 3]
    flags = [None, True, False, "yes", 1]
    out = []
    for i in range(n):
        e: dict[str, Any] = {"run": "t2", "i": i}
        for name, values in (("price", prices), ("sym", symbols), ("flag", flags)):
            if rng.random() < 0.85:  # (else missing)
                e[name] = rng.choice(values)
        out.append(e)
    return out


def test_a_selector_selects_exactly_what_its_offline_evaluation_does(door: Door) -> None:
    sent = varied(200)
    last = {"run": "t2", "i": 200, "flag": True, "price": 0}  # (selected: once here, all are)
    wanted = {e["i"] for e in [*sent, last] if offline(e)}
    assert wanted == {e["i"] for e in [*sent, last] if selector(SELECTOR).matches(e)}
    assert 20 < len(wanted) < 180 and 200 in wanted
    with stomp_client(door) as (conn, listener), native(door) as client:
        conn.subscribe("/topic/events", id="sel", headers={"selector": SELECTOR})
        time.sleep(0.2)
        for e in [*sent, last]:
            client.publish("events", e)
        client.flush(WAIT)
        got = [event["i"] for _, event in listener.take(len(wanted))]
        assert listener.none_more()
    assert sorted(got) == got and set(got) == wanted


# -- 3. acknowledgements


def _subscribe(raw: Raw, sid: str, run: str, ack: str, durable: str | None = None) -> None:
    headers = {"id": sid, "destination": "/topic/events", "ack": ack, "selector": f"run = '{run}'"}
    if durable is not None:
        headers["durable-subscription-name"] = durable
    raw.send("SUBSCRIBE", {**headers, "receipt": f"sub-{sid}"})
    raw.expect("RECEIPT")


def _publish(door: Door, sent: list[dict[str, Any]]) -> None:
    raw = connect(door)
    for e in sent:
        raw.send(
            "SEND", {"destination": "events", "content-type": "application/json"}, json.dumps(e).encode()
        )
    raw.send("DISCONNECT", {"receipt": "bye"})
    raw.expect("RECEIPT")
    raw.close()


def _ns(frames: list[Frame]) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames]


def test_unacknowledged_messages_come_again_when_the_durable_subscription_is_resumed(door: Door) -> None:
    first = connect(door, client_id="t3")
    _subscribe(first, "d", "t3", "client-individual", durable="durable-t3")
    _publish(door, events("t3", 10))
    got = [first.expect("MESSAGE") for _ in range(10)]
    assert _ns(got) == list(range(10))
    for frame in got[1::2]:  # (the odd ones, acknowledged one by one)
        first.send("ACK", {"id": frame.header("ack") or ""})
    first.send("BEGIN", {"transaction": "barrier", "receipt": "barrier"})
    first.expect("RECEIPT")  # (the ACKs before it are taken)
    first.close()  # (dropped: no DISCONNECT)

    again = connect(door, client_id="t3")
    _subscribe(again, "d2", "t3", "client-individual", durable="durable-t3")
    back = [again.expect("MESSAGE") for _ in range(5)]
    assert _ns(back) == [0, 2, 4, 6, 8]
    assert {f.header("subscription") for f in back} == {"d2"}
    assert again.quiet()  # (no acknowledged message came again)

    again.send("NACK", {"id": back[0].header("ack") or ""})  # (given back: sent again)
    resent = again.expect("MESSAGE")
    assert _ns([resent]) == [0] and resent.header("message-id") != back[0].header("message-id")
    assert resent.header("event-id") == back[0].header("event-id")
    for frame in [*back[1:], resent]:
        again.send("ACK", {"id": frame.header("ack") or ""})
    again.send("UNSUBSCRIBE", {"id": "d2", "receipt": "gone"})  # (the durable subscription ends)
    again.expect("RECEIPT")
    again.send("DISCONNECT", {"receipt": "bye"})
    again.expect("RECEIPT")
    assert again.closed()


def test_a_client_ack_takes_every_message_up_to_it(door: Door) -> None:
    first = connect(door, client_id="t3b")
    _subscribe(first, "c", "t3b", "client", durable="durable-t3b")
    _publish(door, events("t3b", 6))
    got = [first.expect("MESSAGE") for _ in range(6)]
    first.send("ACK", {"id": got[3].header("ack") or "", "receipt": "acked"})  # (0..3)
    first.expect("RECEIPT")
    first.close()
    again = connect(door, client_id="t3b")
    _subscribe(again, "c", "t3b", "client", durable="durable-t3b")
    back = [again.expect("MESSAGE") for _ in range(2)]
    assert _ns(back) == [4, 5]
    again.send("NACK", {"id": back[1].header("ack") or ""})  # (cumulative too: both back, in order)
    assert _ns([again.expect("MESSAGE") for _ in range(2)]) == [4, 5]
    again.send("UNSUBSCRIBE", {"id": "c", "receipt": "gone"})
    again.expect("RECEIPT")
    again.close()


# -- 4. errors


def _refused(raw: Raw, *fragments: str) -> Frame:
    """The ERROR ``raw`` is sent, whose message says each of ``fragments``; then the
    broker closes the connection."""
    error = raw.expect("ERROR")
    message = error.header("message") or ""
    for fragment in fragments:
        assert fragment in message, message
    assert raw.closed()
    return error


def test_each_error_closes_only_its_connection(door: Door) -> None:
    with stomp_client(door) as (watcher, listener):
        watcher.subscribe("events", id="w", headers={"selector": "run = 't4'"})
        time.sleep(0.2)
        seen = 0

        def still_served() -> None:
            nonlocal seen
            _publish(door, [{"run": "t4", "n": seen}])
            [(_, event)] = listener.take(1)
            assert event["n"] == seen and watcher.is_connected()
            seen += 1

        raw = connect(door)  # a selector with a syntax error: where it is
        raw.send("SUBSCRIBE", {"id": "s", "destination": "events", "selector": "price > AND x = 1"})
        _refused(raw, "selector", "line 1, column 9")
        still_served()

        raw = connect(door)  # an unknown destination, to publish and to subscribe
        raw.send("SEND", {"destination": "/topic/nowhere", "receipt": "r"}, b'{"a": 1}')
        assert _refused(raw, "unknown space 'nowhere'").header("receipt-id") == "r"
        raw = connect(door)
        raw.send("SUBSCRIBE", {"id": "s", "destination": "/queue/nowhere"})
        _refused(raw, "unknown space 'nowhere'")
        still_served()

        raw = connect(door)  # an event that does not fit the space's schema: the field named
        stock = {"symbol": "IBM", "price": "cheap", "quantity": 1, "exchange": "N", "level": 1}
        raw.send("SEND", {"destination": "stocks"}, json.dumps(stock).encode())
        _refused(raw, "stocks", "price")
        raw = connect(door)  # a body that is no event
        raw.send("SEND", {"destination": "events"}, b"[1, 2]")
        _refused(raw, "JSON object")
        still_served()

        raw = connect(door, token=BOB)  # rights: bob may subscribe to events, nothing else
        raw.send("SEND", {"destination": "events"}, b'{"run": "t4"}')
        _refused(raw, "bob", "publish", "events")
        raw = connect(door, token=BOB)
        raw.send("SUBSCRIBE", {"id": "s", "destination": "stocks"})
        _refused(raw, "bob", "subscribe", "stocks")
        raw = connect(door, token="not a token")
        raw.send("SUBSCRIBE", {"id": "s", "destination": "events"})
        _refused(raw, "subscribe", "events")
        still_served()

        raw = connect(door)  # protocol violations
        raw.send("ACK", {"id": "12345"})
        _refused(raw, "ACK '12345'")
        raw = connect(door)
        raw.send("SUBSCRIBE", {"destination": "events"})
        _refused(raw, "SUBSCRIBE has no id header")
        raw = connect(door)
        raw.send("COMMIT", {"transaction": "never-begun"})
        _refused(raw, "no transaction 'never-begun'")
        raw = Raw(door)
        raw.send("SEND", {"destination": "events"}, b"{}")  # (before CONNECT)
        _refused(raw, "CONNECT")
        raw = Raw(door)
        raw.send("CONNECT", {"accept-version": "1.0"})
        assert _refused(raw, "version").header("version") == "1.1,1.2"
        raw = connect(door)
        raw.sock.sendall(b"GARBAGE\n\n\0")
        _refused(raw, "unknown command")
        still_served()
        assert listener.errors == []


# -- 5. transactions


def test_an_aborted_transaction_delivers_nothing_and_a_committed_one_all(door: Door) -> None:
    with stomp_client(door) as (sub, listener), stomp_client(door) as (pub, told):
        sub.subscribe("events", id="t", headers={"selector": "run = 't5'"})
        time.sleep(0.2)
        dropped = pub.begin()
        for e in events("t5", 3, tx="aborted"):
            pub.send("events", json.dumps(e), transaction=dropped)
        pub.abort(dropped)
        kept = pub.begin()
        for e in events("t5", 4, tx="committed"):
            pub.send("events", json.dumps(e), transaction=kept)
        time.sleep(0.3)
        assert listener.none_more(0.1)  # (nothing before the COMMIT)
        pub.commit(kept, receipt="committed")
        got = [event for _, event in listener.take(4)]
        assert listener.none_more()
        assert told.has_receipts("committed")
    assert got == events("t5", 4, tx="committed")


# -- heart-beats


def test_heart_beats_both_ways(door: Door) -> None:
    """The broker offers its keepalive (1 s): it sends an EOL when it wrote nothing for that
    long, and closes a connection that promised heart-beats and went silent for twice the
    period."""
    raw = Raw(door)
    raw.send("CONNECT", {"accept-version": "1.2", "heart-beat": "500,500", "passcode": ALICE})
    assert raw.expect("CONNECTED").header("heart-beat") == "1000,1000"
    began = time.monotonic()
    assert raw.next(timeout=5.0) is None  # (nothing but heart-beats, then the end)
    took = time.monotonic() - began
    assert raw.beats >= 1 and 1.5 < took < 3.5, (raw.beats, took)


# -- TLS


def test_with_tls_the_door_takes_tls_only_and_a_client_certificate_names_the_identity(
    tmp_path: Path, _matching_compiled: None
) -> None:
    """A broker with ``--tls`` serves STOMP in TLS with its own certificate (the listener
    from the config's ``stomp`` key here); a client certificate names the identity, as a
    native client's does; plain text is refused."""
    pki = tmp_path / "pki"
    certs.init(pki, brokers=1, clients=["alice"])
    config = {**CONFIG, "stomp": "127.0.0.1:0", "tokens": {"bob": BOB_HASH}}  # (alice: her certificate)
    with broker(tmp_path, config, tls=pki) as door:
        raw = Raw(door, client_context(pki, "alice"))
        raw.send("CONNECT", {"accept-version": "1.2"})
        raw.expect("CONNECTED")
        _subscribe(raw, "s", "tls", "auto")  # (alice may: her certificate names her)
        pub = Raw(door, client_context(pki))
        pub.send("CONNECT", {"accept-version": "1.2", "passcode": BOB})
        pub.expect("CONNECTED")
        pub.send("SEND", {"destination": "events"}, b'{"run": "tls"}')  # (bob may not)
        _refused(pub, "bob", "publish")
        raw.send("SEND", {"destination": "events", "receipt": "r"}, b'{"run": "tls", "n": 0}')
        assert _ns([raw.expect("MESSAGE")]) == [0]
        raw.expect("RECEIPT")
        plain = Raw(door)
        plain.send("CONNECT", {"accept-version": "1.2"})
        assert plain.closed()  # (plain text on a TLS door: closed, nothing answered)


# -- flow control and spill


def test_a_slow_stomp_subscriber_gets_its_window_the_rest_waits_on_disk_and_comes_in_order(
    tmp_path: Path, _matching_compiled: None
) -> None:
    """A durable ``client-individual`` subscriber that acknowledges nothing gets the broker's
    window (20) and no more. The publishes past the memory budget (50) go to its queue on
    disk and are receipted (custody: on disk is kept); the first 50 once it has them. Back on
    a new connection it gets every event, in order, the 20 unacknowledged first, each once."""
    config = {**CONFIG, "window": 20, "memory": 50}
    with broker(tmp_path, config, stomp="127.0.0.1:0", data=tmp_path / "data") as door:
        slow = connect(door, client_id="slow")
        _subscribe(slow, "s", "spill", "client-individual", durable="kept")
        pub = connect(door)
        sent = events("spill", 300)
        for i, e in enumerate(sent):
            pub.send("SEND", {"destination": "events", "receipt": f"p{i}"}, json.dumps(e).encode())
        receipts = {pub.expect("RECEIPT").header("receipt-id") for _ in range(250)}
        assert receipts == {f"p{i}" for i in range(50, 300)}  # (on disk: settled; in memory: not yet)
        assert pub.quiet()
        first = [slow.expect("MESSAGE") for _ in range(20)]
        assert _ns(first) == list(range(20)) and slow.quiet()  # (the window: nothing more)
        slow.close()
        again = connect(door, client_id="slow")
        _subscribe(again, "s", "spill", "client-individual", durable="kept")
        got: list[int] = []
        while len(got) < 300:
            frame = again.expect("MESSAGE")
            got += _ns([frame])
            again.send("ACK", {"id": frame.header("ack") or ""})
        assert got == list(range(300)) and again.quiet()
        receipts = {pub.expect("RECEIPT").header("receipt-id") for _ in range(50)}
        assert receipts == {f"p{i}" for i in range(50)}  # (taken by the subscriber at last)


def test_an_ack_in_a_transaction_is_receipted_once(door: Door) -> None:
    for durable in (None, "tx-acked"):
        raw = connect(door, client_id="t5b")
        _subscribe(raw, "s", "t5b", "client-individual", durable=durable)
        _publish(door, events("t5b", 1))
        message = raw.expect("MESSAGE")
        raw.send("BEGIN", {"transaction": "t", "receipt": "begun"})
        assert raw.expect("RECEIPT").header("receipt-id") == "begun"
        raw.send("ACK", {"id": message.header("ack") or "", "transaction": "t", "receipt": "acked"})
        assert raw.expect("RECEIPT").header("receipt-id") == "acked"
        raw.send("COMMIT", {"transaction": "t", "receipt": "committed"})
        assert raw.expect("RECEIPT").header("receipt-id") == "committed"
        assert raw.quiet()  # (no second RECEIPT for the ACK)
        raw.send("UNSUBSCRIBE", {"id": "s", "receipt": "gone"})
        raw.expect("RECEIPT")
        raw.close()
