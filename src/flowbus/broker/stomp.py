"""A broker's STOMP door: STOMP 1.1 and 1.2 clients on a port of their own, served by the
same sessions, queues and custody as the native protocol's (``--stomp HOST:PORT``, or
``stomp:`` in the config); and over WebSocket at the console's ``/stomp``
(:mod:`flowbus.broker.console`), each connection served by the same :meth:`StompDoor.serve`.

How it works: a STOMP connection is a translating front of a native session, not a second
broker. :class:`StompDoor` admits the connection (:class:`~flowbus.net.admission.Gate`: TLS
with the broker's certificate when it has one, the same deadline and caps) and reads its
CONNECT; a :class:`StompSession` is then the connection's
:class:`~flowbus.broker.sessions.Connection` (a :class:`~flowbus.broker.sessions.Session`
whose gathered rows, replies and publish acknowledgements are written as STOMP frames),
registered with the sessions like any client. The sessions read it with their own loop
(:meth:`Sessions.run <flowbus.broker.sessions.Sessions.run>`: steps, pacing, the lease, the
end), which hands each read to :meth:`StompSession.translate`: the frames it completes (the
sans-IO codec, :mod:`flowbus.net.stomp`) become messages of the client protocol
(:mod:`flowbus.client.protocol`), which the sessions hand to the ledger and the queues as
they do a native client's (:meth:`Sessions.take <flowbus.broker.sessions.Sessions.take>`).
What those parts write back through the outbox becomes STOMP frames.

The mapping
===========

==================  ==========================================================================
STOMP               flowbus
==================  ==========================================================================
CONNECT, STOMP      ``accept-version`` negotiated (1.2 or 1.1; none: ERROR); ``host`` ignored.
                    ``passcode``: a token, naming the identity as a ``Hello``'s does (a
                    client certificate wins); ``login`` is not checked. ``client-id`` names
                    the client: ``stomp:<client-id>`` (STOMP and native clients number their
                    publishes apart); none: a name of its own (``stomp:<session>``). A second
                    connection of one client-id replaces the first, as a native client's does.
                    CONNECTED: ``version``, ``heart-beat``, ``server``, ``session``.
SEND                ``Publish`` of the JSON object in the body (``content-type``
                    application/json, or none) into the space of ``destination`` (``NAME``,
                    ``/topic/NAME`` and ``/queue/NAME`` all name the space ``NAME``), numbered
                    on from the client's last publish (:meth:`~flowbus.broker.ledger.Ledger.last_taken`).
                    Checked by the ledger like any publish (space, schema, ``publish`` right);
                    a refusal (``Nack``) is an ERROR. ``receipt``: RECEIPT when the broker
                    takes custody (the ledger's ``PubAck``), never earlier.
SUBSCRIBE           ``Subscribe``: ``id`` (required), ``destination``, ``ack`` (``auto``,
                    ``client``, ``client-individual``), ``selector`` (JMS, through
                    :func:`~flowbus.filters.selector.selector`) or ``filter`` (flowbus
                    filter text); neither: every event of the space. Durable when named by
                    ``durable-subscription-name`` (or ActiveMQ's ``activemq.subscriptionName``):
                    subscription ``stomp:<client-id>/<name>``, which outlives the connection
                    and is attached again when the same client-id subscribes with the same
                    name (a client-id is needed). Others are
                    ``stomp:<client>/<session>/<id>``, ended with the connection.
                    ``receipt``: RECEIPT once the broker has answered (``Reply``).
MESSAGE             One per subscription of a delivery row: ``subscription`` (the SUBSCRIBE
                    id), ``message-id`` (numbered on the connection), ``destination`` (as
                    subscribed), ``ack`` (client modes: the message-id), ``event-id``
                    (``publisher:pseq``, the event's id on the bus), ``content-type``
                    application/json, ``content-length``; the body is the event as JSON,
                    without its hidden fields (the queues strip them, :func:`flowbus.meta.strip`).
ACK, NACK           ``id`` (1.1: ``message-id``): ``client-individual`` that message,
                    ``client`` every message of its subscription up to it. A row's delivery
                    number is acknowledged (``Ack``) once each of its messages is; ``auto``
                    messages are once written. NACK gives the messages back
                    (:meth:`Queues.give_back <flowbus.broker.queues.Queues.give_back>`): to the
                    front of their queues, sent again.
                    A durable subscription's ACK ``receipt``: RECEIPT once what it acknowledged
                    is consumed and the ring keeps so (see "Consumed" below).
UNSUBSCRIBE         ``Unsubscribe`` (a durable subscription ends too; a client that means to
                    come back disconnects instead); its messages waiting for an ACK go with it.
BEGIN, COMMIT,      SENDs (and ACKs, NACKs) naming a ``transaction`` wait in it: COMMIT
ABORT               publishes its SENDs as one ``Publish`` batch (one step of the core) and then
                    applies its ACKs; ABORT drops them all. Each SEND is checked (schema,
                    right) when it comes, so a COMMIT publishes all of them. A SEND's
                    ``receipt`` in a transaction is answered when it is taken into it; the
                    COMMIT's once every SEND of it is in custody. An unknown (or, at BEGIN,
                    known) transaction is an ERROR; those open at the end are aborted.
DISCONNECT          ``Bye``; its ``receipt`` is answered, then the connection closes.
heart-beats         ``heart-beat`` negotiated against the broker's ``keepalive``: the broker
                    sends an EOL when it wrote nothing for the agreed period, and takes a
                    connection silent for ``HEARTBEAT_GRACE`` times the period for lost.
ERROR               Whatever is wrong (a bad frame, a selector with its position, an unknown
                    space, a field that does not fit the schema, a refused right, a request
                    the broker refuses): ERROR with the reason in its ``message`` header (and
                    ``receipt-id`` when the frame that caused it asked for a receipt), then the
                    connection closes; nothing else on the broker changes.
==================  ==========================================================================

The end of a connection is a ``Bye`` for its subscriptions (:attr:`StompSession.resumable`
is False): STOMP has no way back to a subscription of a lost connection, so none lingers;
durable ones wait for their client as they do for a native client. Deliveries in flight go
back to the front of their queues (unacknowledged messages are sent again).

Consumed. A STOMP client cannot drop a message it had by its id, as flowbus's client does,
and a broker that takes over a dead one's subscription delivers again what it routed of late
and what the dead one had not confirmed (:mod:`flowbus.routing.ring_broker`). So each durable
subscription's connection keeps how far its client consumed each publisher's events
(:class:`Consumption`: acknowledged, in the publisher's order; an ``auto`` one's once
written) and tells the queues (:meth:`Queues.consume <flowbus.broker.queues.Queues.consume>`),
which put it in the ring state; a taker drops the deliveries it covers. An ACK's RECEIPT
waits until what it acknowledged is covered there and backed up: a message whose ACK was
receipted never comes again, wherever the subscription goes. One whose ACK was not
receipted when its broker died may come again (in doubt, as with any broker). A flow's
derived events are not counted (one entry per row of its state would be too many).

Acknowledgements out of order. A native client takes each subscription's events in order; a
``client-individual`` STOMP client may acknowledge them in any order, or NACK one. The queues
keep a durable subscription's events loaded from its SQLite queue until every one before them
is acknowledged (:meth:`SubQueue.acked_from_disk <flowbus.broker.queues.SubQueue.acked_from_disk>`),
so one acknowledged early is never the reason for deleting one that was not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import secrets
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from flowbus import __version__
from flowbus.broker.config import parse_address
from flowbus.broker.sessions import READ_BYTES, Session, Sessions
from flowbus.client import protocol as p
from flowbus.errors import AccessError, ConfigError, FilterError, FlowbusError
from flowbus.filters import parse
from flowbus.filters.selector import selector_source
from flowbus.net.admission import PRE_AUTH_FRAME, Admission, Gate
from flowbus.net.stomp import (
    MAX_BODY,
    MAX_HEADER_LINE,
    MAX_HEADERS,
    VERSIONS,
    Event,
    Frame,
    FrameReader,
    Heartbeat,
    StompError,
    encode,
    error_frame,
    escaped,
    negotiate_heartbeat,
    negotiate_version,
    receipt_frame,
)

__all__ = ["HEARTBEAT_GRACE", "PREFIX", "StompDoor", "StompSession", "StompSub", "space_of"]

log = logging.getLogger("flowbus.broker")

PREFIX = "stomp:"
"""What a STOMP client's name starts with: STOMP and native clients are apart (each numbers
its publishes its own way; the ledger takes ``(client, pseq)`` for an event's id)."""

HEARTBEAT_GRACE = 2.0
"""A connection that agreed to send heart-beats is taken for lost after this many of its
periods of silence."""

JSON = "application/json"
_TYPED = b"\ncontent-type:" + JSON.encode() + b"\ncontent-length:"  # (a MESSAGE's headers after event-id)
ACK_MODES = ("auto", "client", "client-individual")
DURABLE_HEADERS = ("durable-subscription-name", "activemq.subscriptionName")
"""The headers that name a durable subscription, the first found counts."""
DESTINATION_PREFIXES = ("/topic/", "/queue/")

_reqs = itertools.count(1)  # (request numbers of the native messages the door makes)


def space_of(destination: str) -> str:
    """The space a ``destination`` names: ``NAME``, ``/topic/NAME`` and ``/queue/NAME`` are ``NAME``."""
    for prefix in DESTINATION_PREFIXES:
        if destination.startswith(prefix):
            return destination[len(prefix) :]
    return destination


def _ranges(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ``numbers`` as ``(first, last)`` runs (an ``Ack``'s)."""
    out: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


_to_json = msgspec.json.Encoder(enc_hook=str)  # (a value JSON has no form for: its text)


def _json(event: dict[str, Any]) -> bytes:
    return _to_json.encode(event)


class Consumption:
    """How far a durable subscription's client has consumed each publisher's events: the
    highest sequence number below which it acknowledged every event it was sent
    (:attr:`upto`), from the messages sent and acknowledged (see "Consumed" in the module
    note). A publisher's events come in its order; one acknowledged before an earlier one
    counts once that one is too; one given back (NACK) keeps its place."""

    __slots__ = ("_open", "upto")

    def __init__(self, upto: Mapping[str, int]) -> None:
        self.upto = dict(upto)
        self._open: dict[str, dict[int, bool]] = {}  # publisher -> sequence number -> acknowledged, as sent

    def sent(self, publisher: str, pseq: int) -> None:
        if _counted(publisher, pseq) and pseq > self.upto.get(publisher, 0):
            self._open.setdefault(publisher, {}).setdefault(pseq, False)  # (again after a NACK: its place)

    def done(self, publisher: str, pseq: int) -> int | None:
        """Event ``pseq`` of ``publisher`` is acknowledged: how far that publisher's events
        are consumed now, if that moved (None: not)."""
        sent = self._open.get(publisher)
        if sent is None or pseq not in sent:
            return None
        sent[pseq] = True
        upto = None
        for n, acked in sent.items():  # (in the order sent: the first ones acknowledged)
            if not acked:
                break
            upto = n
        if upto is None:
            return None
        for n in [n for n in sent if n <= upto]:
            del sent[n]
        if not sent:
            del self._open[publisher]
        self.upto[publisher] = upto
        return upto

    def covers(self, publisher: str, pseq: int) -> bool:
        return not _counted(publisher, pseq) or pseq <= self.upto.get(publisher, 0)


def _counted(publisher: Any, pseq: Any) -> bool:
    """Whether an event id's consumption is kept: a publisher's (``client``, number); not a
    flow's derived event (``flow/space/key``, one entry per row of its state: many)."""
    return type(pseq) is int and isinstance(publisher, str) and "/" not in publisher


@dataclass(eq=False, slots=True)
class StompSub:
    """A STOMP subscription of a connection: its SUBSCRIBE's ``id`` and what it maps to."""

    id: str
    sub_id: str  # the native subscription's id
    destination: str  # as the client wrote it (its MESSAGEs name it)
    ack: str  # auto, client or client-individual
    consumption: Consumption | None = None  # (a durable one's) how far its client consumed
    unacked: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # ack id -> delivery
    # number, publisher, its sequence number: as sent
    head: bytes = b""  # its MESSAGEs' first bytes, to the message-id (made once: see _messages_of)
    middle: bytes = b""  # from the message-id to the event's own headers

    def __post_init__(self) -> None:
        self.head = b"MESSAGE\nsubscription:" + escaped(self.id) + b"\nmessage-id:"
        self.middle = b"\ndestination:" + escaped(self.destination) + b"\n"


@dataclass(slots=True)
class _Receipt:
    """A RECEIPT owed once ``left`` more publishes are acknowledged."""

    receipt_id: str
    left: int


@dataclass(slots=True)
class _Send:
    """A SEND taken into a transaction: its space and checked event."""

    space: str
    event: dict[str, Any]


class StompSession(Session):
    """A STOMP client's connection (see the module note): a :class:`Session` whose outbox is
    written as STOMP frames, and which translates the client's frames into the client
    protocol's messages (:meth:`translate`)."""

    resumable = False  # (no STOMP client can attach again to a lost connection's subscriptions)

    def __init__(
        self,
        sessions: Sessions,
        client: str,
        writer: asyncio.StreamWriter,
        identity: str | None,
        *,
        reader: FrameReader,
        name: str,
        version: str,
        named: bool,
    ) -> None:
        super().__init__(client, writer, identity)
        self.sessions = sessions
        self.reader = reader
        self.name = name  # (the CONNECTED frame's ``session``)
        self.version = version
        self.named = named  # whether its client-id named it (durable subscriptions need one)
        self._frames: list[bytes] = []  # STOMP frames to write before this step's MESSAGEs
        self._pseq = sessions.ledger.last_taken(client)
        self._subs: dict[str, StompSub] = {}  # SUBSCRIBE id -> subscription
        self._native: dict[str, StompSub] = {}  # native subscription id -> subscription
        self._ack_ids: dict[str, StompSub] = {}  # ack id -> its subscription (waiting for an ACK)
        self._left: dict[int, int] = {}  # delivery number -> its messages waiting for an ACK
        self._requests: dict[int, tuple[str, StompSub, str | None]] = {}  # req -> (what, sub, receipt)
        self._receipts: dict[int, _Receipt] = {}  # pseq -> the RECEIPT it is owed to
        self._tx: dict[str, list[_Send | Frame]] = {}  # open transactions
        self._messages = 0  # the last message-id
        self._error_receipt: str | None = None  # the receipt of the frame an error is about
        self._owed: list[tuple[StompSub, list[tuple[str, int]], str]] = []  # ACK receipts waiting
        # for what they acknowledged to be consumed, and kept (see _consumed)
        self.expects = 0.0  # seconds between the client's heart-beats (0: none)
        self._period = 0.0  # seconds between heart-beats it is sent (0: none)
        self._beat: asyncio.TimerHandle | None = None
        self._last_write = 0.0

    # -- the outbox: what the broker's parts write, as STOMP frames

    def send(self, msg: Any) -> None:
        """A message of the client protocol for the client, as STOMP: a ``Reply`` answers a
        SUBSCRIBE or UNSUBSCRIBE (RECEIPT, or ERROR), a ``Nack`` (a refused publish),
        ``Error`` and ``SubEnded`` are ERRORs; others have no STOMP form."""
        if self.closed:
            return
        match msg:
            case p.Reply(req=req, ok=ok, error=error):
                asked = self._requests.pop(req, None)
                if asked is None:
                    return
                what, sub, receipt = asked
                if ok:
                    self._receipt(receipt)
                else:
                    self._subs.pop(sub.id, None)
                    self._native.pop(sub.sub_id, None)
                    self.fail(f"{what.upper()} {sub.id!r}: {error}", receipt)
            case p.Nack(pseq=pseq, error=error):
                owed = self._receipts.pop(pseq, None)
                self.fail(f"SEND refused: {error}", owed.receipt_id if owed is not None else None)
            case p.Error(what=what):
                self.fail(what, self._error_receipt)
            case p.SubEnded(sub_id=sub_id, error=error):
                ended = self._native.get(sub_id)
                self.fail(f"subscription {ended.id if ended else sub_id!r} ended: {error}")

    def tick(self) -> None:
        """The native keepalive is not STOMP's: heart-beats keep their own time."""

    def fail(self, message: str, receipt: str | None = None) -> None:
        """ERROR with ``message`` (and ``receipt-id``), then the connection closes."""
        if self.closed:
            return
        log.info("STOMP client %s (session %s): ERROR %s", self.client, self.name, message)
        self.flush()  # (what this step gathered goes first: the ERROR is the last frame)
        self._frames.append(encode(error_frame(message, receipt_id=receipt, detail=message)))
        self.close()

    def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        super().close()

    def flush(self) -> None:
        """Write what is gathered, in one call: frames (RECEIPTs, ERRORs), the RECEIPTs of
        publishes acknowledged, then a MESSAGE per subscription of each delivery row; the
        rows only ``auto`` subscriptions took are acknowledged once written."""
        self._flush_due = False
        if self.closed:
            return
        out = self._frames
        for pseq in self._acks:
            owed = self._receipts.pop(pseq, None)
            if owed is not None:
                owed.left -= 1
                if owed.left == 0:
                    out.append(encode(receipt_frame(owed.receipt_id)))
        done: list[int] = []
        consumed: dict[str, dict[str, int]] = {}  # (auto subscriptions': taken once written)
        for sub_ids, cseq, publisher, pseq, event in self._events:
            if not self._messages_of(out, sub_ids, cseq, publisher, pseq, event, consumed):
                done.append(cseq)
        self._frames, self._acks, self._events, self._last = [], [], [], None
        loop = asyncio.get_running_loop()
        if out:
            self.writer.write(b"".join(out))
            self._last_write = loop.time()
        if done:  # (on the next turn: a flush may come from inside a part, or a step's end)
            loop.call_soon(self._taken, p.Ack(p.pack_acks(_ranges(done))))
        for sub_id, upto in consumed.items():
            loop.call_soon(functools.partial(self.sessions.queues.consume, sub_id, upto, now=False))

    def _taken(self, ack: p.Ack) -> None:
        """Rows ``auto`` subscriptions took, acknowledged (if the connection is still on:
        else they went back to their queues with it)."""
        if not self.closed:
            self.sessions.handle(self, ack)

    def _messages_of(
        self,
        out: list[bytes],
        sub_ids: list[str],
        cseq: int,
        publisher: str,
        pseq: int,
        event: Any,
        consumed: dict[str, dict[str, int]],
    ) -> int:
        """The MESSAGEs of a delivery row, one per subscription still here; how many of them
        wait for an ACK. What durable ``auto`` subscriptions consume by it goes into ``consumed``."""
        body, left = _json(event), 0
        eid, size = escaped(f"{publisher}:{pseq}"), str(len(body)).encode()
        tail = b"".join((b"event-id:", eid, _TYPED, size, b"\n\n", body, b"\x00"))  # (each subscription's)
        for sub_id in sub_ids:
            sub = self._native.get(sub_id)
            if sub is None:  # (unsubscribed meanwhile: the queues took the row back from it)
                continue
            self._messages += 1
            mid = str(self._messages)
            number = mid.encode()
            if sub.consumption is not None:
                sub.consumption.sent(publisher, pseq)
            if sub.ack != "auto":
                out += (sub.head, number, sub.middle, b"ack:", number, b"\n", tail)
                sub.unacked[mid] = (cseq, publisher, pseq)
                self._ack_ids[mid] = sub
                left += 1
                continue
            out += (sub.head, number, sub.middle, tail)
            if sub.consumption is not None and (upto := sub.consumption.done(publisher, pseq)) is not None:
                consumed.setdefault(sub.sub_id, {})[publisher] = upto
        if left:
            self._left[cseq] = left
        return left

    def connected(self, heartbeat: tuple[int, int], *, sends: float, expects: float) -> None:
        """Answer the CONNECT: CONNECTED, offering ``heartbeat`` (ms); heart-beats are then
        sent every ``sends`` seconds and expected every ``expects`` (0: none)."""
        headers = [
            ("version", self.version),
            ("heart-beat", f"{heartbeat[0]},{heartbeat[1]}"),
            ("server", f"flowbus/{__version__}"),
            ("session", self.name),
        ]
        self._frames.append(encode(Frame("CONNECTED", headers)))
        self.flush()
        self.expects = expects
        self.heartbeat(sends)

    def _receipt(self, receipt: str | None) -> None:
        if receipt is not None:
            self._frames.append(encode(receipt_frame(receipt)))
            self._due()

    # -- heart-beats

    def heartbeat(self, period: float) -> None:
        """Send an EOL whenever nothing was written for ``period`` seconds (0: never)."""
        self._period = period
        if period > 0:
            self._last_write = asyncio.get_running_loop().time()
            self._beat = asyncio.get_running_loop().call_later(period, self._heartbeat)

    def _heartbeat(self) -> None:
        self._beat = None
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._last_write + self._period * 0.9:  # (a timer may fire a bit early)
            self.writer.write(b"\n")
            self._last_write = loop.time()
        self._beat = loop.call_at(self._last_write + self._period, self._heartbeat)

    # -- the client's frames, as the client protocol's messages

    def translate(self, data: bytes) -> Iterator[Any]:
        """The messages of the client protocol the frames in ``data`` make, lazily: a frame
        is translated once the messages before it were taken (:meth:`Sessions.take
        <flowbus.broker.sessions.Sessions.take>` handles each at once, but a run of publishes
        together, before the next message of another kind). A malformed frame raises after
        the messages of those before it."""
        try:
            events = self.reader.feed(data)
        except StompError as e:
            yield from self.frames(e.events)
            raise
        yield from self.frames(events)

    def frames(self, events: Iterable[Event]) -> Iterator[Any]:
        """The messages ``events`` (complete frames, heart-beats) make; none once closed."""
        for frame in events:
            if self.closed:
                return
            if isinstance(frame, Heartbeat):  # (the read itself showed the client alive)
                continue
            self._error_receipt = frame.header("receipt")
            yield from self._frame(frame)
            self._error_receipt = None

    def _frame(self, frame: Frame) -> Iterator[Any]:
        match frame.command:
            case "SEND":
                yield from self._send(frame)
            case "SUBSCRIBE":
                yield from self._subscribe(frame)
            case "UNSUBSCRIBE":
                yield from self._unsubscribe(frame)
            case "ACK" | "NACK":
                tx = frame.header("transaction")
                if tx is not None:
                    self._transaction(frame, tx).append(frame)
                    self._receipt(frame.header("receipt"))
                else:
                    yield from self._ack(frame)
            case "BEGIN":
                tx = _required(frame, "transaction")
                if tx in self._tx:
                    raise StompError(f"BEGIN: transaction {tx!r} is open already")
                self._tx[tx] = []
                self._receipt(frame.header("receipt"))
            case "COMMIT":
                yield from self._commit(frame)
            case "ABORT":
                tx = _required(frame, "transaction")
                self._transaction(frame, tx)
                del self._tx[tx]
                self._receipt(frame.header("receipt"))
            case "DISCONNECT":
                self._receipt(frame.header("receipt"))
                yield p.Bye()
            case _:  # CONNECT, STOMP
                raise StompError(f"{frame.command} on a connected session")

    def _transaction(self, frame: Frame, tx: str) -> list[_Send | Frame]:
        taken = self._tx.get(tx)
        if taken is None:
            raise StompError(f"{frame.command}: no transaction {tx!r} is open")
        return taken

    def _send(self, frame: Frame) -> Iterator[Any]:
        destination = _required(frame, "destination")
        space = space_of(destination)
        kind = frame.header("content-type")
        if kind is not None and kind.split(";")[0].strip().lower() != JSON:
            raise StompError(f"SEND to {destination!r}: content-type {kind!r}; an event is {JSON}")
        try:
            event = json.loads(frame.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise StompError(f"SEND to {destination!r}: the body is not JSON ({e})") from None
        if not isinstance(event, dict):
            raise StompError(
                f"SEND to {destination!r}: the body is a JSON object (an event), not {event!r:.40}"
            )
        receipt, tx = frame.header("receipt"), frame.header("transaction")
        if tx is not None:
            taken = self._transaction(frame, tx)
            self._check(space, event)
            taken.append(_Send(space, event))
            self._receipt(receipt)
            return
        self._pseq += 1
        if receipt is not None:
            self._receipts[self._pseq] = _Receipt(receipt, 1)
        yield p.Publish(space, p.pack_publish([(self._pseq, event)]))

    def _check(self, space: str, event: dict[str, Any]) -> None:
        """What the ledger would refuse of a SEND into a transaction, refused now: the
        space's schema, the ``publish`` right (a COMMIT then publishes all its SENDs)."""
        fields, error = self.sessions.ledger.spaces.check_event(space, event)
        if fields is None:
            raise StompError(f"SEND refused: {error}")
        try:
            self.sessions.acl.check(self.identity, "publish", space)
        except AccessError as e:
            raise StompError(f"SEND refused: {e}") from None

    def _commit(self, frame: Frame) -> Iterator[Any]:
        tx = _required(frame, "transaction")
        taken = self._transaction(frame, tx)
        del self._tx[tx]
        sends = [t for t in taken if isinstance(t, _Send)]
        receipt = frame.header("receipt")
        if sends:
            first = self._pseq + 1
            self._pseq += len(sends)
            items = [(first + i, s.event) for i, s in enumerate(sends)]
            if receipt is not None:
                owed = _Receipt(receipt, len(sends))
                self._receipts.update((pseq, owed) for pseq, _ in items)
            yield p.Publish(sends[0].space, p.pack_publish(items, [s.space for s in sends]))
        elif receipt is not None:
            self._receipt(receipt)
        for acked in taken:
            if isinstance(acked, Frame):
                yield from self._ack(acked, answered=True)  # (its RECEIPT came when taken in)

    def _subscribe(self, frame: Frame) -> Iterator[Any]:
        sid, destination = _required(frame, "id"), _required(frame, "destination")
        if sid in self._subs:
            raise StompError(f"SUBSCRIBE: this connection has a subscription {sid!r} already")
        ack = frame.header("ack") or "auto"
        if ack not in ACK_MODES:
            raise StompError(f"SUBSCRIBE {sid!r}: ack {ack!r} (one of {', '.join(ACK_MODES)})")
        text, jms = frame.header("filter"), frame.header("selector")
        if text is not None and jms is not None:
            raise StompError(f"SUBSCRIBE {sid!r}: a selector or a filter, not both")
        if jms is not None:
            try:  # (the filter text parsed once here, and from the parser's memo at the queues)
                text = selector_source(jms)
                parse(text)
            except FilterError as e:
                raise FilterError(f"SUBSCRIBE {sid!r}: selector {jms!r}: {e}") from None
        durable = next((n for h in DURABLE_HEADERS if (n := frame.header(h))), None)
        if durable is not None and not self.named:
            raise StompError(f"SUBSCRIBE {sid!r}: a durable subscription needs a client-id header at CONNECT")
        sub_id = f"{self.client}/{durable}" if durable is not None else f"{self.client}/{self.name}/{sid}"
        msg = p.Subscribe(next(_reqs), sub_id, space_of(destination), text or "true", durable is not None)
        if sub_id in self._native:
            raise StompError(f"SUBSCRIBE {sid!r}: durable subscription {durable!r} is attached already")
        sub = StompSub(sid, sub_id, destination, ack)
        if durable is not None:  # (how far its client consumed: where a taker left it, if one did)
            sub.consumption = Consumption(self.sessions.queues.consumed(sub_id))
        self._subs[sid] = self._native[sub_id] = sub
        self._requests[msg.req] = ("subscribe", sub, frame.header("receipt"))
        yield msg

    def _unsubscribe(self, frame: Frame) -> Iterator[Any]:
        sid = _required(frame, "id")
        sub = self._subs.pop(sid, None)
        if sub is None:
            raise StompError(f"UNSUBSCRIBE: no subscription {sid!r} on this connection")
        del self._native[sub.sub_id]
        done = [cseq for mid, (cseq, _, _) in sub.unacked.items() if self._release(mid, cseq)]
        for owed in [o for o in self._owed if o[0] is sub]:  # (nothing left to keep for it)
            self._owed.remove(owed)
            self._receipt(owed[2])
        req = next(_reqs)
        self._requests[req] = ("unsubscribe", sub, frame.header("receipt"))
        yield p.Unsubscribe(req, sub.sub_id)
        if done:  # (the row's other subscriptions have it: settled for them)
            yield p.Ack(p.pack_acks(_ranges(done)))

    def _ack(self, frame: Frame, *, answered: bool = False) -> Iterator[Any]:
        """ACK or NACK: the message named, and with ``client`` every message of its
        subscription before it; a row's delivery number is acknowledged once each of its
        messages is (NACKed ones are given back to their queues first)."""
        ack_id = frame.header("id") if self.version != "1.1" else frame.header("message-id")
        if ack_id is None:
            raise StompError(
                f"{frame.command} without the {'id' if self.version != '1.1' else 'message-id'} header"
            )
        sub = self._ack_ids.get(ack_id)
        if sub is None:
            raise StompError(f"{frame.command} {ack_id!r}: no message of this connection waits for it")
        if sub.ack == "client":  # (cumulative: every message of the subscription up to it)
            mids = [*itertools.takewhile(lambda m: m != ack_id, sub.unacked), ack_id]
        else:
            mids = [ack_id]
        taken = [(mid, sub.unacked.pop(mid)) for mid in mids]
        receipt = None if answered else frame.header("receipt")
        if frame.command == "NACK":
            self.sessions.queues.give_back(self, [(cseq, sub.sub_id) for _, (cseq, _, _) in taken])
        elif sub.consumption is not None:  # (its RECEIPT once the ring keeps what it consumed)
            self._consumed(sub, [(pub, pseq) for _, (_, pub, pseq) in taken], receipt)
            receipt = None
        done = [cseq for mid, (cseq, _, _) in taken if self._release(mid, cseq)]
        if done:
            yield p.Ack(p.pack_acks(_ranges(done)))
        self._receipt(receipt)

    def _consumed(self, sub: StompSub, acked: list[tuple[str, int]], receipt: str | None) -> None:
        """A durable subscription's client acknowledged ``acked`` (publisher, sequence
        number): how far it consumed each publisher goes into the ring state (see
        "Consumed"); the ACK's ``receipt`` comes once each of them is covered there and
        backed up, so a broker that takes the subscription over never sends it again."""
        consumption = sub.consumption
        assert consumption is not None
        moved = {pub: upto for pub, pseq in acked if (upto := consumption.done(pub, pseq)) is not None}
        if receipt is not None:
            self._owed.append((sub, acked, receipt))
        if not moved and receipt is None:
            return
        waiting = any(o[0] is sub for o in self._owed)  # (a receipt waits: backed up at once)
        version = self.sessions.queues.consume(sub.sub_id, moved, now=waiting) if moved else 0
        for owed in [o for o in self._owed if o[0] is sub and all(consumption.covers(*a) for a in o[1])]:
            self._owed.remove(owed)
            self.sessions.queues.when_backed_up(version, functools.partial(self._receipt, owed[2]))

    def _release(self, mid: str, cseq: int) -> bool:
        """Message ``mid`` (of row ``cseq``) waits no more: whether the whole row is done."""
        self._ack_ids.pop(mid, None)
        left = self._left.get(cseq, 1) - 1
        if left:
            self._left[cseq] = left
            return False
        self._left.pop(cseq, None)
        return True


def _required(frame: Frame, name: str) -> str:
    value = frame.header(name)
    if not value:
        raise StompError(f"{frame.command} has no {name} header")
    return value


class StompDoor:
    """A broker's STOMP listener (see the module note): made by :meth:`start`, stopped by
    :meth:`close`; :meth:`serve` serves one connection (the console's WebSockets use a door
    made without a listener when the broker has none). ``heartbeat``: the seconds between
    heart-beats the broker offers (its ``keepalive``)."""

    def __init__(self, sessions: Sessions, admission: Admission, *, heartbeat: float) -> None:
        self.sessions = sessions
        self.admission = admission
        beat = max(1, round(heartbeat * 1000))
        self.heartbeat = (beat, beat)  # (the CONNECTED frame's heart-beat: sx, sy in ms)
        self.gate = Gate(admission, lambda reader, writer, _tls: self.serve(reader, writer))
        self.host = ""
        self.port = 0

    @classmethod
    async def start(
        cls, sessions: Sessions, address: str, *, admission: Admission, heartbeat: float
    ) -> StompDoor:
        """Listen on ``address`` (``"host:port"``, port 0: any free port); a
        :class:`ConfigError` if it cannot. TLS as ``admission`` says (the broker's
        certificate), plain text refused then."""
        host, port = parse_address(address)
        door = cls(sessions, dataclasses.replace(admission, plain_peers=False), heartbeat=heartbeat)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            raise ConfigError(f"--stomp {address}: {e.strerror}") from None
        door.host, door.port = sock.getsockname()[:2]
        door.gate.start(sock)
        return door

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        await self.gate.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection: its CONNECT within the door's deadline (what comes before it held to
        the door's small limit), then a session until it ends. The listener's admitted
        connections, and the console's WebSocket ones (:mod:`flowbus.broker.console`: the
        WebSocket as a reader and a writer, :class:`~flowbus.broker.websocket.WebSocketStream`)."""
        frames = FrameReader(
            "server", max_headers=16, max_header_line=PRE_AUTH_FRAME // 16, max_body=PRE_AUTH_FRAME
        )
        try:
            async with asyncio.timeout(self.admission.handshake_timeout):
                first, rest = await _connect_frame(reader, frames)
        except StompError as e:
            writer.write(encode(error_frame(str(e))))
            return
        except TimeoutError:
            log.info("STOMP connection closed: no CONNECT in %.1f s", self.admission.handshake_timeout)
            return
        if first is None:
            return
        session = self._open(first, writer, frames)
        if isinstance(session, Frame):  # (refused: the ERROR saying why)
            writer.write(encode(session))
            return
        await self.sessions.run(
            session,
            reader,
            session.translate,
            session.frames(rest),
            idle=session.expects * HEARTBEAT_GRACE if session.expects else None,
        )

    def _open(
        self, connect: Frame, writer: asyncio.StreamWriter, frames: FrameReader
    ) -> StompSession | Frame:
        """The session of a CONNECT (or STOMP) frame, registered and answered CONNECTED; or
        the ERROR frame saying why not."""
        receipt = connect.header("receipt")
        if connect.command not in ("CONNECT", "STOMP"):
            first = f"the first frame is CONNECT (or STOMP), not {connect.command}"
            return error_frame(first, receipt_id=receipt)
        version = negotiate_version(connect.header("accept-version"))
        if version is None:
            offered = connect.header("accept-version") or "1.0"
            refusal = error_frame(
                f"no common version: the client accepts {offered}, this broker speaks {', '.join(VERSIONS)}",
                receipt_id=receipt,
            )
            refusal.headers.insert(0, ("version", ",".join(VERSIONS)))
            return refusal
        try:
            sends, expects = negotiate_heartbeat(connect.header("heart-beat"), self.heartbeat)
        except StompError as e:
            return error_frame(str(e), receipt_id=receipt)
        refused = self.sessions.refusal(writer)
        if refused is not None:
            return error_frame(refused, receipt_id=receipt)
        name = secrets.token_hex(6)
        client_id = connect.header("client-id")
        client = PREFIX + (client_id or name)
        try:
            p.Hello(client)  # (a client's name: as long as a native one's may be)
        except FlowbusError as e:
            return error_frame(f"client-id: {e}", receipt_id=receipt)
        identity = self.sessions.identity_of(connect.header("passcode"), writer)
        frames.max_headers, frames.max_header_line = MAX_HEADERS, MAX_HEADER_LINE
        frames.max_body = PRE_AUTH_FRAME if identity is None and self.sessions.acl.enforced else MAX_BODY
        session = StompSession(
            self.sessions,
            client,
            writer,
            identity,
            reader=frames,
            name=name,
            version=version,
            named=bool(client_id),
        )
        self.sessions.open(session)
        session.connected(self.heartbeat, sends=sends / 1000, expects=expects / 1000)
        return session


async def _connect_frame(
    reader: asyncio.StreamReader, frames: FrameReader
) -> tuple[Frame | None, list[Event]]:
    """The first frame of a connection (heart-beats before it skipped) and the events after
    it in the same read; None at the end of the stream."""
    while True:
        data = await reader.read(READ_BYTES)
        if not data:
            return None, []
        events = frames.feed(data)
        for i, event in enumerate(events):
            if isinstance(event, Frame):
                return event, events[i + 1 :]
