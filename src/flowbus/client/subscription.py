"""A subscription's events, in order and each once, as an async iterator.

How it works: the client's state (:class:`~flowbus.client.state.ClientState`) drops a
delivery whose event id the subscription has had already (a broker re-sent it after a
reconnect) and the client hands the rest to :meth:`Subscription.offer`. A subscription is
given at construction what it needs: its inbox, the function that acknowledges a delivery
it took (``ack(epoch, delivery number)``: the state counts; an event is acknowledged to the
broker once every subscription of the connection it came for has taken it, so a crash of
the application before it took an event leaves the event with the broker) and the one that
unsubscribes it. :meth:`Subscription.batches` hands over all the events that have come (up
to a limit) at each wake-up, acknowledged together. A subscription the broker ended (its
client's identity lost the right) ends its iteration with the broker's
:class:`~flowbus.errors.SubscribeError` once the events before it are taken.

A *merged* subscription (``Client.subscribe(..., merged=True)``) has no queue of its own: its
events wait in the client's one queue with those of the client's other merged subscriptions,
and ``Client.merged()`` hands them over as they come, each with its subscription. An
application with thousands of subscriptions then takes the events of a whole frame in one
wake-up, not one per subscription.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from flowbus.client.state import Subscribed
from flowbus.errors import ClientError, SubscribeError

__all__ = ["Ack", "Inbox", "Item", "Subscription", "take_batches"]

Ack = Callable[[int, int], None]
"""Acknowledges a delivery taken: ``ack(connection epoch, delivery number)``."""

Item = tuple[int, int, dict[str, Any], "Subscription"]
"""A delivery waiting to be taken: (connection epoch, delivery number, event, subscription)."""


class Inbox:
    """Deliveries waiting to be taken, oldest first, and the readers waiting for some (a
    deque and futures: a delivery costs an append and a pop, not an ``asyncio.Queue``'s
    bookkeeping); ended once nothing more will come."""

    __slots__ = ("_waiters", "ended", "items")

    def __init__(self) -> None:
        self.items: deque[Item] = deque()
        self.ended = False
        self._waiters: list[asyncio.Future[None]] = []

    def put(self, item: Item) -> None:
        self.items.append(item)
        if self._waiters:
            self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def ready(self) -> bool:
        """Once there is something to take: True; False if it ended with nothing left."""
        while not self.items:
            if self.ended:
                return False
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        return True


_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


class Subscription:
    """The events of one subscription, in order, each once."""

    __slots__ = (
        "_ack",
        "_ended",
        "_inbox",
        "_record",
        "_unsubscribe",
        "error",
        "filter",
        "id",
        "merged",
        "options",
        "received",
        "space",
    )

    def __init__(
        self,
        sub_id: str,
        space: str,
        filter: str,
        *,
        inbox: Inbox,
        ack: Ack,
        unsubscribe: Callable[[Subscription], Awaitable[None]],
        record: Subscribed,
        merged: bool = False,
        **options: Any,
    ) -> None:
        self.id = sub_id
        self.space = space
        self.filter = filter
        self.merged = merged
        self.options: Mapping[str, Any] = (
            options if any(options.values()) else _NO_OPTIONS
        )  # (one empty dict for
        # every plain subscription: a client may hold a million)
        self._inbox = inbox
        self._ack = ack
        self._unsubscribe = unsubscribe
        self._record = record
        self._ended = False
        self.error: SubscribeError | None = None  # why the broker ended it, if it did
        self.received = 0

    @property
    def duplicates(self) -> int:
        """Deliveries of events it had already (dropped)."""
        return self._record.duplicates

    def offer(self, epoch: int, cseq: int, event: dict[str, Any]) -> None:
        """Delivery ``cseq`` of connection ``epoch`` is this subscription's to take."""
        self._inbox.put((epoch, cseq, event, self))

    def end(self, error: SubscribeError | None = None) -> None:
        """Nothing more comes (``error``: why the broker ended it)."""
        self._ended = True
        self.error = error
        if not self.merged:  # (the client's merged inbox ends with the client)
            self._inbox.end()

    def _own(self) -> Inbox:
        if self.merged:
            raise ClientError(f"subscription {self.id!r} is merged: its events come through Client.merged()")
        return self._inbox

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        inbox = self._own()
        if not await inbox.ready():
            if self.error is not None:  # (the broker ended it)
                raise self.error
            raise StopAsyncIteration
        epoch, cseq, event, _ = inbox.items.popleft()
        self.received += 1
        self._ack(epoch, cseq)
        return event

    def batches(self, max_events: int = 10_000) -> AsyncIterator[list[dict[str, Any]]]:
        """The events in lists: each, once at least one event is there, every event that has
        come (at most ``max_events``), in order; acknowledged when the list is handed over.
        Ends when the subscription does."""
        return self._batches(take_batches(self._ack, self._own(), max_events))

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
        await self._unsubscribe(self)


def take_batches(ack: Ack, inbox: Inbox, max_events: int) -> AsyncIterator[list[Item]]:
    """What ``inbox`` holds in lists: once at least one delivery is there, every one that has
    come (at most ``max_events``), in order, each acknowledged (``ack``) when handed over;
    ends with the inbox."""
    if max_events < 1:
        raise ValueError(f"max_events must be at least 1, got {max_events}")
    return _take_batches(ack, inbox, max_events)


async def _take_batches(ack: Ack, inbox: Inbox, max_events: int) -> AsyncIterator[list[Item]]:
    items = inbox.items
    while await inbox.ready():
        if len(items) <= max_events:
            batch = list(items)
            items.clear()
        else:
            batch = [items.popleft() for _ in range(max_events)]
        for epoch, cseq, _, _ in batch:
            ack(epoch, cseq)
        yield batch
