"""A subscription's events, in order and each once, as an async iterator.

How it works: the client hands every delivery to :meth:`Subscription._offer` with its event id;
an id seen among the last ``dedup`` is a duplicate (a broker re-sent it after a reconnect): it
is dropped (and acknowledged, once the connection's other subscriptions it was for took it).
An event is acknowledged to the broker when every subscription of the connection it came for
has taken it from its iterator (:meth:`Client._ack` counts), so a crash of the application
before it took an event leaves the event with the broker. :meth:`Subscription.batches` hands
over all the events that have come (up to a limit) at each wake-up, acknowledged together. A
subscription the broker ended (its client's identity lost the right) ends its iteration with
the broker's :class:`~flowbus.errors.SubscribeError` once the events before it are taken.

A *merged* subscription (``Client.subscribe(..., merged=True)``) has no queue of its own: its
events wait in the client's one queue with those of the client's other merged subscriptions,
and ``Client.merged()`` hands them over as they come, each with its subscription. An
application with thousands of subscriptions then takes the events of a whole frame in one
wake-up, not one per subscription.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from flowbus.errors import ClientError, SubscribeError

if TYPE_CHECKING:
    from flowbus.client.client import Client

__all__ = ["Item", "Subscription", "take_batches"]

Item = tuple[int, int, dict[str, Any], "Subscription"]
"""A delivery waiting to be taken: (connection epoch, delivery number, event, subscription)."""


class Subscription:
    """The events of one subscription, in order, each once."""

    def __init__(
        self, client: Client, sub_id: str, space: str, filter: str, *, merged: bool = False, **options: Any
    ) -> None:
        self.client = client
        self.id = sub_id
        self.space = space
        self.filter = filter
        self.merged = merged
        self.options = options
        self._queue: asyncio.Queue[Item | None] = client._merged_queue() if merged else asyncio.Queue()
        self._seen: OrderedDict[Any, None] = OrderedDict()
        self._ended = False
        self.error: SubscribeError | None = None  # why the broker ended it, if it did
        self.received = 0
        self.duplicates = 0

    def _offer(self, epoch: int, cseq: int, eid: Any, event: dict[str, Any]) -> bool:
        """Queue delivery ``cseq`` of connection ``epoch``; False for a duplicate (dropped)."""
        key = tuple(eid) if isinstance(eid, list) else eid
        if key in self._seen:
            self.duplicates += 1
            return False
        self._seen[key] = None
        if len(self._seen) > self.client.dedup:
            self._seen.popitem(last=False)
        self._queue.put_nowait((epoch, cseq, event, self))
        return True

    def _end(self, error: SubscribeError | None = None) -> None:
        self._ended = True
        self.error = error
        if not self.merged:  # (the client's merged queue ends with the client)
            self._queue.put_nowait(None)

    def _stop(self) -> None:
        """The end of the events: later calls end too; the broker's error if it ended it."""
        self._queue.put_nowait(None)
        if self.error is not None:
            raise self.error

    def _own(self) -> asyncio.Queue[Item | None]:
        if self.merged:
            raise ClientError(f"subscription {self.id!r} is merged: its events come through Client.merged()")
        return self._queue

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        queue = self._own()
        item = await queue.get()
        if item is None:
            self._stop()
            raise StopAsyncIteration
        epoch, cseq, event, _ = item
        self.received += 1
        self.client._ack(epoch, cseq)
        return event

    def batches(self, max_events: int = 10_000) -> AsyncIterator[list[dict[str, Any]]]:
        """The events in lists: each, once at least one event is there, every event that has
        come (at most ``max_events``), in order; acknowledged when the list is handed over.
        Ends when the subscription does."""
        queue = self._own()
        return self._batches(take_batches(self.client, queue, max_events))

    async def _batches(self, batches: AsyncIterator[list[Item]]) -> AsyncIterator[list[dict[str, Any]]]:
        async for batch in batches:
            self.received += len(batch)
            yield [event for _, _, event, _ in batch]
        if self.error is not None:
            raise self.error

    async def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event (``asyncio.TimeoutError`` after ``timeout`` seconds)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def unsubscribe(self) -> None:
        await self.client._unsubscribe(self)


Queue = asyncio.Queue[Item | None]


def take_batches(client: Client, queue: Queue, max_events: int) -> AsyncIterator[list[Item]]:
    """What ``queue`` holds in lists: once at least one delivery is there, every one that has
    come (at most ``max_events``), in order, acknowledged to ``client`` when handed over; ends
    at the queue's end (None, left there for later readers)."""
    if max_events < 1:
        raise ValueError(f"max_events must be at least 1, got {max_events}")
    return _take(client, queue, max_events)


async def _take(client: Client, queue: Queue, max_events: int) -> AsyncIterator[list[Item]]:
    while True:
        item = await queue.get()
        if item is None:
            queue.put_nowait(None)  # (later calls end too)
            return
        batch = [item]
        while len(batch) < max_events and not queue.empty():
            item = queue.get_nowait()
            if item is None:
                queue.put_nowait(None)
                break
            batch.append(item)
        ack = client._ack
        for epoch, cseq, _, _ in batch:
            ack(epoch, cseq)
        yield batch
