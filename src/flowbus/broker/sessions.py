"""A broker's client connections: what each client says, and how the broker answers.

How it works (the client protocol is :mod:`flowbus.client.protocol`):

* **One session per client.** A client's first frame is ``Hello`` with its name; the
  runtime hands the connection to :meth:`Sessions.serve`, which answers ``Welcome`` (this
  broker, the ring's other brokers for reconnecting, the spaces and their schemas). A client
  that reconnects before its old connection was seen to go replaces it.
* **Identity and rights** (:mod:`flowbus.broker.acl`). A session's identity is its
  client certificate's name (TLS) or the one its ``Hello`` token stands for. ``Subscribe``
  needs the right ``subscribe`` on its space, ``Advertise`` ``publish``, ``Deploy`` and
  ``Undeploy`` ``deploy`` on the flow's name (each publish is checked by the ledger),
  ``ReloadAcl`` ``admin`` on ``acl`` (:mod:`flowbus.broker.reload` applies the new rights to
  the sessions). A refusal is the request's ``Reply`` with the error naming identity, right
  and space; nothing changes. A revoked client certificate opens no session: ``Error``.
  Until a client is authenticated (or if no ``acl`` is set), its frames are held to the
  small limit of the door (64 KiB).
* **Reading.** Each message goes to the part that handles it, in one ``match``:
  ``Publish`` to the publish ledger (:mod:`flowbus.broker.ledger`); ``Subscribe``,
  ``Unsubscribe`` and ``Ack`` to the subscription queues (:mod:`flowbus.broker.queues`);
  ``Advertise`` and ``Unadvertise`` to :mod:`flowbus.broker.adverts`; ``Deploy``,
  ``Undeploy`` and ``ListFlows`` to :mod:`flowbus.broker.flows`; ``Bye`` ends the session.
  A durable ``Subscribe`` for a subscription not known here and not resumed is answered
  once the ring has said that no other broker serves it (the broker's ``finder``,
  :class:`~flowbus.broker.handover.Finder`; "not here" if one does).
  A message a client may not send, or a malformed frame, is a
  :class:`~flowbus.errors.ProtocolError` for that connection only: the broker answers
  ``Error`` and closes it; nothing else changes. A read takes at most ``READ_BYTES``
  (16 KiB); after a full one the session lets the event loop turn (and write) first.
* **Steps.** What one read brings is one step of the core (each run of publishes in one
  call). A publishing connection is read at most every ``step_interval`` (the config's,
  5 ms by default): after a read that held publishes, the next one waits out the rest of
  the interval since the last one began, and takes what arrived meanwhile. A paced
  publisher's events thus reach the core in steps of a few milliseconds' worth instead of
  one per small frame: each step has costs its size does not change (the matcher's and the
  folds' calls, a write per subscriber connection, the acknowledgements it brings), paid
  fewer times. A connection quiet for longer than the interval is read at once, and one
  that sent no publish (requests, acknowledgements) is never held back; a stream's events
  wait at most the interval.
* **Writing.** A :class:`Session` gathers what one step of the event loop has for its
  client (replies, deliveries, publish acknowledgements) and writes it once, at the end of
  the step: the acknowledgements in one ``PubAck``, the deliveries in ``Events`` frames of at
  most 2,000 rows.
* **Keepalive.** One timer for all the sessions ticks every ``keepalive`` seconds (the
  config's, 1 s by default); at each tick a session that wrote nothing since the last one
  is written a ``Keepalive`` frame (ready-made bytes). A client thus hears from a live broker
  at least every two ticks, and one that hears nothing for its ``idle_timeout`` (10 s by
  default) takes the broker for paused or cut off and moves to another. The timer runs
  while there are sessions.
* **Deliveries per connection.** An event goes to a connection once, in one row naming
  every subscription of the connection it is for, numbered on the connection (``cseq``).
  The queues keep it in flight until the client acknowledges its number (``Ack``: ranges
  of numbers every subscription took), then settle it for each of them
  (:meth:`~flowbus.broker.queues.Queues.ack`); a session only writes the rows.
* **The end.** When a session ends, the deliveries in flight to it go back to the front of
  their queues. A ``Bye`` ends its non-durable subscriptions and withdraws its advertisements
  at once; a lost connection keeps both for a while (the subscriptions ``linger``; the client
  advertises again when it is back). Durable subscriptions wait for their client. A
  connection whose client cannot resume anything (a STOMP one's, :mod:`flowbus.broker.stomp`)
  ends its non-durable subscriptions with it, however it ends.
* **Other protocols.** :meth:`Sessions.run` reads any :class:`Connection`, with a function
  that turns what a read brings into the client protocol's messages; the STOMP door
  (:mod:`flowbus.broker.stomp`) serves its connections so, through the same :meth:`Sessions.take`
  and :meth:`Sessions.handle`, the same ledger and queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from flowbus.broker.acl import Acl
from flowbus.broker.handover import WHERE_WITHIN, Finder
from flowbus.broker.outbox import Outbox
from flowbus.broker.overlays import address_text
from flowbus.broker.pull import Pulls
from flowbus.client import protocol as p
from flowbus.errors import AccessError, FlowbusError, ProtocolError
from flowbus.flow.deploy import Deployment
from flowbus.net.codec import MAX_FRAME, FrameDecoder, decode, encode, frame
from flowbus.net.tls import CLIENTS_OU, identity

if TYPE_CHECKING:
    from flowbus.broker.adverts import Adverts
    from flowbus.broker.fence import Fence
    from flowbus.broker.flows import BrokerFlows
    from flowbus.broker.ledger import Ledger
    from flowbus.broker.queues import Queues

__all__ = ["EVENTS_PER_FRAME", "Connection", "Session", "Sessions"]

EVENTS_PER_FRAME = 2000
"""Deliveries per ``Events`` frame (frames stay well under the size limit)."""

KEEPALIVE = frame(encode(p.Keepalive()))
"""The keepalive frame, encoded once."""

READ_BYTES = 1 << 14
"""What one read of a connection takes at most, one step of the core: a broker behind a paced
publisher takes its backlog in steps of a few hundred events, each step's deliveries written
before the next step is read (not one step of all that waits, delivered at its end)."""


class Connection(Outbox, Protocol):
    """A client connection as the sessions drive it: an :class:`~flowbus.broker.outbox.Outbox`
    (what the parts write to it) that the sessions also flush, tick, close and read for. A
    native :class:`Session` is one, and so is a STOMP connection's
    :class:`~flowbus.broker.stomp.StompSession`."""

    writer: asyncio.StreamWriter
    closed: bool  # type: ignore[misc]  # (the sessions set it: Outbox only reads it)
    publishing: bool  # whether its last read held publishes (a stream: see "Steps")
    resumable: bool  # whether its client may attach again to what a lost connection had

    def flush(self) -> None:
        """Write what is gathered, in one call."""
        ...

    def tick(self) -> None:
        """A keepalive tick (see "Keepalive")."""
        ...

    def close(self) -> None:
        """Write what is gathered and close the connection."""
        ...


class Session:
    """One client connection: what is to be written to it (an :class:`~flowbus.broker.outbox.Outbox`;
    what is in flight on it is the queues')."""

    resumable = True  # (a lost connection's subscriptions linger for the client to resume)

    def __init__(self, client: str, writer: asyncio.StreamWriter, identity: str | None = None) -> None:
        self.client = client
        self.writer = writer
        self.identity = identity  # who the client is (certificate or token), None: nobody
        self.closed = False
        self.wrote = False  # whether it wrote since the last keepalive tick
        self.publishing = False  # whether its last read held publishes (a stream: see "Steps")
        self._out: list[Any] = []
        self._events: list[list[Any]] = []  # [sub ids, delivery number, publisher, pseq, event]
        self._last: Any = None  # the event of the last row (same_row: a row to extend)
        self._acks: list[int] = []
        self._flush_due = False

    def send(self, msg: Any) -> None:
        self._out.append(msg)
        self._due()

    def same_row(self, event: Any) -> bool:
        return event is self._last

    def extend_row(self, sub_ids: list[str]) -> None:
        self._events[-1][0].extend(sub_ids)

    def add_row(
        self, sub_ids: list[str], cseq: int, eid: Any, event: Any, *, extendable: bool = True
    ) -> None:
        self._last = event if extendable else None
        self._events.append([sub_ids, cseq, eid[0], eid[1], event])
        if not self._flush_due:
            self._due()

    def pub_ack(self, pseq: int) -> None:
        self._acks.append(pseq)
        self._due()

    def _due(self) -> None:
        if not self._flush_due and not self.closed:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is gathered, in one call."""
        self._flush_due = False
        if self.closed:
            return
        msgs = self._out
        if self._acks:
            msgs.append(p.PubAck(p.pack_pubacks(self._acks)))
        for i in range(0, len(self._events), EVENTS_PER_FRAME):
            msgs.append(p.Events(p.pack_event_rows(self._events[i : i + EVENTS_PER_FRAME])))
        self._out, self._acks, self._events, self._last = [], [], [], None
        if msgs:
            self.writer.write(b"".join(frame(encode(m)) for m in msgs))
            self.wrote = True

    def tick(self) -> None:
        """A keepalive tick: write ``Keepalive`` if nothing was written since the last one
        (nor is due at the end of this step)."""
        if self.wrote or self._flush_due or self.closed:
            self.wrote = False
        else:
            self.writer.write(KEEPALIVE)

    def close(self) -> None:
        """Write what is gathered and close the connection."""
        self.flush()
        self.closed = True
        with contextlib.suppress(Exception):
            self.writer.close()


class Sessions:
    """The client connections of a broker (see the module note). ``welcome`` gives the
    ``Welcome`` a new session is sent (the ring's brokers change); ``keepalive``: seconds
    between two keepalive ticks (None: no keepalives)."""

    def __init__(
        self,
        *,
        welcome: Callable[[], p.Welcome],
        ledger: Ledger,
        queues: Queues,
        adverts: Adverts,
        flows: BrokerFlows,
        acl: Acl | None = None,
        step_interval: float = 0.0,
        keepalive: float | None = None,
        fence: Fence | None = None,
    ) -> None:
        self.welcome = welcome
        self.step_interval = step_interval  # seconds between two reads of one connection
        self.keepalive = keepalive
        self.fence = fence  # (whether the broker may serve its clients: its ring lease)
        self._tick: asyncio.TimerHandle | None = None  # the next keepalive tick
        self.acl = acl or Acl()
        self.ledger = ledger
        self.queues = queues
        self.adverts = adverts
        self.flows = flows
        self.pulls = Pulls(queues)
        self.finder: Finder | None = None  # (a ring broker's: durable subscriptions served elsewhere)
        self.by_client: dict[str, Connection] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # reads the rights again (the broker's; ReloadAcl): (ok, error, what changed)
        self.reload: Callable[[], tuple[bool, str | None, Any]] = lambda: (False, "nothing to reload", None)

    async def serve(
        self,
        hello: p.Hello,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        early: list[bytes],
        frames: FrameDecoder,
    ) -> None:
        """Serve a client connection until it ends (the runtime's ``on_client``)."""
        refused = self.refusal(writer)
        if refused is not None:
            writer.write(frame(encode(p.Error(refused))))
            writer.close()
            return
        session = Session(hello.client, writer, self.identity_of(hello.token, writer))
        if session.identity is not None or not self.acl.enforced:
            frames.limit = MAX_FRAME
        self.open(session)
        session.send(self.welcome())
        await self.run(session, reader, lambda data: map(decode, frames.feed(data)), map(decode, early))

    def refusal(self, writer: asyncio.StreamWriter) -> str | None:
        """Why a new connection opens no session (None: it may): its client certificate is
        revoked, or the broker may not serve its clients (its ring lease is gone: the client
        goes elsewhere)."""
        revoked = self.acl.revocation(writer.get_extra_info("peercert"))
        if revoked is None and self.fence is not None and not self.fence.ok():
            revoked = self.fence.reason
        return revoked

    def open(self, session: Connection) -> None:
        """``session`` is its client's connection from now on (one the client had before,
        not seen to go yet, is ended); the keepalive ticks while there are sessions."""
        old = self.by_client.get(session.client)
        if old is not None:  # the client reconnected before we saw its old connection go
            self.end(old, bye=False)
        self.by_client[session.client] = session
        if self._tick is None and self.keepalive is not None:
            self._tick = asyncio.get_running_loop().call_later(self.keepalive, self._keepalive)

    async def run(
        self,
        session: Connection,
        reader: asyncio.StreamReader,
        translate: Callable[[bytes], Iterable[Any]],
        early: Iterable[Any] = (),
        *,
        idle: float | None = None,
    ) -> None:
        """Read ``session``'s connection until it ends, then end the session: ``early`` (the
        messages that came with the first frame) and then what each read brings, which
        ``translate`` turns into messages of the client protocol (the native frames decoded,
        or a STOMP connection's frames translated: :mod:`flowbus.broker.stomp`), each read
        one step (see "Steps"). ``idle``: seconds after which a silent connection is taken
        for lost (None: never). A malformed frame or a message a client may not send ends
        this connection only: ``Error`` is sent."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        bye = False
        loop, began = asyncio.get_running_loop(), -math.inf
        try:
            bye = self.take(session, early)
            while not bye and not session.closed:
                wait = began + self.step_interval - loop.time()
                if wait > 0 and session.publishing:  # (a stream: let more arrive, see "Steps")
                    await asyncio.sleep(wait)
                began = loop.time()
                if idle is None:
                    data = await reader.read(READ_BYTES)
                else:
                    async with asyncio.timeout(idle):
                        data = await reader.read(READ_BYTES)
                if not data:
                    break
                if self.fence is not None and not self.fence.ok():  # (read after a pause: the
                    raise ProtocolError(self.fence.reason)  # lease may be gone, nothing is taken)
                bye = self.take(session, translate(data))
                if len(data) == READ_BYTES:  # (more may wait: let the loop write what this
                    await asyncio.sleep(0)  # step delivered before the next one is read)
        except FlowbusError as e:  # a malformed frame or message: this connection only
            session.send(p.Error(str(e)))
            session.flush()
        except (OSError, ConnectionError, asyncio.CancelledError):  # (TimeoutError: idle)
            pass
        finally:
            self.end(session, bye=bye)
            if task is not None:
                self._tasks.discard(task)

    def _keepalive(self) -> None:
        """A keepalive tick (see "Keepalive"): the next one is due while there are sessions."""
        self._tick = None
        for session in self.by_client.values():
            session.tick()
        if self.by_client and self.keepalive is not None:
            self._tick = asyncio.get_running_loop().call_later(self.keepalive, self._keepalive)

    def identity_of(self, token: str | None, writer: asyncio.StreamWriter) -> str | None:
        """Who a connection's client is: its client certificate's name (a client's, not a
        broker's), else the identity ``token`` stands for (None: nobody)."""
        who = identity(writer.get_extra_info("peercert"))
        if who is not None and who[0] == CLIENTS_OU:
            return who[1]
        return self.acl.identity_of(token)

    def _denied(self, session: Connection, req: int, right: str, space: str) -> bool:
        """Whether ``session`` lacks ``right`` on ``space``: if so, the refusal is sent."""
        try:
            self.acl.check(session.identity, right, space)
        except AccessError as e:
            session.send(p.Reply(req, False, str(e)))
            return True
        return False

    def _pull_denied(self, session: Connection, req: int, sub_id: str) -> bool:
        """Whether ``session`` may not read pulled subscription ``sub_id``: it needs the
        subscribe right on the subscription's space (no such subscription: the pull says so)."""
        sub = self.queues.subs.get(sub_id)
        return sub is not None and self._denied(session, req, "subscribe", sub.space)

    def _deploy(self, session: Connection, msg: p.Deploy) -> None:
        """``msg``'s flow built once: refused if it is not a flow, or if ``session`` may not
        deploy it (by its name), else deployed."""
        ok, error, d = self.flows.answer(lambda: Deployment.from_text(msg.text))
        if not ok:
            session.send(p.Reply(msg.req, ok, error))
        elif not self._denied(session, msg.req, "deploy", d.name):
            session.send(p.Reply(msg.req, *self.flows.answer(lambda: self.flows.deploy(d))))

    def take(self, session: Connection, msgs: Iterable[Any]) -> bool:
        """Handle the messages one read brought, in order, each run of publishes in one step
        of the core (a busy broker then routes bigger batches: fewer passes of its matcher);
        True for ``Bye`` (what follows it is dropped). ``msgs`` may be lazy: a bad frame
        raises where it is, after what came before it was handled."""
        publishes: list[p.Publish] = []
        session.publishing = False
        for msg in msgs:
            if type(msg) is p.Publish:
                publishes.append(msg)
                continue
            if publishes:
                self.ledger.publish(session, publishes)
                publishes = []
                session.publishing = True
            if self.handle(session, msg):
                return True
        if publishes:
            self.ledger.publish(session, publishes)
            session.publishing = True
        return False

    async def _subscribe_afresh(self, session: Connection, msg: p.Subscribe, finder: Finder) -> None:
        """A durable subscription not known here, opened if no other broker serves it."""
        try:
            holder = await finder.holder(msg.sub_id)
        except TimeoutError:
            error: str | None = p.not_here(
                f"the ring did not say within {WHERE_WITHIN:.0f} s whether another broker serves it"
            )
        else:
            error = _served_elsewhere(holder, finder)
        if session.closed:
            return
        if error is not None:
            session.send(p.Reply(msg.req, False, error))
        else:
            session.send(p.Reply(msg.req, *self.queues.subscribe(session, msg)))

    async def _subscribe_many_afresh(self, session: Connection, msg: p.SubscribeMany, finder: Finder) -> None:
        """Durable subscriptions in bulk, made if no other broker serves any of them (one
        question round the ring for them all: the finder asks once a turn)."""
        try:
            holders = await asyncio.gather(*(finder.holder(s) for s in msg.sub_ids))
        except TimeoutError:
            error: str | None = p.not_here(
                f"the ring did not say within {WHERE_WITHIN:.0f} s whether another broker serves them"
            )
        else:
            held = [(s, h) for s, h in zip(msg.sub_ids, holders, strict=True) if h is not None]
            error = f"subscription {held[0][0]!r}: {_served_elsewhere(held[0][1], finder)}" if held else None
        if session.closed:
            return
        session.send(
            p.Reply(msg.req, *((False, error) if error else self.queues.subscribe_many(session, msg)))
        )

    def handle(self, session: Connection, msg: Any) -> bool:
        """Handle one message of ``session`` (the client protocol's): hand it to its part;
        True for ``Bye``."""
        match msg:
            case p.Publish():
                self.ledger.publish(session, [msg])
            case p.Ack():
                self.queues.ack(session, msg.ranges())
            case p.Subscribe():
                if self._denied(session, msg.req, "subscribe", msg.space):
                    pass
                elif (
                    self.finder is not None
                    and msg.durable
                    and not msg.resume
                    and self.queues.unknown(msg.sub_id)
                ):
                    task = asyncio.ensure_future(self._subscribe_afresh(session, msg, self.finder))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    session.send(p.Reply(msg.req, *self.queues.subscribe(session, msg)))
            case p.SubscribeMany():
                if self._denied(session, msg.req, "subscribe", msg.space):
                    pass
                elif self.finder is not None and msg.durable and msg.sub_ids:
                    task = asyncio.ensure_future(self._subscribe_many_afresh(session, msg, self.finder))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    session.send(p.Reply(msg.req, *self.queues.subscribe_many(session, msg)))
            case p.Unsubscribe():
                session.send(p.Reply(msg.req, *self.queues.unsubscribe(session, msg.sub_id)))
            case p.Advertise():
                if not self._denied(session, msg.req, "publish", msg.space):
                    session.send(p.Reply(msg.req, *self.adverts.advertise(session, msg)))
            case p.Unadvertise():
                session.send(p.Reply(msg.req, *self.adverts.unadvertise(session, msg.adv_id)))
            case p.Deploy():
                self._deploy(session, msg)
            case p.Undeploy():
                if not self._denied(session, msg.req, "deploy", msg.name):
                    session.send(p.Reply(msg.req, *self.flows.answer(lambda: self.flows.undeploy(msg.name))))
            case p.ReloadAcl():
                if not self._denied(session, msg.req, "admin", "acl"):
                    session.send(p.Reply(msg.req, *self.reload()))
            case p.ListFlows():
                session.send(p.Reply(msg.req, *self.flows.answer(self.flows.list)))
            case p.QueueOpen():
                if not self._denied(session, msg.req, "subscribe", msg.space):
                    session.send(p.Reply(msg.req, *self.pulls.open(session, msg)))
            case p.QueueRead():
                if not self._pull_denied(session, msg.req, msg.sub_id):
                    session.send(p.Reply(msg.req, *self.pulls.read(session, msg)))
            case p.QueueAck():
                if not self._pull_denied(session, msg.req, msg.sub_id):
                    session.send(p.Reply(msg.req, *self.pulls.ack(session, msg)))
            case p.Bye():
                return True
            case _:
                raise ProtocolError(f"a client may not send {type(msg).__name__}")
        return False

    def end(self, session: Connection, *, bye: bool) -> None:
        """``session`` ends (``bye``: its client said so): what was in flight on it goes back
        to its queues, its subscriptions end or wait (see "The end")."""
        if session.closed and self.by_client.get(session.client) is not session:
            return
        session.close()
        if self.by_client.get(session.client) is session:
            del self.by_client[session.client]
        self.queues.session_ended(session, bye=bye or not session.resumable)
        if bye:  # (a lost connection keeps them: the client advertises again when back)
            self.adverts.withdraw_all(session)

    def close_clients(self, reason: str) -> None:
        """Close every client connection with ``Error(reason)`` (the broker lost its lease, or
        the ring found it dead): the clients go to another broker."""
        for session in list(self.by_client.values()):
            session.send(p.Error(reason))
            session.flush()
            self.end(session, bye=False)
            session.writer.close()

    def close(self) -> None:
        """Close every connection (the broker stops): nothing more is written."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for session in list(self.by_client.values()):
            session.closed = True
            session.writer.close()
        for task in list(self._tasks):
            task.cancel()


def _served_elsewhere(holder: int | None, finder: Finder) -> str | None:
    """Why a durable subscription cannot be made afresh here, given the broker that serves
    it (None: nobody does, it can)."""
    if holder is None:
        return None
    if holder == finder.core.addr:  # (its queue on this disk goes to the one serving it)
        return p.not_here("its queue here is being handed over to the broker that serves it")
    return p.not_here(at=address_text(holder))
