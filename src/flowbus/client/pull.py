"""A pulled durable subscription, from the client's side: read its broker's queue by position,
acknowledge up to a position (the broker's side and the guarantees: :mod:`flowbus.broker.pull`).

::

    queue = await PulledSubscription.open(client, "spark-nyse", "NYSE", "price > 10")
    top = await queue.top()
    for position, event_id, event in await queue.read(after=0, upto=top):
        ...
    await queue.ack(top)                          # done with everything up to top

How it works: each call is one request answered by one ``Reply``; a read of more rows than
one answer holds asks again from the last position it got. The subscription lives on the
broker the client was connected to when it was opened; a client that finds itself on
another broker gets a :class:`~flowbus.errors.SubscribeError` naming it.

**Exactly once across a takeover** (what Spark's source keeps, :mod:`flowbus.spark.bus`).
Positions are one store's: when the subscription's broker dies, its taker numbers the
events its own way (and the ring may hand it an event the dead one had queued already).
So a reader keeps a :class:`Mark` instead of a bare position: the position, the store it
belongs to, and per publisher the highest sequence number read up to it (the broker gives
those, :meth:`PulledSubscription.advance`). A batch is every queued event of each publisher
between two marks (:meth:`PulledSubscription.between`): at the same store, read by
position; at another (the subscription moved), the whole queue is read and each publisher's
events are taken by their sequence numbers. This relies on each publisher's order, which the
ring keeps (docs/guarantees.md); an event whose id has no sequence number is always taken.
:func:`serving` finds the broker that serves a subscription now (``resume``: one that does
not answers "not here"), so a reader never makes a second one elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from flowbus.client import protocol as p
from flowbus.client.client import ALL_EVENTS, connect
from flowbus.errors import ClientError, SubscribeError

if TYPE_CHECKING:
    from flowbus.client.client import Client

__all__ = ["Mark", "PulledSubscription", "QueuedRow", "serving"]

QueuedRow = tuple[int, tuple[str, int], dict[str, Any]]
"""A queued event: (position, event id (publisher, pseq), event)."""

AWAIT_POLL = 0.5
"""Seconds between two reads of a subscription that awaits its former broker's queue."""

AWAIT_LIMIT = 600.0
"""Seconds a read waits at most for that queue (the broker gives up on it after its
``backlog_wait``, 300 s by default, and serves what it has)."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a reader is in a pulled subscription, whichever broker serves it: ``seq``, a
    position of ``store``'s queue ("": a store not known, a reader's offset from before
    marks), and ``marks``, per publisher the highest sequence number read up to it."""

    seq: int = 0
    store: str = ""
    marks: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "store": self.store, "marks": dict(sorted(self.marks.items()))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Mark:
        marks = {str(k): int(v) for k, v in (data.get("marks") or {}).items()}
        return cls(int(data.get("seq", 0)), str(data.get("store", "")), marks)

    def at(self, store: str) -> bool:
        """Whether this mark's position is one of ``store``'s."""
        return self.store in ("", store)


class PulledSubscription:
    """A durable subscription read by position (see the module note)."""

    def __init__(self, client: Client, sub_id: str, space: str, store: str = "") -> None:
        self.client = client
        self.id = sub_id
        self.space = space
        self.store = store  # the store whose positions these are (its broker's)

    @classmethod
    async def open(
        cls, client: Client, sub_id: str, space: str, filter: str | None = None, *, resume: bool = False
    ) -> PulledSubscription:
        """Make the pulled subscription ``sub_id`` to ``space`` (or find it: a restarted
        reader); ``resume``: only find it (a :class:`SubscribeError` "not here" at a broker
        that does not serve it)."""
        text = filter or ALL_EVENTS
        make = partial(p.QueueOpen, sub_id=sub_id, space=space, filter=text, resume=resume)
        data = await cls._ask(client, make, "open")
        return cls(client, sub_id, space, str(data.get("store", "")))

    async def top(self, *, wait: float = 0.0) -> int:
        """The highest position queued (0: nothing is, or the subscription awaits its former
        broker's queue: asked again for ``wait`` seconds at most)."""
        deadline = time.monotonic() + wait
        top = partial(p.QueueRead, sub_id=self.id, after=0, upto=0, limit=0)
        while True:
            data = await self._ask(self.client, top, "top of")
            if not data.get("awaiting") or not wait:
                return int(data["top"])
            self._still_awaiting(deadline)
            await asyncio.sleep(AWAIT_POLL)

    def _still_awaiting(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise SubscribeError(f"{self.id!r} at broker {self.client.broker} still awaits its former queue")

    async def read(self, *, after: int, upto: int, wait: float = AWAIT_LIMIT) -> list[QueuedRow]:
        """Every queued event at a position in ``(after, upto]``, in order (a subscription that
        awaits its former broker's queue is read once it has come: ``wait`` seconds at most)."""
        out: list[QueuedRow] = []
        deadline = time.monotonic() + wait
        while after < upto:
            read = partial(p.QueueRead, sub_id=self.id, after=after, upto=upto, limit=2000)
            data = await self._ask(self.client, read, "read")
            if data.get("awaiting"):
                self._still_awaiting(deadline)
                await asyncio.sleep(AWAIT_POLL)
                continue
            rows = data["rows"]
            if not rows:
                break
            out.extend((pos, (publisher, pseq), event) for pos, publisher, pseq, event in rows)
            after = rows[-1][0]
        return out

    async def ack(self, upto: int) -> int:
        """Drop the events up to position ``upto`` from the queue; how many are left."""
        data = await self._ask(self.client, partial(p.QueueAck, sub_id=self.id, upto=upto), "ack")
        return int(data["depth"])

    async def advance(self, start: Mark, upto: int | None = None) -> Mark:
        """The mark of everything queued here now (or up to position ``upto``: one cut of
        several subscriptions of this store), from ``start`` on (``start`` itself if nothing
        is new, or the subscription awaits its former broker's queue)."""
        after = start.seq if start.at(self.store) else 0
        last = (1 << 62) if upto is None else upto
        ask = partial(p.QueueRead, sub_id=self.id, after=after, upto=last, limit=0, marks=True)
        data = await self._ask(self.client, ask, "marks of")
        end = int(data["top"]) if upto is None else upto
        if data.get("awaiting") or end <= after:
            return start
        marks = dict(start.marks)
        for publisher, pseq in data["marks"].items():
            marks[publisher] = max(pseq, marks.get(publisher, -1))
        return Mark(end, self.store, marks)

    async def between(self, start: Mark, end: Mark) -> list[QueuedRow]:
        """The queued events after ``start`` up to ``end`` (see the module note): each
        publisher's whose sequence numbers are past ``start``'s mark and up to ``end``'s."""
        if not end.store:  # (an offset from before marks: positions only)
            return await self.read(after=start.seq, upto=end.seq)
        if self.store == end.store:
            rows = await self.read(after=start.seq if start.at(end.store) else 0, upto=end.seq)
        else:  # (the subscription moved since: its whole queue here, by sequence numbers)
            rows = await self.read(after=0, upto=await self.top(wait=AWAIT_LIMIT))
        low, high = start.marks, end.marks
        return [r for r in rows if _between(r[1], low, high)]

    async def commit(self, end: Mark) -> None:
        """Done with everything up to ``end``: acknowledged if its positions are this store's
        (another store's queue went with its broker)."""
        if end.seq > 0 and end.at(self.store):
            await self.ack(end.seq)

    @staticmethod
    async def _ask(client: Client, make: Callable[[int], Any], what: str) -> Any:
        sub_id = make(0).sub_id
        reply = await client._request(make)
        if not reply.ok:
            raise SubscribeError(f"{what} {sub_id!r} at broker {client.broker}: {reply.error}")
        return reply.data


def _between(eid: tuple[str, Any], low: Mapping[str, int], high: Mapping[str, int]) -> bool:
    """Whether the event ``eid`` is past its publisher's mark in ``low`` and up to ``high``'s
    (one without a sequence number always is)."""
    publisher, pseq = eid
    return not isinstance(pseq, int) or low.get(publisher, -1) < pseq <= high.get(publisher, -1)


@contextlib.asynccontextmanager
async def serving(
    addresses: Sequence[str],
    sub_id: str,
    space: str,
    filter: str | None = None,
    *,
    resume: bool,
    timeout: float = 30.0,
    name: str | None = None,
) -> AsyncIterator[PulledSubscription]:
    """The pulled subscription ``sub_id`` at the broker that serves it, on a connection of its
    own: each address tried in turn (a broker that does not answer, or does not serve it, is
    passed), again until ``timeout`` seconds (a takeover under way). Without ``resume``, the
    first broker that answers finds it or makes it."""
    deadline = time.monotonic() + timeout
    why = "no broker answered"
    while True:
        for address in addresses:
            left = max(0.5, deadline - time.monotonic())
            client = connect(address, name=name, connect_timeout=min(left, 5.0))
            try:
                await client.open()
                q = await PulledSubscription.open(client, sub_id, space, filter, resume=resume)
            except SubscribeError as e:
                await client.close()
                if p.NOT_HERE not in str(e):
                    raise
                why = f"no broker serves it (last asked: {address})"
                continue
            except (ClientError, OSError) as e:
                await client.close()
                why = str(e)
                continue
            try:
                yield q
            finally:
                await client.close()
            return
        if time.monotonic() > deadline:
            raise SubscribeError(f"pulled subscription {sub_id!r} at {', '.join(addresses)}: {why}")
        await asyncio.sleep(AWAIT_POLL)
