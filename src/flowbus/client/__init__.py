"""The flowbus client: publish events and subscribe to them through a ring of brokers.

::

    async with flowbus.connect("127.0.0.1:7001", "127.0.0.1:7002") as client:
        await client.publish("stocks", {"symbol": "IBM", "price": 120.5, ...})
        sub = await client.subscribe("stocks", 'price > 100 & symbol = "IBM"', durable="ibm")
        async for event in sub:
            ...
        await sub.unsubscribe()

The parts: :mod:`~flowbus.client.protocol` (the messages between a client and its broker),
:mod:`~flowbus.client.client` (the asyncio :class:`Client`: publishing, subscribing,
reconnecting), :mod:`~flowbus.client.subscription` (a subscription's events, each once) and
:mod:`~flowbus.client.sync` (:class:`SyncClient`, for code without an event loop).
"""

from flowbus.client.client import Client, Status, connect
from flowbus.client.subscription import Subscription
from flowbus.client.sync import SyncClient, SyncSubscription
from flowbus.errors import ClientError, PublishError, SubscribeError

__all__ = [
    "Client",
    "ClientError",
    "PublishError",
    "Status",
    "SubscribeError",
    "Subscription",
    "SyncClient",
    "SyncSubscription",
    "connect",
]
