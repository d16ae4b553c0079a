"""A subscription's events, in order and each once, as an async iterator.

How it works: the client hands every delivery to :meth:`Subscription._offer` with its event id;
an id seen among the last ``dedup`` is a duplicate (a broker re-sent it after a reconnect): it
is acknowledged again and dropped. An event is acknowledged to the broker when the application
takes it from the iterator, so a crash of the application before it took an event leaves the
event with the broker. :meth:`Subscription.batches` hands over all the events that have come
(up to a limit) at each wake-up, acknowledged together: one acknowledgement per batch. A
subscription the broker ended (its client's identity lost the right) ends its iteration with
the broker's :class:`~flowbus.errors.SubscribeError` once the events before it are taken.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from flowbus.errors import SubscribeError

if TYPE_CHECKING:
    from flowbus.client.client import Client

__all__ = ["Subscription"]


class Subscription:
    """The events of one subscription, in order, each once."""

    def __init__(self, client: Client, sub_id: str, space: str, filter: str, **options: Any) -> None:
        self.client = client
        self.id = sub_id
        self.space = space
        self.filter = filter
        self.options = options
        self._queue: asyncio.Queue[tuple[int, int, dict[str, Any]] | None] = asyncio.Queue()
        self._seen: OrderedDict[Any, None] = OrderedDict()
        self._ended = False
        self.error: SubscribeError | None = None  # why the broker ended it, if it did
        self.received = 0
        self.duplicates = 0

    def _offer(self, epoch: int, dseq: int, eid: Any, event: dict[str, Any]) -> None:
        key = tuple(eid) if isinstance(eid, list) else eid
        if key in self._seen:
            self.duplicates += 1
            self.client._ack(self.id, epoch, dseq)
            return
        self._seen[key] = None
        if len(self._seen) > self.client.dedup:
            self._seen.popitem(last=False)
        self._queue.put_nowait((epoch, dseq, event))

    def _end(self, error: SubscribeError | None = None) -> None:
        self._ended = True
        self.error = error
        self._queue.put_nowait(None)

    def _stop(self) -> None:
        """The end of the events: later calls end too; the broker's error if it ended it."""
        self._queue.put_nowait(None)
        if self.error is not None:
            raise self.error

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        item = await self._queue.get()
        if item is None:
            self._stop()
            raise StopAsyncIteration
        epoch, dseq, event = item
        self.received += 1
        self.client._ack(self.id, epoch, dseq)
        return event

    def batches(self, max_events: int = 10_000) -> AsyncIterator[list[dict[str, Any]]]:
        """The events in lists: each, once at least one event is there, every event that has
        come (at most ``max_events``), in order; acknowledged when the list is handed over.
        Ends when the subscription does."""
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events}")
        return self._batches(max_events)

    async def _batches(self, max_events: int) -> AsyncIterator[list[dict[str, Any]]]:
        queue = self._queue
        while True:
            item = await queue.get()
            if item is None:
                self._stop()
                return
            batch = [item]
            while len(batch) < max_events and not queue.empty():
                item = queue.get_nowait()
                if item is None:
                    queue.put_nowait(None)
                    break
                batch.append(item)
            self.received += len(batch)
            for (epoch, dseq, _), after in zip(batch, [*batch[1:], None], strict=True):
                if after is None or after[0] != epoch:  # (the last of each connection's run)
                    self.client._ack(self.id, epoch, dseq)
            yield [event for _, _, event in batch]

    async def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event (``asyncio.TimeoutError`` after ``timeout`` seconds)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def unsubscribe(self) -> None:
        await self.client._unsubscribe(self)
