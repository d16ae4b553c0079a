"""The client for code without an event loop: a :class:`~flowbus.client.client.Client` on a
thread of its own, each call a coroutine run there and waited for."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flowbus.client.client import Client, connect
from flowbus.client.subscription import Subscription

__all__ = ["SyncClient", "SyncSubscription"]


class SyncClient:
    """:class:`Client` for code without an event loop: the client runs on a thread of its own.

    >>> with SyncClient("127.0.0.1:7001") as c:           # doctest: +SKIP
    ...     sub = c.subscribe("stocks", "price > 100")
    ...     c.publish("stocks", {...}); c.flush()
    ...     event = sub.get(timeout=5)
    """

    def __init__(self, *addresses: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="flowbus-client", daemon=True)
        self._thread.start()
        self.client: Client = self._run(self._make(addresses, options))
        self._run(self.client.open())

    async def _make(self, addresses: tuple[str, ...], options: dict[str, Any]) -> Client:
        return connect(*addresses, **options)

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish(self, space: str, event: Mapping[str, Any]) -> int:
        """:meth:`Client.publish`: the publish's sequence number."""
        pseq: int = self._run(self.client.publish(space, event))
        return pseq

    def flush(self, timeout: float | None = None) -> None:
        self._run(self.client.flush(timeout))

    def subscribe(self, space: str, filter: str, **options: Any) -> SyncSubscription:
        sub = self._run(self.client.subscribe(space, filter, **options))
        return SyncSubscription(self, sub)

    def subscribe_many(
        self, space: str, filters: Sequence[str | None], **options: Any
    ) -> list[SyncSubscription]:
        """:meth:`Client.subscribe_many`: all or none."""
        subs = self._run(self.client.subscribe_many(space, filters, **options))
        return [SyncSubscription(self, sub) for sub in subs]

    def advertise(self, space: str, filter: str, *, name: str | None = None) -> str:
        return self._run(self.client.advertise(space, filter, name=name))  # type: ignore[no-any-return]

    def unadvertise(self, name: str) -> None:
        self._run(self.client.unadvertise(name))

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self.client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()


class SyncSubscription:
    """A subscription of a :class:`SyncClient`: iterate, or :meth:`get` with a timeout."""

    def __init__(self, owner: SyncClient, sub: Subscription) -> None:
        self._owner = owner
        self.sub = sub

    def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event; ``queue.Empty`` after ``timeout`` seconds."""
        try:
            return self._owner._run(self.sub.get(timeout))  # type: ignore[no-any-return]
        except TimeoutError:
            raise queue.Empty from None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            try:
                yield self._owner._run(self.sub.__anext__())
            except StopAsyncIteration:
                return

    def unsubscribe(self) -> None:
        self._owner._run(self.sub.unsubscribe())
