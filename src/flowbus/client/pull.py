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
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from flowbus.client import protocol as p
from flowbus.client.client import ALL_EVENTS
from flowbus.errors import SubscribeError

if TYPE_CHECKING:
    from flowbus.client.client import Client

__all__ = ["PulledSubscription", "QueuedRow"]

QueuedRow = tuple[int, tuple[str, int], dict[str, Any]]
"""A queued event: (position, event id (publisher, pseq), event)."""


class PulledSubscription:
    """A durable subscription read by position (see the module note)."""

    def __init__(self, client: Client, sub_id: str, space: str) -> None:
        self.client = client
        self.id = sub_id
        self.space = space

    @classmethod
    async def open(
        cls, client: Client, sub_id: str, space: str, filter: str | None = None
    ) -> PulledSubscription:
        """Make the pulled subscription ``sub_id`` to ``space`` (or find it: a restarted reader)."""
        text = filter or ALL_EVENTS
        await cls._ask(client, partial(p.QueueOpen, sub_id=sub_id, space=space, filter=text), "open")
        return cls(client, sub_id, space)

    async def top(self) -> int:
        """The highest position queued (0: nothing is)."""
        top = partial(p.QueueRead, sub_id=self.id, after=0, upto=0, limit=0)
        data = await self._ask(self.client, top, "top of")
        return int(data["top"])

    async def read(self, *, after: int, upto: int) -> list[QueuedRow]:
        """Every queued event at a position in ``(after, upto]``, in order."""
        out: list[QueuedRow] = []
        while after < upto:
            read = partial(p.QueueRead, sub_id=self.id, after=after, upto=upto, limit=2000)
            data = await self._ask(self.client, read, "read")
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

    @staticmethod
    async def _ask(client: Client, make: Callable[[int], Any], what: str) -> Any:
        sub_id = make(0).sub_id
        reply = await client._request(make)
        if not reply.ok:
            raise SubscribeError(f"{what} {sub_id!r} at broker {client.broker}: {reply.error}")
        return reply.data
