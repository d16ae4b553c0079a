"""The STOMP door under bad input, on a live broker process: header escapes, bodies that
hold NULs, frames split at every byte, a 1 MB body, frames over the limits, garbage,
silence and missed heart-beats. Each ends in the frames it asked for, or in an ERROR frame
and a close, or in a clean close; the broker never fails, and a subscriber on another
connection (the ``watch`` fixture) gets every event published around and between them,
once and in order."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.broker.test_stomp import (
    ALICE,
    CONFIG,
    WAIT,
    Door,
    Raw,
    _refused,
    broker,
    connect,
    native,
    stomp_client,
)

from flowbus.net.stomp import MAX_BODY, MAX_HEADER_LINE, MAX_HEADERS, Frame, encode

pytestmark = pytest.mark.broker

DEADLINE = 2.0  # seconds the door waits for a CONNECT (security.handshake_timeout)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, _matching_compiled: None) -> Iterator[Door]:
    config = {**CONFIG, "security": {"handshake_timeout": DEADLINE}}
    with broker(tmp_path_factory.mktemp("stomp-robust"), config, stomp="127.0.0.1:0") as started:
        yield started


class Watch:
    """A stomp.py subscriber on its own connection, and a native publisher: :meth:`check`
    publishes one more event and waits for it; at the end, every event came once, in order."""

    def __init__(self, door: Door, run: str, listener: Any, publisher: Any) -> None:
        self.door, self.run, self.listener, self.publisher = door, run, listener, publisher
        self.sent = 0

    def check(self) -> None:
        self.publisher.publish("events", {"run": self.run, "n": self.sent})
        self.publisher.flush(WAIT)
        [(_, event)] = self.listener.take(1)
        assert event == {"run": self.run, "n": self.sent}
        self.sent += 1


@pytest.fixture
def watch(door: Door, request: pytest.FixtureRequest) -> Iterator[Watch]:
    run = f"watch-{request.node.name}"
    with stomp_client(door) as (conn, listener), native(door) as publisher:
        conn.subscribe("events", id="watch", headers={"selector": f"run = '{run}'"})
        time.sleep(0.2)  # (the subscription is in the tables)
        watched = Watch(door, run, listener, publisher)
        watched.check()
        yield watched
        watched.check()
        assert listener.none_more() and listener.errors == [] and conn.is_connected()


def _subscribed(door: Door, run: str, sid: str = "s", **headers: str) -> Raw:
    raw = connect(door)
    raw.send(
        "SUBSCRIBE",
        {"id": sid, "destination": "events", "selector": f"run = '{run}'", "receipt": "r", **headers},
    )
    assert raw.expect("RECEIPT").header("receipt-id") == "r"
    return raw


def _message(raw: Raw) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(raw.expect("MESSAGE").body)
    return event


# -- what is well formed, however odd, goes through


def test_escaped_header_values_arrive_as_they_were_meant(door: Door, watch: Watch) -> None:
    """Headers with ``:``, newlines and backslashes (escaped on the wire as STOMP 1.2 says)
    reach the broker decoded: a subscription id comes back as it was, a selector with a
    colon in a string selects by it."""
    sid = "a:b\nc\\d"
    raw = _subscribed(door, "esc", sid, selector="run = 'esc' AND label = 'x:y'")
    assert b"a\\cb\\nc\\\\d" in encode(Frame("SUBSCRIBE", [("id", sid)]))  # (escaped on the wire)
    pub = connect(door)
    for label in ("x:y", "x", "x:y\n"):
        pub.send("SEND", {"destination": "events"}, json.dumps({"run": "esc", "label": label}).encode())
    frame = raw.expect("MESSAGE")
    assert frame.header("subscription") == sid and json.loads(frame.body)["label"] == "x:y"
    assert raw.quiet()
    watch.check()


def test_content_length_bodies_with_nuls(door: Door, watch: Watch) -> None:
    """A body with ``content-length`` may hold NULs: an event whose text holds one goes
    through whole; a body that is JSON followed by NULs is no event (ERROR, closed)."""
    raw = _subscribed(door, "nul")
    pub = connect(door)
    event = {"run": "nul", "text": "before\x00after", "n": 1}
    body = json.dumps(event).encode()
    pub.send("SEND", {"destination": "events", "receipt": "sent"}, body)
    assert pub.expect("RECEIPT").header("receipt-id") == "sent"
    assert _message(raw) == event
    pub.sock.sendall(
        b"SEND\ndestination:events\ncontent-length:%d\n\n%s\x00\x00\x00" % (len(body) + 2, body + b"\x00\x00")
    )
    _refused(pub, "not JSON")
    watch.check()


def test_frames_split_at_every_byte_make_the_same_conversation(door: Door, watch: Watch) -> None:
    """A whole conversation written one byte per TCP segment: the broker reads the same
    frames, answers the same RECEIPTs and delivers the same events."""
    raw = Raw(door)
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stream = b"".join(
        encode(f)
        for f in [
            Frame("CONNECT", [("accept-version", "1.2"), ("passcode", ALICE)]),
            Frame(
                "SUBSCRIBE",
                [
                    ("id", "s"),
                    ("destination", "/topic/events"),
                    ("selector", "run = 'bytes' AND n > 0"),
                    ("receipt", "sub"),
                ],
            ),
            *(
                Frame("SEND", [("destination", "events")], json.dumps({"run": "bytes", "n": n}).encode())
                for n in range(3)
            ),
            Frame("DISCONNECT", [("receipt", "bye")]),
        ]
    )
    for i in range(len(stream)):
        raw.sock.sendall(stream[i : i + 1])
        time.sleep(0.0005)
    assert raw.expect("CONNECTED").header("version") == "1.2"
    assert raw.expect("RECEIPT").header("receipt-id") == "sub"
    frames = [raw.expect("MESSAGE"), raw.expect("MESSAGE")]
    assert [json.loads(f.body)["n"] for f in frames] == [1, 2]
    assert raw.expect("RECEIPT").header("receipt-id") == "bye"
    assert raw.closed()
    watch.check()


def test_frames_cut_at_random_points_are_read_whole(door: Door, watch: Watch) -> None:
    """Many frames in one stream, cut into pieces of random sizes (a cut inside a header,
    an escape, a body, a NUL): every event arrives, in order."""
    raw = _subscribed(door, "cuts")
    pub = connect(door)
    pub.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent = [{"run": "cuts", "n": n, "text": "x" * (n * 37 % 500), "k:v": "a\\b"} for n in range(200)]
    stream = b"".join(
        encode(Frame("SEND", [("destination", "events"), ("x-tag", f"t:{n}\n")], json.dumps(e).encode()))
        for n, e in enumerate(sent)
    )
    rng, at = random.Random(34), 0
    while at < len(stream):
        step = rng.choice([1, 2, 3, 7, 64, 1000, 5000])
        pub.sock.sendall(stream[at : at + step])
        at += step
        if rng.random() < 0.1:
            time.sleep(0.001)
    assert [_message(raw) for _ in sent] == sent
    watch.check()


def test_a_one_megabyte_body_goes_through_and_one_byte_past_the_limit_does_not(
    door: Door, watch: Watch
) -> None:
    raw = _subscribed(door, "big")
    pub = connect(door)
    event = {"run": "big", "text": ""}
    event["text"] = "z" * (1_000_000 - len(json.dumps(event)))
    body = json.dumps(event).encode()
    assert len(body) == 1_000_000
    pub.send("SEND", {"destination": "events", "receipt": "big"}, body)
    assert pub.expect("RECEIPT").header("receipt-id") == "big"
    assert _message(raw) == event
    over = b"{" + b" " * (MAX_BODY - 1) + b"}"  # (valid JSON, one byte over)
    pub.send("SEND", {"destination": "events"}, over)
    _refused(pub, "over the limit")
    pub = connect(door)  # without content-length: refused once past the limit, not buffered on
    pub.sock.sendall(b"SEND\ndestination:events\n\n" + b" " * (MAX_BODY + 10))
    _refused(pub, "body")
    watch.check()


@pytest.mark.parametrize(
    ("frame", "what"),
    [
        (b"SEND\ndestination:events\ncontent-length:99999999\n\n", "over the limit"),
        (b"SEND\ndestination:" + b"e" * MAX_HEADER_LINE + b"\n\n{}\x00", "header"),
        (b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(MAX_HEADERS + 1)) + b"\n{}\x00", "headers"),
        (b"SEND\ndestination:events\ncontent-length:ten\n\n{}\x00", "content-length"),
        (b"SEND\ndestination\n\n{}\x00", "header"),
        (b"SEND\ndestination:\\x\n\n{}\x00", "escape"),
        (b"SEND\ndestination:events\ncontent-length:2\n\n{}X", "NUL"),
        (b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n", "command"),
    ],
    ids=[
        "promised-too-big",
        "header-too-long",
        "too-many-headers",
        "bad-length",
        "no-colon",
        "bad-escape",
        "no-nul",
        "long-command",
    ],
)
def test_a_malformed_frame_is_an_error_and_a_close(door: Door, watch: Watch, frame: bytes, what: str) -> None:
    raw = connect(door)
    raw.sock.sendall(frame)
    error = raw.expect("ERROR")
    assert what in (error.header("message") or ""), error.header("message")
    assert raw.closed()
    watch.check()


def test_garbage_before_and_after_connect_ends_that_connection_only(door: Door, watch: Watch) -> None:
    rng = random.Random(7)
    for _ in range(5):
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
        for raw in (Raw(door), connect(door)):
            with contextlib.suppress(OSError):  # (the broker may close while we still write)
                raw.sock.sendall(noise + b"\x00" * 3)
            with contextlib.suppress(OSError):
                while (frame := raw.next(timeout=WAIT)) is not None:  # an ERROR, or nothing, then the end
                    assert frame.command == "ERROR", frame
            raw.close()
    raw = Raw(door)  # (HTTP on the STOMP port)
    raw.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    _refused(raw, "unknown command")
    watch.check()


def test_silence_before_connect_is_closed_at_the_deadline(door: Door, watch: Watch) -> None:
    raw = Raw(door)
    began = time.monotonic()
    assert raw.next(timeout=DEADLINE * 3) is None
    assert DEADLINE * 0.8 < time.monotonic() - began < DEADLINE * 2.5
    half = Raw(door)  # half a CONNECT, then nothing
    half.sock.sendall(b"CONNECT\naccept-ver")
    assert half.next(timeout=DEADLINE * 3) is None
    watch.check()


def test_missed_heart_beats_close_the_connection_and_its_subscription_ends(door: Door, watch: Watch) -> None:
    """A client that promised heart-beats and stops in the middle of a frame is taken for
    lost after twice the period; its subscription ends with it (events published after are
    not kept for it: a new connection with the same subscription id starts afresh)."""
    raw = Raw(door)
    raw.send("CONNECT", {"accept-version": "1.2", "heart-beat": "500,0", "passcode": ALICE})
    assert raw.expect("CONNECTED").header("heart-beat") == "1000,1000"
    raw.send("SUBSCRIBE", {"id": "s", "destination": "events", "selector": "run = 'beats'", "receipt": "r"})
    raw.expect("RECEIPT")
    raw.sock.sendall(b"SEND\ndestination:ev")  # (and then silence)
    began = time.monotonic()
    assert raw.next(timeout=6.0) is None
    assert 1.5 < time.monotonic() - began < 4.0
    watch.check()


def test_many_bad_connections_at_once_leave_the_broker_serving(door: Door, watch: Watch) -> None:
    """Fifty connections, each with a different bad input, all at once; then the broker
    still takes a new client and the watcher has lost nothing."""
    rng = random.Random(11)
    raws = []
    for i in range(50):
        raw = Raw(door)
        kind = i % 5
        if kind == 0:
            raw.sock.sendall(bytes(rng.randrange(256) for _ in range(512)))
        elif kind == 1:
            raw.sock.sendall(encode(Frame("CONNECT", [("accept-version", "9.9")])))
        elif kind == 2:
            raw.sock.sendall(
                encode(Frame("CONNECT", [("accept-version", "1.2"), ("passcode", ALICE)])) + b"NOPE\n\n\x00"
            )
        elif kind == 3:
            raw.sock.sendall(b"CONNECT\naccept-version:1.2\ncontent-length:99999999\n\n")
        raws.append(raw)  # (kind 4: silence)
    for raw in raws:
        with contextlib.suppress(OSError):
            while (frame := raw.next(timeout=WAIT)) is not None:
                assert frame.command in ("ERROR", "CONNECTED"), frame
        raw.close()
    fine = _subscribed(door, "after")
    fine.send("SEND", {"destination": "events"}, b'{"run": "after"}')
    assert _message(fine) == {"run": "after"}
    watch.check()
