"""A campaign's clients: publishers at a steady rate and durable subscribers, everything logged.

How it works: one process (``python -m flowbus.chaos.workload SPEC.json``, run in the
clients' host) reads a :class:`Spec` and runs

* **publishers**, one client each, given every broker (their own first): event ``k`` of
  publisher ``p`` is :func:`event_of` ``(p, k)``, whose ``quantity`` (``p * STRIDE + k``)
  is its identity. Event ``k`` is published at ``start + k / rate`` (later if the client's
  window is full: the publisher waits, as an application would). Each publish's sequence
  number and time are logged; its acknowledgement is seen when the number leaves the
  client's :attr:`~flowbus.client.Client.pending` (looked at every 20 ms), a refusal or a
  timeout when the client raises :class:`~flowbus.errors.PublishError` naming it;
* **subscribers**, one client each, given every broker (their own first), each with
  durable subscriptions of mixed selectivity; every event taken is logged with the
  subscription, the broker the client was connected to, and the time;
* **a deployed flow** (``flow``, :data:`FLOW` in a campaign), deployed before anything is
  subscribed: a publisher whose ``space`` is the flow's source publishes into it, and
  subscriptions whose ``space`` is one of its derived spaces take what the brokers derive
  (every derived event keeps ``quantity``, the identity of the event it came from). So a
  flow's edges, its derived spaces and its state's partitions are under fire too.

It prints ``ready`` once every subscription is made (the campaign's clock of faults starts
then), publishes for ``publish_for`` seconds, waits for the publishes to be acknowledged
(at most ``settle`` seconds, and at least the client's ``publish_timeout`` and
:data:`HUNG_AFTER`: by then each is acknowledged or given up) and for the subscribers to
be settled (connected, and ``quiet`` seconds with no event, within ``settle`` too: a
subscriber between brokers is quiet, and what waits for it would be counted lost), then
writes ``summary.json`` and exits. Each client's moves between brokers (connected, left and
why) go to its standard error, the campaign's ``workload.log``. The logs are CSV files in
``out``, flushed every second (a run cut short keeps what came until then):
``publishes.csv`` (``publisher,k,pseq,sent,acked,error``: one row when sent, one when
resolved) and ``deliveries.csv`` (``sub,quantity,broker,t,n``; ``n``: the count a state's
event carries, empty for the others). ``where.json`` says, as it
changes, the broker each publisher is connected to (``{publisher: "host:port"}``: the
nemesis cuts a publisher's link at an acknowledgement there).

The campaign's checker (:mod:`flowbus.chaos.check`) recomputes every event from ``(p, k)``
and every subscription's filter from the spec: nothing else is needed offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "COUNT_FILTERS",
    "FLOW",
    "FLOW_FILTERS",
    "STRIDE",
    "Spec",
    "SubSpec",
    "event_of",
    "filters_for",
    "main",
]

STRIDE = 10_000_000
"""``quantity = publisher * STRIDE + k``: an event's identity, unique in a run."""

FLOW = """\
name: chaos
description: The fault campaign's flow, deployed on the brokers under fire.
spaces:
  trades: {kind: source, schema: {symbol: str, price: float, quantity: int, exchange: str, level: int}}
  priced: {kind: events, schema: {symbol: str, quantity: int, notional: float, level: int}}
  big: {kind: sink, schema: {symbol: str, quantity: int, notional: float, level: int}}
  ticks: {kind: events, schema: {symbol: str, quantity: int}}
  tally:
    kind: state
    schema: {symbol: str, n: int, last: int}
    key: [symbol]
    initial: {n: 0, last: 0}
  counted: {kind: sink, schema: {symbol: str, n: int, quantity: int}}
rulesets:
  tally:
    key: {symbol: symbol}
    rules:
      - {set: {n: n + 1, last: quantity}}
  counts:
    key: {symbol: symbol}
    rules:
      - {set: {n: event.n, last: event.quantity}}
arcs:
  - name: T
    from: trades
    to: priced
    transform: {symbol: symbol, quantity: quantity, notional: price*level, level: level}
  - {name: S, from: priced, to: big, select: "level >= 3"}
  - {name: K, from: trades, to: ticks, transform: {symbol: symbol, quantity: quantity}}
  - {name: C, from: ticks, to: tally, collapse: tally}
  - {name: E, from: tally, to: counted, expand: counts}
"""
"""The campaign's flow: events of :func:`event_of` published into ``trades`` are priced, and
those of level 3 and up reach ``big`` (a transform and a select, run as routing plus edge
transforms on the brokers); and each symbol's trades are counted in the state ``tally``
(partitioned over the ring, its rows backed up and taken over with the rest), each change
published into ``counted`` as ``[symbol, n, quantity]``: the ``n``-th trade of its symbol."""

FLOW_FILTERS = ("", "notional > 250", 'symbol in {"S1", "S2", "S3", "S4"}', "level = 5 & notional < 300")
"""Filters over ``big`` for the subscriptions of the flow's derived space."""

COUNT_FILTERS = ("", "n >= 40", 'symbol in {"S5", "S6", "S7"}', 'n <= 60 & symbol != "S0"')
"""Filters over ``counted`` for the subscriptions downstream of the flow's state."""

SYMBOLS = 20
EXCHANGES = ("NYSE", "NASDAQ", "LSE", "TSE")

# (filters of mixed selectivity: about 100 %, 40 %, 25 %, 12 %, 10 %, 5 %, 4 % of the events)
_SHAPES = (
    "level >= 1",
    "level >= 4",
    'exchange = "{x}"',
    'exchange = "{x}" & price < 50',
    "price > {hi}",
    'symbol = "S{s}"',
    'symbol in {{"S{s}", "S{t}"}} & level <= 2',
)


HUNG_AFTER = 5.0
"""Seconds past the client's ``publish_timeout`` a publisher waits for its last publishes
at the end (each is acknowledged or given up by then): one still pending is *hung*."""


def event_of(publisher: int, k: int) -> dict[str, Any]:
    """Event ``k`` (from 1) of publisher ``publisher``: the same in every process."""
    rng = random.Random(publisher * STRIDE + k)
    return {
        "symbol": f"S{rng.randrange(SYMBOLS)}",
        "price": round(rng.uniform(0.0, 100.0), 2),
        "quantity": publisher * STRIDE + k,
        "exchange": EXCHANGES[rng.randrange(len(EXCHANGES))],
        "level": rng.randint(1, 5),
    }


@dataclass(frozen=True, slots=True)
class SubSpec:
    """A durable subscription: its name (the durable id) and filter over ``stocks``."""

    id: str
    filter: str
    space: str = ""  # (a derived space of the flow; "": the spec's space)


@dataclass(frozen=True, slots=True)
class Client:
    """A publisher or subscriber client: its name, the broker it tries first, its
    subscriptions; a publisher's space and rate ("" and 0: the spec's)."""

    name: str
    first: int
    subs: tuple[SubSpec, ...] = ()
    space: str = ""
    rate: float = 0.0


def filters_for(n: int, seed: int) -> list[str]:
    """``n`` filters of mixed selectivity over ``stocks``, seeded."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        shape = _SHAPES[i % len(_SHAPES)]
        s, t = rng.sample(range(SYMBOLS), 2)
        out.append(shape.format(x=rng.choice(EXCHANGES), hi=round(rng.uniform(85.0, 95.0), 1), s=s, t=t))
    return out


@dataclass(frozen=True)
class Spec:
    """What the workload process runs (written as JSON by the campaign)."""

    brokers: tuple[str, ...]
    publishers: tuple[Client, ...]
    subscribers: tuple[Client, ...]
    out: str
    rate: float = 150.0  # events a second, per publisher
    publish_for: float = 60.0  # seconds of publishing
    settle: float = 30.0  # seconds at most for acknowledgements and quiet after it
    quiet: float = 3.0  # seconds with no event that make a subscription quiet
    space: str = "stocks"
    client: dict[str, Any] = field(default_factory=dict)  # options of flowbus.connect
    flow: str = ""  # a flow document deployed before anything is subscribed ("": none)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        raw = json.loads(text)
        return cls(
            brokers=tuple(raw["brokers"]),
            publishers=tuple(_client(c) for c in raw["publishers"]),
            subscribers=tuple(_client(c) for c in raw["subscribers"]),
            **{k: raw[k] for k in ("out", "rate", "publish_for", "settle", "quiet", "space", "client")},
            flow=raw.get("flow", ""),
        )

    def brokers_from(self, first: int) -> list[str]:
        """Every broker, ``first`` first (the others in ring order after it)."""
        n = len(self.brokers)
        return [self.brokers[(first + i) % n] for i in range(n)]


def _client(raw: dict[str, Any]) -> Client:
    subs = tuple(SubSpec(**s) for s in raw["subs"])
    return Client(raw["name"], raw["first"], subs, raw.get("space", ""), raw.get("rate", 0.0))


class _Log:
    """A CSV file written as rows come, flushed every second."""

    def __init__(self, path: Path, header: list[str]) -> None:
        self._f: TextIO = path.open("w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(header)
        self._flushed = time.monotonic()

    def row(self, *values: Any) -> None:
        self._w.writerow(values)
        if time.monotonic() - self._flushed > 1.0:
            self._f.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        self._f.close()


class _Where:
    """``where.json``: the broker each publisher is connected to, written when one changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.brokers: dict[str, str] = {}

    def set(self, publisher: str, broker: str | None) -> None:
        if broker is None or self.brokers.get(publisher) == broker:
            return
        self.brokers[publisher] = broker
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.brokers))
        tmp.replace(self.path)


class _Publisher:
    """One publishing client: its events at a steady rate, each publish's fate logged."""

    def __init__(self, spec: Spec, index: int, log: _Log, where: _Where | None = None) -> None:
        self.spec = spec
        self.index = index
        self.log = log
        self.where = where
        self.sent: dict[int, int] = {}  # pseq -> k, not resolved yet
        self.counts = {"sent": 0, "acked": 0, "refused": 0, "hung": 0}

    async def run(self, start: float) -> None:
        from flowbus.client import connect
        from flowbus.errors import PublishError

        me = self.spec.publishers[self.index]
        space, rate = me.space or self.spec.space, me.rate or self.spec.rate
        until = start + self.spec.publish_for
        async with connect(*self.spec.brokers_from(me.first), name=me.name, **self.spec.client) as client:
            watch = asyncio.ensure_future(self._watch(client))
            k = 0
            try:
                while time.time() < until:
                    k += 1
                    await asyncio.sleep(max(0.0, start + k / rate - time.time()))
                    while True:
                        try:
                            pseq = await client.publish(space, event_of(self.index, k))
                            break
                        except PublishError as e:
                            self._resolved(e.pseq, error=e.reason)
                    self.sent[pseq] = k
                    self.counts["sent"] += 1
                    self.log.row(me.name, k, pseq, f"{time.time():.4f}", "", "")
                timeout = self.spec.client.get("publish_timeout")
                drain = self.spec.settle if timeout is None else max(self.spec.settle, timeout + HUNG_AFTER)
                await self._drain(client, deadline=time.time() + drain)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
                self._acked(client)
                for pseq in list(self.sent):
                    self._resolved(pseq, error="hung: neither acknowledged nor refused at the end")
                    self.counts["hung"] += 1

    async def _drain(self, client: Any, *, deadline: float) -> None:
        from flowbus.errors import PublishError

        while time.time() < deadline:
            try:
                await client.flush(timeout=max(0.01, deadline - time.time()))
                return
            except PublishError as e:
                self._resolved(e.pseq, error=e.reason)
            except TimeoutError:
                return

    async def _watch(self, client: Any) -> None:
        while True:
            if self.where is not None:
                self.where.set(self.spec.publishers[self.index].name, client.broker)
            await asyncio.sleep(0.02)
            self._acked(client)

    def _acked(self, client: Any) -> None:
        for e in client.take_errors():  # (refused or given up: out of pending too, not acked)
            self._resolved(e.pseq, error=e.reason)
        pending = client.pending
        for pseq in [p for p in self.sent if p not in pending]:
            self._resolved(pseq)

    def _resolved(self, pseq: int, *, error: str | None = None) -> None:
        k = self.sent.pop(pseq, None)
        if k is None:
            return
        name = self.spec.publishers[self.index].name
        if error is None:
            self.counts["acked"] += 1
            self.log.row(name, k, pseq, "", f"{time.time():.4f}", "")
        else:
            self.counts["refused"] += 1
            self.log.row(name, k, pseq, "", "", error)


class _Subscriber:
    """One subscribing client and its durable subscriptions, every event taken logged."""

    def __init__(self, spec: Spec, index: int, log: _Log) -> None:
        self.spec = spec
        self.me = spec.subscribers[index]
        self.log = log
        self.last = time.time()  # when the last event came
        self.taken = 0
        self.client: Any = None
        self._up_since: float | None = None  # connected since (as seen by settled)

    def settled(self, quiet: float) -> bool:
        """No event for ``quiet`` seconds, and connected (a client between brokers, or refused
        by all, is quiet too: what waits for it has not come yet)."""
        from flowbus.client.client import Status

        now = time.time()
        if self.client is None or self.client.status is not Status.CONNECTED:
            self._up_since = None
            return False
        if self._up_since is None:  # (back: what waited for it comes now)
            self._up_since = now
        return now - max(self.last, self._up_since) >= quiet

    async def run(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        from flowbus.client import connect

        async with connect(
            *self.spec.brokers_from(self.me.first), name=self.me.name, **self.spec.client
        ) as client:
            self.client = client
            subs = [await self._subscribe(client, s) for s in self.me.subs]
            ready.set()
            tasks = [
                asyncio.ensure_future(self._record_deliveries(client, s.id, sub))
                for s, sub in zip(self.me.subs, subs, strict=True)
            ]
            await stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _subscribe(self, client: Any, s: SubSpec) -> Any:
        """``s`` made durable at the client's broker; a derived space may not be known there
        yet (the flow's record travels the ring): tried again for 30 s."""
        from flowbus.client import SubscribeError

        end = time.time() + 30.0
        while True:
            try:
                return await client.subscribe(s.space or self.spec.space, s.filter, durable=s.id)
            except SubscribeError:
                if not s.space or time.time() > end:
                    raise
                await asyncio.sleep(0.5)

    async def _record_deliveries(self, client: Any, sub_id: str, sub: Any) -> None:
        async for batch in sub.batches(1000):
            now = time.time()
            broker = client.broker or ""
            for event in batch:
                self.log.row(sub_id, event["quantity"], broker, f"{now:.4f}", event.get("n", ""))
            self.taken += len(batch)
            self.last = now


async def run(spec: Spec) -> dict[str, Any]:
    """Run the workload (see the module note); its summary."""
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    pub_log = _Log(out / "publishes.csv", ["publisher", "k", "pseq", "sent", "acked", "error"])
    sub_log = _Log(out / "deliveries.csv", ["sub", "quantity", "broker", "t", "n"])
    stop = asyncio.Event()
    if spec.flow:
        await _deploy(spec)
    subscribers = [_Subscriber(spec, i, sub_log) for i in range(len(spec.subscribers))]
    readies = [asyncio.Event() for _ in subscribers]
    sub_tasks = [asyncio.ensure_future(s.run(r, stop)) for s, r in zip(subscribers, readies, strict=True)]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60.0)
        start = time.time()
        print(f"ready {start:.4f}", flush=True)
        where = _Where(out / "where.json")
        publishers = [_Publisher(spec, i, pub_log, where) for i in range(len(spec.publishers))]
        await asyncio.gather(*(p.run(start) for p in publishers))
        end = time.time() + spec.settle
        while time.time() < end and not all(s.settled(spec.quiet) for s in subscribers):
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*sub_tasks)
    finally:
        stop.set()
        for t in sub_tasks:
            t.cancel()
        pub_log.close()
        sub_log.close()
    summary = {
        "start": start,
        "end": time.time(),
        "publishers": [p.counts for p in publishers],
        "taken": [s.taken for s in subscribers],
    }
    (out / "summary.json").write_text(json.dumps(summary))
    return summary


async def _deploy(spec: Spec) -> None:
    """The spec's flow deployed on the brokers (tried again for 60 s: the ring may still be
    forming)."""
    from flowbus.client import ClientError, connect

    end = time.time() + 60.0
    async with connect(*spec.brokers_from(0), name="deployer", **spec.client) as client:
        while True:
            try:
                await client.deploy(spec.flow)
                return
            except ClientError:
                if time.time() > end:
                    raise
                await asyncio.sleep(1.0)


def main(argv: list[str] | None = None) -> None:
    import logging

    logging.basicConfig(format="%(created).3f %(name)s %(message)s", level=logging.WARNING)
    logging.getLogger("flowbus.client").setLevel(logging.INFO)  # (each client's moves, in workload.log)
    args = sys.argv[1:] if argv is None else argv
    spec = Spec.from_json(Path(args[0]).read_text())
    asyncio.run(run(spec))


if __name__ == "__main__":
    main()
