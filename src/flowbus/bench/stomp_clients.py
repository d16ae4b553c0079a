"""The stomp.py client program of ``flowbus bench broker``, for every STOMP broker it measures:
ActiveMQ (``--baseline activemq``, :mod:`flowbus.bench.activemq`) and flowbus's own brokers at
their STOMP doors (``--protocol stomp``, :mod:`flowbus.bench.broker`).

How it works:

* **One program.** :func:`run` drives a :class:`Target`, which says only where the broker is
  (its STOMP doors, the destination, its processes, whose CPU is measured) and how it carries
  an event (its :class:`Carrier`). The connections, the subscription layout, the pipelining,
  the receipts, the end of the run and the check are this one code path for every target, so
  two targets' figures differ by their brokers and their carriers only. The selectors are
  given, the same text for every target (:func:`~flowbus.bench.activemq.jms_selector`).
* **The carriers**, the one difference in what goes on the wire. :data:`HEADERS` (ActiveMQ):
  JMS selectors read message properties, and through STOMP a property is a header, so an event
  goes as headers (:func:`event_headers`), the body empty, ``persistent: false`` (ActiveMQ's
  selectors read the header text as doubles: see :mod:`flowbus.bench.activemq`).
  :data:`JSON_BODY` (flowbus): the event is the JSON object of the body (``content-type:
  application/json``) and comes back so; the door's selectors compare JSON numbers by value
  (``level >= 7.0`` holds for the integer 7). The publisher's clock ``t`` rides with the event
  in both (a header; a field), and is read back at each delivery for the latency.
* **The layout.** ``clients`` subscriber connections (stomp.py ``Connection12``, no
  heart-beats), connection ``c`` at door ``c % len(doors)``, and one publisher connection at the
  first door. Subscription ``i`` (``selectors[i]`` in the ``selector`` header, id ``i``,
  non-durable, ``ack: auto``) on connection ``i % clients``, all pipelined; then on each
  connection a sentinel subscription (id ``probe``, the selector ``probe``) asking for a
  receipt: ``subscribe_s`` ends at the last of those receipts (a broker takes a connection's
  frames in order). Then the publisher sends the probe event
  (:data:`~flowbus.bench.workloads.STOCK_PROBE_EVENT`, a receipt asked) until every sentinel
  has had it: ``routed_s``. In a ring the subscriptions must reach the publisher's broker
  before the events go; with one broker the first probe does it. A probe delivered to
  another subscription (a filter without ``symbol = ...`` may take it) is not counted. The
  native rows (:mod:`flowbus.bench.broker`) make their sentinels and probe the same way.
* **The run.** The publisher sends the N events to the destination flat out (STOMP has no
  publish window: TCP's backpressure paces the publisher), a receipt asked on the last.
  ``events_per_s_in`` is N / (first send .. the later of that receipt and the last expected
  delivery): it ends when every subscriber has had every event, as the native rows' figure
  does. ``deliveries_per_s`` is the deliveries / (first send .. the last delivery).
  Deliveries are awaited until every expected one has come, or none came for ``stall_s``
  seconds. ``deliveries_match_offline``: each subscription got exactly what the offline
  evaluation counts. An ERROR frame, or a phase past its time, ends the run with an
  :class:`~flowbus.errors.ExternalError` (what was measured by then stays in ``out``).
* **The end.** :attr:`Target.ending` runs once the measuring is over (also after an error),
  before the clients disconnect: flowbus's rows stop their brokers there, as the native rows
  do, because a disconnect ends each of the connection's subscriptions on the broker, which is
  slow at large K and not measured.
* stomp.py runs a thread per connection, all in this process: ``client_cpu_s`` is this
  process's CPU while publishing, the target's ``cpu_field`` its brokers' (summed), and
  ``other_cpu_s`` the rest of the machine's.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import stomp

from flowbus.bench.workloads import STOCK_PROBE, STOCK_PROBE_EVENT
from flowbus.errors import ExternalError
from flowbus.experiments.cpu import machine_busy_s, process_cpu_s

Progress = Callable[[str, int, int], None]

PROBE_ID = "probe"  # the sentinel subscriptions' id (the others are numbers)
ROUTE_TIMEOUT = 120.0  # seconds for the probe to reach every sentinel

# ------------------------------------------------------------------------------ the carriers


def event_headers(event: dict[str, Any]) -> dict[str, str]:
    """``event`` as STOMP headers: strings as they are, numbers as Python writes them (``24.42``,
    ``1e-05``: both ``Double.valueOf`` text), booleans ``true`` / ``false``; a missing value is
    no header."""
    out = {}
    for key, value in event.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


@dataclass(frozen=True, slots=True)
class Carrier:
    """How a target carries an event in a SEND and gives it back in a MESSAGE: ``encode``
    makes a SEND's headers and body of an event (``t`` included); ``read`` gives the event of
    a MESSAGE frame back (its values as the carrier has them: header text, or JSON's)."""

    name: str
    encode: Callable[[dict[str, Any]], tuple[dict[str, str], str]]
    read: Callable[[Any], Mapping[str, Any]]


def _as_headers(event: dict[str, Any]) -> tuple[dict[str, str], str]:
    return event_headers(event) | {"persistent": "false"}, ""


def _as_json(event: dict[str, Any]) -> tuple[dict[str, str], str]:
    return {"content-type": "application/json"}, json.dumps(event, separators=(",", ":"))


HEADERS = Carrier("headers", _as_headers, lambda frame: frame.headers)
"""ActiveMQ's: the event as headers, the body empty."""
JSON_BODY = Carrier("JSON body", _as_json, lambda frame: json.loads(frame.body))
"""flowbus's door's: the event as the JSON object of the body."""


@dataclass(frozen=True)
class Target:
    """A broker (or a ring of them) to drive: ``name`` in progress and errors; the publisher at
    ``doors[0]``, subscriber connection ``c`` at ``doors[c % len(doors)]``; every SEND and
    SUBSCRIBE to ``destination``; ``pids``: its processes, whose CPU time while publishing is
    reported as ``cpu_field``; ``ending``: run before the clients disconnect (see the module
    note)."""

    name: str
    doors: Sequence[tuple[str, int]]
    destination: str
    carrier: Carrier
    pids: Sequence[int]
    cpu_field: str
    ending: Callable[[], None] | None = None


# ------------------------------------------------------------------------------ the clients


class _Listener:
    """What one STOMP connection received (its own thread writes, the main thread reads).

    stomp.py looks a listener's ``on_<frame>`` callbacks up on the instance; they are bound
    there, because flowbus keeps methods named ``on_message`` for its cores (tests/test_cores.py)."""

    def __init__(self, counts: np.ndarray, read: Callable[[Any], Mapping[str, Any]]) -> None:
        self.counts = counts  # per subscription id: each connection writes only its own ids
        self.read = read
        self.latency = array("d")
        self.total = 0
        self.last = 0.0  # perf_counter of the latest delivery
        self.probed = False  # its sentinel subscription had the probe
        self.receipts: dict[str, float] = {}
        self.errors: list[str] = []
        self.on_message, self.on_receipt, self.on_error = self._delivered, self._receipt, self._error

    def _delivered(self, frame: Any) -> None:
        sub, event = frame.headers["subscription"], self.read(frame)
        if event.get("symbol") == STOCK_PROBE:  # (for the sentinels; other filters may take it too)
            self.probed = self.probed or sub == PROBE_ID
            return
        self.latency.append(time.time() - float(event["t"]))
        self.counts[int(sub)] += 1
        self.total += 1
        self.last = time.perf_counter()

    def _receipt(self, frame: Any) -> None:
        self.receipts[frame.headers["receipt-id"]] = time.perf_counter()

    def _error(self, frame: Any) -> None:
        self.errors.append(f"{frame.headers.get('message', '')}: {str(frame.body).splitlines()[:1]}")


def _connect(door: tuple[str, int], listener: _Listener) -> Any:
    conn = stomp.Connection12([door], heartbeats=(0, 0))
    conn.set_listener("bench", listener)
    conn.connect(wait=True)
    return conn


def _wait(
    target: Target, done: Callable[[], bool], listeners: Sequence[_Listener], timeout: float, what: str
) -> None:
    """Until ``done()``; an :class:`ExternalError` on an ERROR frame or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        errors = [e for lis in listeners for e in lis.errors]
        if errors:
            raise ExternalError(f"{target.name} refused something while {what}: {errors[0]}")
        if time.monotonic() > deadline:
            raise ExternalError(f"{target.name}: {what} not done after {timeout:.0f} s")
        time.sleep(0.002)


def _drain(listeners: Sequence[_Listener], want: int, stall_s: float) -> int:
    """The deliveries once ``want`` have come, or once none came for ``stall_s`` seconds."""
    got, since = -1, time.monotonic()
    while (now := sum(lis.total for lis in listeners)) < want:
        if now != got:
            got, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            break
        time.sleep(0.002)
    return now


# ------------------------------------------------------------------------------ the run


def run(
    target: Target, selectors: Sequence[str], probe: str, events: Sequence[dict[str, Any]],
    expected: np.ndarray, out: dict[str, Any], *, clients: int, progress: Progress | None = None,
    subscribe_timeout: float = 900.0, stall_s: float = 30.0,
) -> None:  # fmt: skip
    """The workload through ``target`` (see the module note): ``selectors[i]`` is subscription
    ``i``'s, ``probe`` the sentinels'; ``expected[i]`` its deliveries offline. Fills ``out`` in
    as it goes; raises when the run fails."""
    counts = np.zeros(len(selectors), np.int64)
    subs = [_Listener(counts, target.carrier.read) for _ in range(clients)]
    listeners = [*subs, _Listener(counts, target.carrier.read)]  # (the publisher's last)
    out["subscriber_connections"] = clients
    conns: list[Any] = []
    try:
        try:
            doors = [target.doors[c % len(target.doors)] for c in range(clients)] + [target.doors[0]]
            for door, listener in zip(doors, listeners, strict=True):
                conns.append(_connect(door, listener))
            _subscribe(target, conns, selectors, probe, out, listeners, progress, subscribe_timeout)
            _publish(target, conns[-1], events, expected, out, listeners, progress, stall_s)
        finally:
            if target.ending is not None:
                target.ending()
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.disconnect()
        if errors := [e for lis in listeners for e in lis.errors]:
            out["stomp_errors"] = errors[:10]
    lat_ms = np.frombuffer(b"".join(s.latency.tobytes() for s in subs) or bytes(8)) * 1000.0
    out.update(
        deliveries=int(counts.sum()),
        latency_p50_ms=float(np.percentile(lat_ms, 50)),
        latency_p99_ms=float(np.percentile(lat_ms, 99)),
        latency_max_ms=float(lat_ms.max()),
        deliveries_match_offline=bool(np.array_equal(counts, expected)),
    )


def _subscribe(
    target: Target, conns: list[Any], selectors: Sequence[str], probe: str, out: dict[str, Any],
    listeners: list[_Listener], progress: Progress | None, timeout: float,
) -> None:  # fmt: skip
    """Subscribe, pipelined; then the sentinels, with receipts (``subscribe_s``); then probe until
    every sentinel had the probe (``routed_s``)."""
    k, clients = len(selectors), len(conns) - 1
    subs, pub = listeners[:-1], listeners[-1]
    t0 = time.perf_counter()
    for i, selector in enumerate(selectors):
        headers = {"selector": selector}
        conns[i % clients].subscribe(target.destination, id=str(i), ack="auto", headers=headers)
        if progress and (i + 1) % 1000 == 0:
            progress(f"{target.name}: subscribe", i + 1, k)
    for c in range(clients):
        headers = {"selector": probe, "receipt": f"sub-{c}"}
        conns[c].subscribe(target.destination, id=PROBE_ID, ack="auto", headers=headers)

    def subscribed() -> bool:
        return all(f"sub-{c}" in s.receipts for c, s in enumerate(subs))

    _wait(target, subscribed, listeners, timeout, "subscribing")
    out["subscribe_s"] = time.perf_counter() - t0
    deadline, n = time.monotonic() + ROUTE_TIMEOUT, 0
    while not all(s.probed for s in subs):
        if time.monotonic() > deadline:
            missing = [target.doors[c % len(target.doors)] for c, s in enumerate(subs) if not s.probed]
            raise ExternalError(
                f"{target.name}: the probe did not reach the subscriber connections at {missing} in "
                f"{ROUTE_TIMEOUT:.0f} s (their subscriptions are not routed to the publisher's broker)"
            )
        n += 1
        headers, body = target.carrier.encode({**STOCK_PROBE_EVENT, "t": time.time()})
        headers["receipt"] = receipt = f"probe-{n}"
        conns[-1].send(target.destination, body, headers=headers)
        _wait(target, partial(pub.receipts.__contains__, receipt), listeners, ROUTE_TIMEOUT, "probing")
        time.sleep(0.02)
    out["routed_s"] = time.perf_counter() - t0


def _publish(
    target: Target, conn: Any, events: Sequence[dict[str, Any]], expected: np.ndarray, out: dict[str, Any],
    listeners: list[_Listener], progress: Progress | None, stall_s: float,
) -> None:  # fmt: skip
    """Send the events, then wait for the last one's receipt and every expected delivery (or
    ``stall_s`` seconds without one)."""
    pub, want, encode = listeners[-1], int(expected.sum()), target.carrier.encode
    out["loadavg_before_publish"] = os.getloadavg()[0]
    cpu0, busy0 = time.process_time(), machine_busy_s()
    server0 = [process_cpu_s(pid) for pid in target.pids]
    t0 = time.perf_counter()
    for n, event in enumerate(events, 1):
        headers, body = encode({**event, "t": time.time()})
        if n == len(events):
            headers["receipt"] = "published"
        conn.send(target.destination, body, headers=headers)
        if progress and n % 1000 == 0:
            progress(f"{target.name}: publish", n, len(events))
    _wait(target, lambda: "published" in pub.receipts, listeners, max(120.0, len(events) / 50), "publishing")
    got = _drain(listeners, want, stall_s)
    last = max(lis.last for lis in listeners)
    t_in = max(pub.receipts["published"], last) - t0
    server = sum(process_cpu_s(pid) - c for pid, c in zip(target.pids, server0, strict=True))
    client = time.process_time() - cpu0
    out.update(
        publish_s=t_in,
        events_per_s_in=len(events) / t_in,
        deliveries_per_s=got / (last - t0) if got else 0.0,
        client_cpu_s=client,
        other_cpu_s=max(0.0, machine_busy_s() - busy0 - server - client),
    )
    out[target.cpu_field] = server
