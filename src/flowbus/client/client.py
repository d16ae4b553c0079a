"""The asyncio client: publish events and subscribe to them through a ring of brokers.

::

    async with flowbus.connect("127.0.0.1:7001", "127.0.0.1:7002") as client:
        await client.publish("stocks", {"symbol": "IBM", "price": 120.5, ...})
        sub = await client.subscribe("stocks", 'price > 100 & symbol = "IBM"', durable="ibm")
        async for event in sub:
            ...
        every = await client.subscribe("stocks")  # no filter: all the space's events
        await sub.unsubscribe()

How it works (the client protocol is in :mod:`flowbus.client.protocol`):

* **Publishing** is pipelined. :meth:`Client.publish` checks the event against the space's
  schema (the broker's ``Welcome`` lists them), numbers it and sends it in the next frame;
  it waits only when ``window`` publishes are unacknowledged (backpressure). The broker
  acknowledges a publish once every matching subscriber's broker has it in custody or on
  disk; :meth:`Client.flush` waits for that. An event the broker refused raises
  :class:`PublishError` from the next ``publish`` or ``flush``.
* **Subscribing.** A :class:`Subscription` is an async iterator of events. An event is
  acknowledged to the broker when the application takes it from the iterator.
* **Reconnecting.** If the connection drops, the client connects to another broker of the
  ring (those given, and those the brokers named), re-attaches its subscriptions there and
  re-sends its unacknowledged publishes. The broker that took over a dead broker's
  subscriptions serves them (a broker that does not answers "not here", and the client
  tries the next one). Every delivery carries its event's id; the client drops an id it
  has handed to the application already (at least the last ``dedup`` ids per subscription), so the
  application sees every event exactly once.
* **Status.** :attr:`Client.status` is one :class:`Status`: ``NEW`` until :meth:`Client.open`,
  ``CONNECTING`` while it looks for a broker (at first and after a drop), ``CONNECTED`` once a
  broker welcomed it and every subscription is re-attached, ``CLOSED`` after :meth:`Client.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import ssl
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, KeysView, Mapping
from pathlib import Path
from typing import Any

from flowbus.client import protocol as p
from flowbus.client.subscription import Inbox, Item, Subscription, take_batches
from flowbus.errors import ClientError, FlowbusError, ProtocolError, PublishError, SchemaError, SubscribeError
from flowbus.model import Schema
from flowbus.net.codec import FrameDecoder, decode, encode, frame

__all__ = ["ALL_EVENTS", "Client", "Status", "connect"]

ALL_EVENTS = "true"
"""The filter text of a subscription to all of a space's events (``subscribe(space)``): the
filter language's always-true filter (:meth:`flowbus.filters.Filter.true`). The wire always
carries a filter's text, so the brokers see nothing new."""


class Status(enum.Enum):
    """Where a :class:`Client` is in its life."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


def connect(
    *addresses: str,
    name: str | None = None,
    window: int = 10_000,
    dedup: int = 1_000_000,
    resume_timeout: float = 30.0,
    connect_timeout: float = 30.0,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> Client:
    """A client of the brokers at ``addresses`` (``"host:port"``); use it as
    ``async with connect(...) as client`` (or ``await client.open()`` / ``close()``).
    ``tls``: connect in TLS with this context (:func:`flowbus.net.tls.client_context`:
    the ring's authority, and a client certificate naming the identity, if any);
    ``token``: the identity's token, sent in ``Hello`` (docs/security.md)."""
    return Client(
        addresses,
        name=name,
        window=window,
        dedup=dedup,
        resume_timeout=resume_timeout,
        connect_timeout=connect_timeout,
        tls=tls,
        token=token,
    )


class Client:
    """A connection to a ring of brokers (see the module note)."""

    def __init__(
        self,
        addresses: tuple[str, ...] | list[str],
        *,
        name: str | None = None,
        window: int = 10_000,
        dedup: int = 1_000_000,
        resume_timeout: float = 30.0,
        connect_timeout: float = 30.0,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        if not addresses:
            raise ClientError("connect: give at least one broker address (host:port)")
        for a in addresses:
            _split(a)
        if window < 1 or dedup < 1:
            raise ClientError(f"window and dedup are >= 1, got {window}, {dedup}")
        self.name = name or f"client-{uuid.uuid4().hex[:12]}"
        self.window = window
        self.dedup = dedup
        self.resume_timeout = resume_timeout
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.token = token
        self._last_error: str | None = None  # why the last connection attempt failed
        self.spaces: dict[str, Schema | None] = {}
        self.broker: str | None = None  # the broker we are connected to
        self.reconnects = 0
        self._addresses: deque[str] = deque(dict.fromkeys(addresses))
        self._pseq = 0
        self._unacked: OrderedDict[int, tuple[str, dict[str, Any]]] = OrderedDict()
        self._to_send: list[int] = []
        self._errors: list[PublishError] = []
        self._acked = asyncio.Event()
        self._subs: dict[str, Subscription] = {}
        self._merged: Inbox | None = None  # (the merged subscriptions' events)
        self._adverts: dict[str, tuple[str, str]] = {}  # advertisement name -> (space, filter)
        self._replies: dict[int, asyncio.Future[p.Reply]] = {}
        self._req = itertools.count(1)
        self._names = itertools.count(1)
        self._held: dict[int, int] = {}  # delivery number -> its subscriptions still to take it
        self._taken: list[int] = []  # delivery numbers every subscription took: to acknowledge
        self._writer: asyncio.StreamWriter | None = None
        self._epoch = 0
        self._up = asyncio.Event()
        self._flush_due = False
        self._task: asyncio.Task[None] | None = None
        self.status = Status.NEW
        self._homeless_since: float | None = None  # when a resume first found subscriptions
        # no broker serves (reset once all are re-attached): resume_timeout counts from it

    # -- life cycle

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect to one of the brokers (waits up to ``connect_timeout``)."""
        if self.status is not Status.NEW:
            return
        self.status = Status.CONNECTING
        self._task = asyncio.ensure_future(self._run())
        try:
            await asyncio.wait_for(self._up.wait(), self.connect_timeout)
        except TimeoutError:
            await self.close()
            why = f" (last: {self._last_error})" if self._last_error else ""
            raise ClientError(f"no broker answered at {', '.join(self._addresses)}{why}") from None

    async def close(self) -> None:
        """Say goodbye (non-durable subscriptions end) and close."""
        self.status = Status.CLOSED
        if self._writer is not None and not self._writer.is_closing():
            self._flush()
            with contextlib.suppress(Exception):
                self._writer.write(frame(encode(p.Bye())))
                await self._writer.drain()
            self._writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for sub in self._subs.values():
            sub._end()
        if self._merged is not None:
            self._merged.end()
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(ClientError("the client is closed"))

    # -- publishing

    async def publish(self, space: str, event: Mapping[str, Any]) -> int:
        """Send ``event`` to ``space`` (waits while ``window`` publishes are unacknowledged);
        its publish sequence number (what :attr:`pending` and :class:`PublishError` name)."""
        self._raise_errors()
        self._check(space, event)
        while len(self._unacked) >= self.window:
            self._acked.clear()
            await self._acked.wait()
            self._raise_errors()
        self._pseq += 1
        self._unacked[self._pseq] = (space, dict(event))
        self._to_send.append(self._pseq)
        self._flush_soon()
        return self._pseq

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish so far is acknowledged (or refused: raises)."""

        async def drained() -> None:
            while self._unacked:
                self._acked.clear()
                await self._acked.wait()

        await asyncio.wait_for(drained(), timeout)
        self._raise_errors()

    @property
    def closed(self) -> bool:
        return self.status is Status.CLOSED

    @property
    def unacknowledged(self) -> int:
        return len(self._unacked)

    @property
    def pending(self) -> KeysView[int]:
        """The sequence numbers of the publishes not acknowledged (nor refused) yet, oldest
        first (a live view: copy it to keep it)."""
        return self._unacked.keys()

    def _check(self, space: str, event: Mapping[str, Any]) -> None:
        if self.closed:
            raise ClientError("the client is closed")
        if self.spaces and space not in self.spaces:
            raise ClientError(f"unknown space {space!r} (known: {', '.join(sorted(self.spaces))})")
        if not isinstance(event, Mapping):
            raise SchemaError(f"an event is a mapping of field names to values, got {type(event).__name__}")
        schema = self.spaces.get(space)
        if schema is not None:
            try:
                schema.validate(event)
            except SchemaError as e:
                raise SchemaError(f"space {space!r}: {e}", field=e.field) from None

    def _raise_errors(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    # -- subscribing

    async def subscribe(
        self,
        space: str,
        filter: str | None = None,
        *,
        durable: str | None = None,
        collapse: str | None = None,
        merged: bool = False,
    ) -> Subscription:
        """Subscribe to the events of ``space`` that match ``filter`` (``None`` or ``""``: all
        of them). ``durable`` names a subscription that outlives this client (its events wait
        for it while it is away); ``collapse`` names a collapse rule set of the brokers: after
        a disconnect, the subscription gets the shortest equivalent of what it missed, not all
        of it. ``merged``: its events come through :meth:`merged`, with those of the client's
        other merged subscriptions (for many subscriptions: one wake-up a frame)."""
        if self.closed:
            raise ClientError("the client is closed")
        text = filter or ALL_EVENTS
        sub_id = durable or f"{self.name}/{next(self._names)}"
        if sub_id in self._subs:
            raise SubscribeError(f"subscription {sub_id!r} is open in this client already")
        sub = Subscription(
            self, sub_id, space, text, merged=merged, durable=durable is not None, collapse=collapse
        )
        self._subs[sub_id] = sub
        try:
            reply = await self._request(
                lambda req: p.Subscribe(req, sub_id, space, text, durable is not None, collapse, False)
            )
        except BaseException:
            self._subs.pop(sub_id, None)
            raise
        if not reply.ok:
            self._subs.pop(sub_id, None)
            raise SubscribeError(f"subscribe {text!r} to {space!r}: {reply.error}")
        return sub

    def merged(self, max_events: int = 10_000) -> AsyncIterator[list[tuple[Subscription, dict[str, Any]]]]:
        """The events of the merged subscriptions (``subscribe(..., merged=True)``), each with
        its subscription, in lists: once at least one is there, every one that has come (at
        most ``max_events``), each subscription's in order; acknowledged when the list is
        handed over. Ends when the client closes."""
        return self._merged_batches(take_batches(self, self._merged_inbox(), max_events))

    async def _merged_batches(
        self, batches: AsyncIterator[list[Item]]
    ) -> AsyncIterator[list[tuple[Subscription, dict[str, Any]]]]:
        async for batch in batches:
            for _, _, _, sub in batch:
                sub.received += 1
            yield [(sub, event) for _, _, event, sub in batch]

    def _merged_inbox(self) -> Inbox:
        if self._merged is None:
            self._merged = Inbox()
        return self._merged

    # -- flows

    async def deploy(self, flow: str | Path) -> dict[str, Any]:
        """Deploy a flow on the network: a spec file (its lookups read and inlined), or a
        flow document's text; what the broker says of it (name, version, spaces). A
        :class:`ClientError` with the broker's reason if it is refused."""
        from flowbus.flow.deploy import Deployment

        text = Deployment.from_file(flow).text if isinstance(flow, Path) else flow
        reply = await self._request(lambda req: p.Deploy(req, text))
        if not reply.ok:
            raise ClientError(f"deploy: {reply.error}")
        info: dict[str, Any] = reply.data
        for space in info["spaces"]:
            if space["subscribable"]:
                self.spaces[space["name"]] = Schema.of(space["schema"])
        return info

    async def undeploy(self, name: str) -> dict[str, Any]:
        """Withdraw the flow ``name`` from the network (its subscriptions end)."""
        reply = await self._request(lambda req: p.Undeploy(req, name))
        if not reply.ok:
            raise ClientError(f"undeploy: {reply.error}")
        return dict(reply.data)

    async def reload_acl(self) -> dict[str, Any]:
        """Have the broker read the rights of its config file again (the ``admin`` right on
        ``acl``): what changed. A :class:`ClientError` with the broker's reason if refused."""
        reply = await self._request(lambda req: p.ReloadAcl(req))
        if not reply.ok:
            raise ClientError(f"acl reload: {reply.error}")
        return dict(reply.data)

    async def flows(self) -> list[dict[str, Any]]:
        """The flows deployed on the network: name, version, spaces."""
        reply = await self._request(lambda req: p.ListFlows(req))
        if not reply.ok:
            raise ClientError(f"flows: {reply.error}")
        flows: list[dict[str, Any]] = reply.data
        for flow in flows:
            for space in flow["spaces"]:
                if space["subscribable"]:
                    self.spaces.setdefault(space["name"], Schema.of(space["schema"]))
        return flows

    # -- advertising

    async def advertise(self, space: str, filter: str, *, name: str | None = None) -> str:
        """Say this client will publish events of ``space`` matching ``filter`` (needed,
        before publishing, by brokers with ``advertising`` on: they forward subscriptions
        only towards advertised publishers). Kept across reconnects; its name."""
        if self.closed:
            raise ClientError("the client is closed")
        adv_id = name or f"adv-{next(self._names)}"
        reply = await self._request(lambda req: p.Advertise(req, adv_id, space, filter))
        if not reply.ok:
            raise ClientError(f"advertise {filter!r} in {space!r}: {reply.error}")
        self._adverts[adv_id] = (space, filter)
        return adv_id

    async def unadvertise(self, name: str) -> None:
        """Withdraw the advertisement ``name``."""
        self._adverts.pop(name, None)
        reply = await self._request(lambda req: p.Unadvertise(req, name))
        if not reply.ok:
            raise ClientError(f"unadvertise {name!r}: {reply.error}")

    async def _unsubscribe(self, sub: Subscription) -> None:
        reply = await self._request(lambda req: p.Unsubscribe(req, sub.id))
        self._subs.pop(sub.id, None)
        sub._end()
        if not reply.ok:
            raise SubscribeError(f"unsubscribe {sub.id!r}: {reply.error}")

    async def _request(self, make: Any) -> p.Reply:
        await self._up.wait()
        req = next(self._req)
        fut: asyncio.Future[p.Reply] = asyncio.get_running_loop().create_future()
        self._replies[req] = fut
        self._send(make(req))
        try:
            return await fut
        finally:
            self._replies.pop(req, None)

    def _ack(self, epoch: int, cseq: int) -> None:
        """One subscription took delivery ``cseq`` of connection ``epoch``: acknowledged once
        every subscription it was for took it."""
        if epoch == self._epoch:
            held = self._held
            left = held.pop(cseq, 1) - 1
            if left:
                held[cseq] = left
            else:
                self._taken.append(cseq)
                if not self._flush_due:
                    self._flush_soon()

    # -- the wire

    def _send(self, msg: Any) -> None:
        if self._writer is None:
            raise ClientError("not connected")
        self._flush()
        self._writer.write(frame(encode(msg)))

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._writer is None or self._writer.is_closing():
            return
        out: list[bytes] = []
        if self._to_send:  # (in pseq order, whatever their spaces: a publisher's order is kept)
            items: list[tuple[int, dict[str, Any]]] = []
            spaces: list[str] = []
            for pseq in self._to_send:
                item = self._unacked.get(pseq)
                if item is not None:
                    items.append((pseq, item[1]))
                    spaces.append(item[0])
            self._to_send = []
            for i in range(0, len(items), 2000):
                chunk, where = items[i : i + 2000], spaces[i : i + 2000]
                mixed = any(s != where[0] for s in where)
                batch = p.pack_publish(chunk, where if mixed else ())
                out.append(frame(encode(p.Publish(where[0], batch))))
        if self._taken:
            out.append(frame(encode(p.Ack(p.pack_acks(_ranges(self._taken))))))
            self._taken = []
        if out:
            self._writer.write(b"".join(out))

    async def _run(self) -> None:
        """Stay connected: connect, serve the connection, reconnect when it drops."""
        delay = 0.05
        while not self.closed:
            address = self._addresses[0]
            self._addresses.rotate(-1)
            try:
                host, port = _split(address)
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=self.tls), 5.0
                )
            except (TimeoutError, OSError) as e:  # (an ssl.SSLError is an OSError: a bad certificate)
                self._last_error = str(e) or type(e).__name__
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            delay, pause = 0.05, 0.0
            try:
                await self._serve(address, reader, writer)
            except FlowbusError as e:  # (refused, or the protocol broken: not again at once)
                self._last_error, pause = str(e), 0.5
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                self._down()
                writer.close()
            if not self.closed:
                self.reconnects += 1
                await asyncio.sleep(pause)

    def _down(self) -> None:
        if self.status is Status.CONNECTED:
            self.status = Status.CONNECTING
        self._up.clear()
        self._writer = None
        self.broker = None
        self._held, self._taken = {}, []
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(ClientError("the connection to the broker was lost; try again"))

    async def _serve(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(encode(p.Hello(self.name, token=self.token))))
        frames = FrameDecoder()
        welcome: p.Welcome | None = None
        while welcome is None:
            data = await reader.read(1 << 16)
            if not data:
                return
            bodies = frames.feed(data)
            if bodies:
                first = decode(bodies[0])
                if isinstance(first, p.Error):
                    raise ClientError(f"{address} refused the connection: {first.what}")
                if not isinstance(first, p.Welcome):
                    raise ClientError(f"{address} is not a flowbus broker (it said {type(first).__name__})")
                welcome = first
                bodies = bodies[1:]
        self._welcome(welcome)
        self._epoch += 1
        self._writer = writer
        for adv_id, (space, filt) in self._adverts.items():  # (before any publish is re-sent)
            writer.write(frame(encode(p.Advertise(next(self._req), adv_id, space, filt))))
        if not await self._resume(reader, frames, bodies):
            return
        self.status = Status.CONNECTED
        self._up.set()
        self._to_send = list(self._unacked)  # whatever was not acknowledged, again
        self._flush()
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            for body in frames.feed(data):
                self._on_message(decode(body))

    def _welcome(self, w: p.Welcome) -> None:
        self.broker = w.broker
        self.spaces = {n: None if s is None else Schema.of(s) for n, s in w.spaces.items()}
        for peer in (w.broker, *w.peers):
            if peer not in self._addresses:
                self._addresses.append(peer)

    async def _resume(self, reader: asyncio.StreamReader, frames: FrameDecoder, early: list[bytes]) -> bool:
        """Re-attach every subscription at this broker; False if some are not here (the
        caller moves on to the next broker), unless they have been homeless for longer
        than ``resume_timeout``: then they are made afresh here."""
        if not self._subs:
            for body in early:
                self._on_message(decode(body))
            self._homeless_since = None
            return True
        loop = asyncio.get_running_loop()
        start = loop.time()
        if self._homeless_since is None:
            self._homeless_since = start
        pending = dict(self._subs)
        while pending:
            fresh = loop.time() - self._homeless_since > self.resume_timeout
            reqs: dict[int, Subscription] = {}
            assert self._writer is not None
            for sub in pending.values():
                req = next(self._req)
                reqs[req] = sub
                msg = p.Subscribe(
                    req,
                    sub.id,
                    sub.space,
                    sub.filter,
                    sub.options["durable"],
                    sub.options["collapse"],
                    not fresh,
                )
                self._writer.write(frame(encode(msg)))
            while reqs:
                bodies, early = early, []
                if not bodies:
                    data = await reader.read(1 << 16)
                    if not data:
                        raise ConnectionError("the broker closed the connection")
                    bodies = frames.feed(data)
                for body in bodies:
                    got = decode(body)
                    if isinstance(got, p.Reply) and got.req in reqs:
                        sub = reqs.pop(got.req)
                        if got.ok:
                            pending.pop(sub.id, None)
                        elif got.error != p.NOT_HERE:  # refused for good (a right lost, say)
                            pending.pop(sub.id, None)
                            self._subs.pop(sub.id, None)
                            sub._end(SubscribeError(f"subscription {sub.id!r} ended: {got.error}"))
                    else:
                        self._on_message(got)
            if pending:
                if loop.time() - start > 2.0 and not fresh and len(self._addresses) > 1:
                    return False  # another broker may serve them: move on
                await asyncio.sleep(0.1)
        self._homeless_since = None
        return True

    def _on_message(self, msg: Any) -> None:
        match msg:
            case p.Events():
                self._deliveries(msg.items())
            case p.PubAck():
                for pseq in msg.pseqs:
                    self._unacked.pop(pseq, None)
                self._acked.set()
            case p.Nack():
                if self._unacked.pop(msg.pseq, None) is not None:
                    self._errors.append(PublishError(msg.pseq, msg.error))
                self._acked.set()
            case p.Reply():
                fut = self._replies.get(msg.req)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            case p.SubEnded():
                sub = self._subs.pop(msg.sub_id, None)
                if sub is not None:
                    sub._end(SubscribeError(f"subscription {msg.sub_id!r} ended: {msg.error}"))
            case p.Error():
                raise ClientError(f"the broker closed the connection: {msg.what}")
            case _:
                raise ProtocolError(f"client {self.name}: unexpected {type(msg).__name__} from the broker")

    def _deliveries(self, items: list[tuple[list[str], int, tuple[str, int], dict[str, Any]]]) -> None:
        """Hand each delivery to the subscriptions it is for (the second and later get a
        copy of the event), counting those that must take it before it is acknowledged."""
        epoch, subs, held = self._epoch, self._subs, self._held
        for sub_ids, cseq, eid, event in items:
            waiting = 0
            for sub_id in sub_ids:
                sub = subs.get(sub_id)
                if sub is not None and sub._offer(epoch, cseq, eid, event if not waiting else dict(event)):
                    waiting += 1
            if waiting:
                held[cseq] = waiting
            else:  # (no subscription of ours wants it any more, or it was a duplicate)
                self._taken.append(cseq)
                self._flush_soon()


def _ranges(numbers: list[int]) -> list[tuple[int, int]]:
    """``numbers`` as sorted ranges ``(first, last)`` of consecutive numbers."""
    numbers.sort()
    out: list[tuple[int, int]] = []
    first = last = numbers[0]
    for n in numbers[1:]:
        if n != last + 1:
            out.append((first, last))
            first = n
        last = n
    out.append((first, last))
    return out


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClientError(f"a broker address is HOST:PORT, got {address!r}")
    return host, int(port)
