"""The asyncio client: publish events and subscribe to them through a ring of brokers.

::

    async with flowbus.connect("127.0.0.1:7001", "127.0.0.1:7002") as client:
        await client.publish("stocks", {"symbol": "IBM", "price": 120.5, ...})
        sub = await client.subscribe("stocks", 'price > 100 & symbol = "IBM"', durable="ibm")
        async for event in sub:
            ...
        every = await client.subscribe("stocks")  # no filter: all the space's events
        await sub.unsubscribe()

How it works (the client protocol is in :mod:`flowbus.client.protocol`; what the client
knows and decides, without I/O, in :class:`~flowbus.client.state.ClientState`: this class
drives it with asyncio, its sockets, timers and futures):

* **Publishing** is pipelined. :meth:`Client.publish` checks the event against the space's
  schema (the broker's ``Welcome`` lists them), numbers it and sends it in the next frame;
  it waits only when ``window`` publishes are unacknowledged (backpressure). The broker
  acknowledges a publish once every matching subscriber's broker has it in custody or on
  disk; :meth:`Client.flush` waits for that. An event the broker refused raises
  :class:`PublishError` from the next ``publish`` or ``flush``; so does one not acknowledged
  within ``publish_timeout`` seconds of its ``publish`` (None, the default: no limit). It is
  given up: no longer unacknowledged, never sent again, its late acknowledgement ignored. A
  timer checks the oldest unacknowledged publishes (every tenth of the timeout, between
  0.05 and 1 s) while there are any; the reason says where the client was then (connected
  to which broker, since when; or how long without one, and the last error).
* **Subscribing.** A :class:`Subscription` is an async iterator of events. An event is
  acknowledged to the broker when the application takes it from the iterator.
* **Reconnecting.** If the connection drops, the client connects to another broker of the
  ring (those given, and those the brokers named), re-attaches its subscriptions there and
  re-sends its unacknowledged publishes. The broker that took over a dead broker's
  subscriptions serves them (a broker that does not answers "not here", and the client
  tries the next one). Every delivery carries its event's id; the client drops an id it
  has handed to the application already (at least the last ``dedup`` ids per subscription), so the
  application sees every event exactly once.
* **Silent brokers.** A broker writes something to each client at least every two of its
  ``keepalive`` periods (2 s by default; a ``Keepalive`` when it has nothing else). A broker
  the client has heard nothing from for ``idle_timeout`` seconds (10 by default; None: wait
  for ever) is taken for paused or cut off (the kernel may keep its TCP connection open all
  the while): the client aborts the connection and reconnects to the next broker as if it
  had been lost. This holds while it waits for ``Welcome`` and while it re-attaches its
  subscriptions too (and opening a connection, TLS included, takes at most 5 s, or
  ``idle_timeout`` if less). One timer per connection watches the time of the last read; a
  read only notes the time.
* **Status.** :attr:`Client.status` is one :class:`Status`: ``NEW`` until :meth:`Client.open`,
  ``CONNECTING`` while it looks for a broker (at first and after a drop), ``CONNECTED`` once a
  broker welcomed it and every subscription is re-attached, ``CLOSED`` after :meth:`Client.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, KeysView, Mapping, Sequence
from pathlib import Path
from typing import Any

from flowbus.client import protocol as p
from flowbus.client.state import ClientState
from flowbus.client.subscription import Inbox, Item, Subscription, take_batches
from flowbus.errors import ClientError, FlowbusError, PublishError, SubscribeError
from flowbus.model import Schema
from flowbus.net.codec import FrameDecoder, decode, encode, frame

log = logging.getLogger("flowbus.client")

__all__ = ["ALL_EVENTS", "Client", "Status", "connect"]

ALL_EVENTS = "true"

BULK_IN_FLIGHT = 4
"""The requests of one :meth:`Client.subscribe_many` out at once."""
"""The filter text of a subscription to all of a space's events (``subscribe(space)``): the
filter language's always-true filter (:meth:`flowbus.filters.Filter.true`). The wire always
carries a filter's text, so the brokers see nothing new."""


WATCH_TURNS = 4
"""Turns of the event loop the idle watchdog waits, once a broker seems silent, before it
drops the connection (what came meanwhile is read in those turns)."""


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
    idle_timeout: float | None = 10.0,
    publish_timeout: float | None = None,
) -> Client:
    """A client of the brokers at ``addresses`` (``"host:port"``); use it as
    ``async with connect(...) as client`` (or ``await client.open()`` / ``close()``).
    ``tls``: connect in TLS with this context (:func:`flowbus.net.tls.client_context`:
    the ring's authority, and a client certificate naming the identity, if any);
    ``token``: the identity's token, sent in ``Hello`` (docs/security.md);
    ``idle_timeout``: seconds without a frame from the broker before the client moves to
    another (None: never); ``publish_timeout``: seconds a publish may stay unacknowledged
    before it is given up with a :class:`PublishError` (None: no limit)."""
    return Client(
        addresses,
        name=name,
        window=window,
        dedup=dedup,
        resume_timeout=resume_timeout,
        connect_timeout=connect_timeout,
        tls=tls,
        token=token,
        idle_timeout=idle_timeout,
        publish_timeout=publish_timeout,
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
        idle_timeout: float | None = 10.0,
        publish_timeout: float | None = None,
    ) -> None:
        if not addresses:
            raise ClientError("connect: give at least one broker address (host:port)")
        for a in addresses:
            _split(a)
        for option, value in (("idle_timeout", idle_timeout), ("publish_timeout", publish_timeout)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise ClientError(f"{option}: seconds > 0 or None, got {value!r}")
        self.state = ClientState(
            name or f"client-{uuid.uuid4().hex[:12]}", addresses, window=window, dedup=dedup, token=token
        )
        self.name = self.state.name
        self.window = window
        self.dedup = dedup
        self.resume_timeout = resume_timeout
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.token = token
        self.idle_timeout = idle_timeout
        self.publish_timeout = publish_timeout
        self._last_error: str | None = None  # why the last connection failed or ended
        self.reconnects = 0
        self._expiry: asyncio.TimerHandle | None = None  # the next check of publish_timeout
        self._acked = asyncio.Event()
        self._merged: Inbox | None = None  # (the merged subscriptions' events)
        self._replies: dict[int, asyncio.Future[p.Reply]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._up = asyncio.Event()
        self._flush_due = False
        self._task: asyncio.Task[None] | None = None
        self.status = Status.NEW
        self._since: float | None = None  # when the client last became connected, or lost it
        self._heard = 0.0  # when the broker last sent something (read by the idle watchdog)
        self._silent: str | None = None  # why the watchdog dropped the connection
        self._watchdog: asyncio.Handle | None = None

    @property
    def spaces(self) -> dict[str, Schema | None]:
        """The spaces the broker named, with their schemas (None: any event)."""
        return self.state.spaces

    @spaces.setter
    def spaces(self, spaces: dict[str, Schema | None]) -> None:
        self.state.spaces = spaces

    @property
    def broker(self) -> str | None:
        """The broker this client is connected to (None: none now)."""
        return self.state.broker

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
            raise ClientError(f"no broker answered at {', '.join(self.state.addresses)}{why}") from None

    async def close(self) -> None:
        """Say goodbye (non-durable subscriptions end) and close."""
        self.status = Status.CLOSED
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
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
        for record in self.state.subs.values():
            record.handle.end()
        if self._merged is not None:
            self._merged.end()
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(ClientError("the client is closed"))

    # -- publishing

    async def publish(self, space: str, event: Mapping[str, Any]) -> int:
        """Send ``event`` to ``space`` (waits while ``window`` publishes are unacknowledged);
        its publish sequence number (what :attr:`pending` and :class:`PublishError` name)."""
        state = self.state
        state.raise_errors()
        self._check(space, event)
        while state.full:
            self._acked.clear()
            await self._acked.wait()
            state.raise_errors()
        loop = asyncio.get_running_loop()
        pseq = state.publish(space, event, loop.time())
        self._flush_soon()
        if self._expiry is None and self.publish_timeout is not None:
            self._expiry = loop.call_later(_expiry_check(self.publish_timeout), self._expire)
        return pseq

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish so far is acknowledged (or refused, or given up after
        ``publish_timeout``: raises :class:`PublishError`)."""

        async def drained() -> None:
            while self.state.unacked:
                self._acked.clear()
                await self._acked.wait()

        await asyncio.wait_for(drained(), timeout)
        self.state.raise_errors()

    @property
    def closed(self) -> bool:
        return self.status is Status.CLOSED

    @property
    def unacknowledged(self) -> int:
        return len(self.state.unacked)

    @property
    def pending(self) -> KeysView[int]:
        """The sequence numbers of the publishes not acknowledged (nor refused) yet, oldest
        first (a live view: copy it to keep it)."""
        return self.state.unacked.keys()

    def _check(self, space: str, event: Mapping[str, Any]) -> None:
        if self.closed:
            raise ClientError("the client is closed")
        self.state.check(space, event)

    def take_errors(self) -> list[PublishError]:
        """The publish errors not raised yet (refusals, timeouts), taken: the next ``publish``
        or ``flush`` will not raise them. For an application that follows each publish's fate
        (with :attr:`pending`) rather than catching errors."""
        return self.state.take_errors()

    def _expire(self) -> None:
        """Give up the publishes unacknowledged for ``publish_timeout``; again later while any
        are left."""
        self._expiry = None
        timeout = self.publish_timeout
        if timeout is None or self.closed:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.state.expire(now, timeout, self._whereabouts(now)):
            self._acked.set()
        if self.state.unacked:
            self._expiry = loop.call_later(_expiry_check(timeout), self._expire)

    def _whereabouts(self, now: float) -> str:
        """Where the client has been lately: connected to which broker since when, or why not."""
        since = "" if self._since is None else f" {now - self._since:.1f} s"
        if self.status is Status.CONNECTED:
            return f"connected to {self.broker} since{since}"
        if self.broker is not None:
            return f"re-attaching subscriptions at {self.broker}"
        out = f"no broker reachable{' for' if since else ''}{since}"
        return f"{out}: last error {self._last_error}" if self._last_error else out

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
        sub = self._new_sub(space, filter, durable, collapse, merged)
        try:
            reply = await self._request(
                lambda req: p.Subscribe(req, sub.id, space, sub.filter, durable is not None, collapse, False)
            )
        except BaseException:
            self.state.remove(sub.id)
            raise
        if not reply.ok:
            self.state.remove(sub.id)
            raise SubscribeError(f"subscribe {sub.filter!r} to {space!r}: {reply.error}")
        return sub

    async def subscribe_many(
        self,
        space: str,
        filters: Sequence[str | None],
        *,
        durable: Sequence[str] | None = None,
        collapse: str | None = None,
        merged: bool = False,
        batch: int = 5_000,
    ) -> list[Subscription]:
        """One subscription to ``space`` for each of ``filters`` (as :meth:`subscribe`, in
        their order), asked for in requests of at most ``batch`` subscriptions, pipelined
        (``BULK_IN_FLIGHT`` out at once): the broker checks, records and backs each
        request's subscriptions up together, many times faster than :meth:`subscribe` one
        by one. ``durable``: their names (one per
        filter; None: not durable). All or none: if the broker refuses any, the ones other
        requests made are unsubscribed, and a :class:`SubscribeError` says which it refused
        and why."""
        if self.closed:
            raise ClientError("the client is closed")
        if durable is not None and len(durable) != len(filters):
            raise SubscribeError(f"subscribe_many: {len(durable)} durable names for {len(filters)} filters")
        if batch < 1:
            raise SubscribeError(f"subscribe_many: batch must be at least 1, got {batch}")
        subs: list[Subscription] = []
        try:
            for i, f in enumerate(filters):
                subs.append(
                    self._new_sub(space, f, durable[i] if durable is not None else None, collapse, merged)
                )
        except BaseException:
            for sub in subs:
                self.state.remove(sub.id)
            raise
        parts = [subs[lo : lo + batch] for lo in range(0, len(subs), batch)]

        def request(part: list[Subscription]) -> Any:
            ids, texts = tuple(s.id for s in part), tuple(s.filter for s in part)
            return lambda req: p.SubscribeMany(req, space, ids, texts, durable is not None, collapse)

        room = asyncio.Semaphore(BULK_IN_FLIGHT)

        async def ask(part: list[Subscription]) -> p.Reply:
            async with room:  # (a few requests at a time: a million filters are not all in buffers)
                return await self._request(request(part))

        replies = await asyncio.gather(*(ask(part) for part in parts), return_exceptions=True)
        failed = next((r for r in replies if isinstance(r, BaseException)), None)
        refused = next((r.error for r in replies if isinstance(r, p.Reply) and not r.ok), None)
        if failed is None and refused is None:
            return subs
        made = [
            s for part, r in zip(parts, replies, strict=True) if isinstance(r, p.Reply) and r.ok for s in part
        ]
        for sub in subs:
            self.state.remove(sub.id)
        with contextlib.suppress(FlowbusError, OSError):  # (what the failure left, undone if it can be)
            await asyncio.gather(*(self._request(lambda req, s=s: p.Unsubscribe(req, s.id)) for s in made))
        if failed is not None:
            raise failed
        raise SubscribeError(f"subscribe_many to {space!r}: {refused} (none of {len(subs)} made)")

    def _new_sub(
        self, space: str, filter: str | None, durable: str | None, collapse: str | None, merged: bool
    ) -> Subscription:
        """A subscription this client asks for, in its state (for re-attaching it elsewhere)."""
        text = filter or ALL_EVENTS
        state = self.state
        sub_id = durable or f"{self.name}/{state.new_name()}"
        record = state.add(sub_id, space, text, durable=durable is not None, collapse=collapse, handle=None)
        sub = Subscription(
            sub_id,
            space,
            text,
            inbox=self._merged_inbox() if merged else Inbox(),
            ack=self._took,
            unsubscribe=self._unsubscribe,
            record=record,
            merged=merged,
            durable=durable is not None,
            collapse=collapse,
        )
        record.handle = sub
        return sub

    def merged(self, max_events: int = 10_000) -> AsyncIterator[list[tuple[Subscription, dict[str, Any]]]]:
        """The events of the merged subscriptions (``subscribe(..., merged=True)``), each with
        its subscription, in lists: once at least one is there, every one that has come (at
        most ``max_events``), each subscription's in order; acknowledged when the list is
        handed over. Ends when the client closes."""
        return self._merged_batches(take_batches(self._took, self._merged_inbox(), max_events))

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
        adv_id = name or f"adv-{self.state.new_name()}"
        reply = await self._request(lambda req: p.Advertise(req, adv_id, space, filter))
        if not reply.ok:
            raise ClientError(f"advertise {filter!r} in {space!r}: {reply.error}")
        self.state.adverts[adv_id] = (space, filter)
        return adv_id

    async def unadvertise(self, name: str) -> None:
        """Withdraw the advertisement ``name``."""
        self.state.adverts.pop(name, None)
        reply = await self._request(lambda req: p.Unadvertise(req, name))
        if not reply.ok:
            raise ClientError(f"unadvertise {name!r}: {reply.error}")

    async def _unsubscribe(self, sub: Subscription) -> None:
        reply = await self._request(lambda req: p.Unsubscribe(req, sub.id))
        self.state.remove(sub.id)
        sub.end()
        if not reply.ok:
            raise SubscribeError(f"unsubscribe {sub.id!r}: {reply.error}")

    async def _request(self, make: Any) -> p.Reply:
        await self._up.wait()
        req = self.state.request_id()
        fut: asyncio.Future[p.Reply] = asyncio.get_running_loop().create_future()
        self._replies[req] = fut
        self._send(make(req))
        try:
            return await fut
        finally:
            self._replies.pop(req, None)

    def _took(self, epoch: int, cseq: int) -> None:
        """A subscription took delivery ``cseq`` of connection ``epoch`` (the state counts);
        an acknowledgement that became due is written soon."""
        if self.state.took(epoch, cseq) and not self._flush_due:
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
        data = self.state.outgoing()
        if data:
            self._writer.write(data)

    async def _run(self) -> None:
        """Stay connected: connect, serve the connection, reconnect when it drops."""
        delay = 0.05
        while not self.closed:
            address = self.state.next_address()
            try:
                host, port = _split(address)
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=self.tls), min(5.0, self.idle_timeout or 5.0)
                )
            except (TimeoutError, OSError) as e:  # (an ssl.SSLError is an OSError: a bad certificate)
                self._last_error = f"{address}: {str(e) or type(e).__name__}"
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            delay, pause = 0.05, 0.0
            try:
                await self._serve(address, reader, writer)
            except FlowbusError as e:  # (refused, or the protocol broken: not again at once)
                self._last_error, pause = str(e), 0.5
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as e:
                self._last_error = self._silent or f"{address}: {str(e) or type(e).__name__}"
            finally:
                self._down()
                writer.close()
            if not self.closed:
                log.info("client %s: left %s: %s", self.name, address, self._last_error)
            if not self.closed:
                self.reconnects += 1
                await asyncio.sleep(pause)

    def _down(self) -> None:
        if self.status is Status.CONNECTED:
            self.status = Status.CONNECTING
            self._since = asyncio.get_running_loop().time()
        self._up.clear()
        self._writer = None
        self.state.lost()
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(ClientError("the connection to the broker was lost; try again"))

    async def _serve(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve the connection to ``address`` until it ends (raises why), watched for
        silence (see "Silent brokers")."""
        loop = asyncio.get_running_loop()
        self._heard, self._silent = loop.time(), None
        if self.idle_timeout is not None:
            self._watchdog = loop.call_at(self._heard + self.idle_timeout, self._watch, address, writer)
        try:
            await self._session(address, reader, writer)
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None

    def _watch(self, address: str, writer: asyncio.StreamWriter, turns: int = 0) -> None:
        """The idle watchdog: due ``idle_timeout`` after the last read. If nothing came
        meanwhile, it looks again for a few turns of the loop (bytes that arrived while the
        loop was blocked take a turn or two to be read: a blocked loop is no silent broker),
        then aborts the connection (closing it would wait for the unwritten bytes)."""
        loop, idle = asyncio.get_running_loop(), self.idle_timeout
        assert idle is not None
        due = self._heard + idle
        if loop.time() < due:
            self._watchdog = loop.call_at(due, self._watch, address, writer)
        elif turns < WATCH_TURNS:
            self._watchdog = loop.call_soon(self._watch, address, writer, turns + 1)
        else:
            self._watchdog = None
            self._silent = f"{address} sent nothing for {idle:g} s (idle_timeout)"
            writer.transport.abort()

    async def _read(self, reader: asyncio.StreamReader) -> bytes:
        """What came from the broker (its time noted for the watchdog); ConnectionError at
        the end of the connection."""
        data = await reader.read(1 << 16)
        if not data:
            raise ConnectionError(self._silent or "the broker closed the connection")
        self._heard = asyncio.get_running_loop().time()
        return data

    async def _session(
        self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One connection's protocol: ``Hello``, ``Welcome``, advertisements and subscriptions
        again, unacknowledged publishes again, then every message as it comes."""
        writer.write(self.state.hello())
        frames = FrameDecoder()
        welcome: p.Welcome | None = None
        bodies: list[bytes] = []
        while welcome is None:
            bodies = frames.feed(await self._read(reader))
            while bodies and welcome is None:
                first = decode(bodies.pop(0))
                if isinstance(first, p.Keepalive):
                    continue
                if isinstance(first, p.Error):
                    raise ClientError(f"{address} refused the connection: {first.what}")
                if not isinstance(first, p.Welcome):
                    raise ClientError(f"{address} is not a flowbus broker (it said {type(first).__name__})")
                welcome = first
        self.state.welcomed(welcome)
        adverts = self.state.connected()  # (before any publish is sent again)
        self._writer = writer
        if adverts:
            writer.write(adverts)
        if not await self._resume(reader, frames, bodies):
            raise ConnectionError(f"{address} does not serve every subscription (not here)")
        self.status = Status.CONNECTED
        self._since = asyncio.get_running_loop().time()
        self._up.set()
        log.info(
            "client %s: connected to %s, %d subscriptions attached", self.name, address, len(self.state.subs)
        )
        self.state.resend()  # whatever was not acknowledged, again
        self._flush()
        while True:
            for body in frames.feed(await self._read(reader)):
                self._on_message(decode(body))

    async def _resume(self, reader: asyncio.StreamReader, frames: FrameDecoder, early: list[bytes]) -> bool:
        """Re-attach every subscription at this broker; False if some are not here (the
        caller moves on to the next broker: first to one a broker named as serving them).
        Homeless for longer than ``resume_timeout``, they are asked for afresh: a broker
        makes a durable one only if no other broker serves it."""
        state = self.state
        if not state.subs:
            for body in early:
                self._on_message(decode(body))
            state.homeless_since = None
            return True
        loop = asyncio.get_running_loop()
        start = loop.time()
        if state.homeless_since is None:
            state.homeless_since = start
        pending = set(state.subs)
        served_at: str | None = None  # (a broker named as serving one of them)
        while pending:
            fresh = loop.time() - state.homeless_since > self.resume_timeout
            reqs, data = state.resubscribe(sorted(pending), fresh=fresh)
            assert self._writer is not None
            self._writer.write(data)
            while reqs:
                bodies, early = early, []
                if not bodies:
                    bodies = frames.feed(await self._read(reader))
                for body in bodies:
                    got = decode(body)
                    if isinstance(got, p.Reply) and got.req in reqs:
                        sub_id = reqs.pop(got.req)
                        if got.ok:
                            pending.discard(sub_id)
                        elif not (got.error or "").startswith(p.NOT_HERE):  # refused for good (a right lost)
                            pending.discard(sub_id)
                            record = state.remove(sub_id)
                            if record is not None:
                                record.handle.end(
                                    SubscribeError(f"subscription {sub_id!r} ended: {got.error}")
                                )
                        elif (at := p.served_at(got.error or "")) is not None and at != state.broker:
                            served_at = at
                    else:
                        self._on_message(got)
            if pending:
                if loop.time() - start > 2.0 and len(state.addresses) > 1:
                    if served_at is not None:  # (named by this broker: the next one tried)
                        with contextlib.suppress(ValueError):
                            state.addresses.remove(served_at)
                        state.addresses.appendleft(served_at)
                    return False  # another broker may serve them: move on
                await asyncio.sleep(0.1)
        state.homeless_since = None
        return True

    def _on_message(self, msg: Any) -> None:
        """A message from the broker, through the state: deliveries handed to their
        subscriptions, waiters woken, replies answered, ended subscriptions ended."""
        h = self.state.receive(msg)
        for sub, epoch, cseq, event in h.offers:
            sub.offer(epoch, cseq, event)
        if h.acks_due:
            self._flush_soon()
        if h.acked:
            self._acked.set()
        if h.reply is not None:
            fut = self._replies.get(h.reply.req)
            if fut is not None and not fut.done():
                fut.set_result(h.reply)
        for sub, error in h.ended:
            sub.end(error)


def _expiry_check(publish_timeout: float) -> float:
    """Seconds between two checks for publishes unacknowledged for ``publish_timeout``."""
    return min(1.0, max(0.05, publish_timeout / 10))


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClientError(f"a broker address is HOST:PORT, got {address!r}")
    return host, int(port)
