"""A durable STOMP subscription over a ``kill -9`` of its broker: a stomp.py client with
``client-individual`` acknowledgements, given every broker's STOMP door, goes on at
another broker and consumes every matching event once.

The run: a ring of three broker processes, each with a STOMP door; a durable subscription
(``client-id`` and ``durable-subscription-name``, a JMS selector) at the victim's door; a
native publisher at another broker sends a steady stream; half-way the victim is killed
(``kill -9``). The subscriber's client goes through its list of doors until one takes the
subscription again (a door that does not serve it answers an ERROR naming the broker that
does) and goes on. It handles each message, then acknowledges it with a receipt. A RECEIPT
comes once the ring keeps how far the client consumed (:mod:`flowbus.broker.stomp`): no
broker sends that message again. An ACK whose RECEIPT never came (its broker died first)
is in doubt, as with any broker: the message may come again, or not.

Checked against the offline evaluation of the selector over every acknowledged publish:
nothing lost (each one handled), nothing sent again once its ACK was receipted, and only a
few in doubt sent again."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]
from tests.broker.conftest import StartBroker

from flowbus.broker.config import parse_address
from flowbus.broker.process import stomp_of
from flowbus.client.sync import SyncClient
from flowbus.filters.selector import selector

pytestmark = pytest.mark.broker

EVENTS = 6000
RATE = 600.0  # events per second
KILL_AT = EVENTS // 2
SELECTOR = "quantity > 30 AND (symbol LIKE 'A%' OR price BETWEEN 10 AND 60)"
SYMBOLS = ["AAPL", "AMZN", "IBM", "HP", "ABB", "MSFT"]


def _event(n: int) -> dict[str, Any]:
    return {
        "symbol": SYMBOLS[n * 7 % len(SYMBOLS)],
        "price": float(n * 13 % 100),
        "quantity": n % 100,
        "exchange": "NYSE",
        "level": n,
    }


class Consumer(stomp.ConnectionListener):  # type: ignore[misc]
    """The durable subscriber's client: through ``doors`` in turn until one serves its
    subscription; acknowledges each message with a receipt; consumed = RECEIPT came."""

    def __init__(self, doors: list[tuple[str, int]]) -> None:
        self.doors = doors
        self.at = 0  # the door tried last
        self.lock = threading.Lock()
        self.waiting: dict[str, str] = {}  # receipt id -> event id (its ACK's)
        self.consumed: Counter[str] = Counter()  # event id -> times its ACK was receipted
        self.handled: Counter[str] = Counter()  # event id -> times it was handled (and acknowledged)
        self.after_receipt = 0  # messages that came again after their ACK was receipted
        self.delivered = 0
        self.connections = 0
        self.errors: list[str] = []
        self.conn: Any = None
        self.subscribed = threading.Event()
        self.lost = threading.Event()

    def attach(self, deadline: float) -> None:
        """Connect and subscribe at the next door that serves the subscription."""
        while time.monotonic() < deadline:
            host, port = self.doors[self.at % len(self.doors)]
            self.at += 1
            self.subscribed.clear()
            self.lost.clear()
            conn = stomp.Connection12([(host, port)], heartbeats=(0, 0))
            conn.set_listener("consumer", self)
            with contextlib.suppress(stomp.exception.ConnectFailedException, OSError):
                conn.connect(wait=True, headers={"client-id": "crash-consumer"})
                self.conn, self.connections = conn, self.connections + 1
                conn.subscribe(
                    "/topic/stocks",
                    id="d",
                    ack="client-individual",
                    headers={
                        "selector": SELECTOR,
                        "durable-subscription-name": "kept",
                        "receipt": "subscribed",
                    },
                )
                if self.subscribed.wait(15.0):
                    return
            with contextlib.suppress(Exception):
                conn.disconnect()
            time.sleep(0.5)
        raise AssertionError(f"no door took the subscription again: {self.errors[-3:]}")

    def on_message(self, frame: Any) -> None:
        eid, mid = frame.headers["event-id"], frame.headers["ack"]
        receipt = f"ack-{self.connections}-{mid}"
        with self.lock:
            self.delivered += 1
            self.after_receipt += eid in self.consumed
            self.handled[eid] += 1
            self.waiting[receipt] = eid
        with contextlib.suppress(Exception):  # (the connection may be dying)
            self.conn.ack(mid, receipt=receipt)

    def on_receipt(self, frame: Any) -> None:
        rid = frame.headers["receipt-id"]
        if rid == "subscribed":
            self.subscribed.set()
            return
        with self.lock:
            eid = self.waiting.pop(rid, None)
            if eid is not None:
                self.consumed[eid] += 1

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers.get("message", ""))

    def on_disconnected(self) -> None:
        self.lost.set()


def test_a_durable_client_individual_subscription_survives_kill_9_of_its_broker(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("heartbeat: 4.0\n")  # (as the native kill -9 test: see tests/broker/test_crash.py)
    first = start_broker(data=tmp_path / "b0", config=config, stomp="127.0.0.1:0")
    procs = [first] + [
        start_broker(join=[first[1]], data=tmp_path / f"b{i}", config=config, stomp="127.0.0.1:0")
        for i in (1, 2)
    ]
    doors = [parse_address(stomp_of(proc) or "") for proc, _ in procs]
    victim, survivor = 1, 0
    time.sleep(1.0)  # (the ring settles)
    consumer = Consumer(doors[victim:] + doors[:victim])  # (the victim's door first)
    consumer.attach(time.monotonic() + 30)
    time.sleep(0.5)  # (the subscription reaches every broker)

    sent: dict[int, dict[str, Any]] = {}  # publish sequence number -> event
    with SyncClient(procs[survivor][1], *(a for _, a in procs), name="crash-publisher") as publisher:
        began = time.monotonic()
        for n in range(EVENTS):
            if n == KILL_AT:
                procs[victim][0].kill()
            event = _event(n)
            sent[publisher.publish("stocks", event)] = event
            time.sleep(max(0.0, began + (n + 1) / RATE - time.monotonic()))
            if consumer.lost.is_set() and n > KILL_AT:  # (its broker is gone: on at another door)
                consumer.attach(time.monotonic() + 60)
        publisher.flush(120.0)
        name = publisher.client.name

    wanted = selector(SELECTOR)
    expected = {f"{name}:{pseq}" for pseq, e in sent.items() if wanted.matches(e)}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and set(consumer.handled) < expected:
        if consumer.lost.is_set():
            consumer.attach(time.monotonic() + 30)
        time.sleep(0.2)
    time.sleep(1.0)  # (nothing more comes)
    handled, consumed = consumer.handled, consumer.consumed
    in_doubt = {eid for eid, k in handled.items() if k > 1}
    print(
        f"expected {len(expected)}, handled {len(handled)}, receipted {len(consumed)}, "
        f"delivered {consumer.delivered}, again in doubt {len(in_doubt)}, "
        f"connections {consumer.connections}, errors {consumer.errors[:3]}"
    )
    assert consumer.connections >= 2  # (it did go on at another broker)
    assert set(handled) == expected, sorted(expected - set(handled))[:10]  # nothing lost, nothing else
    assert consumer.after_receipt == 0 and max(consumed.values()) == 1  # never again once receipted
    assert len(in_doubt) <= 50, sorted(in_doubt)[:10]  # (ACKs in flight at the kill: not the past)
    with contextlib.suppress(Exception):
        consumer.conn.disconnect()
