"""The client protocol: what a client and a broker say to each other on one TCP connection.

How it works: frames are the broker network's own (length-prefixed msgpack, see
:mod:`flowbus.net.codec`), and the first frame a client sends is :class:`Hello`. A broker
tells a client connection from a peer broker's by that first frame, so brokers and clients
share one port.

Client -> broker:

* :class:`Hello` ``(client, version, token)``: a name unique to the client process (and
  a token naming its identity, if it has one; docs/security.md); the broker answers
  :class:`Welcome` (the ring's brokers, for reconnecting, and the spaces with their schemas).
* :class:`Publish` ``(space, batch)``: ``(pseq, event)`` pairs, packed in one plain
  msgpack blob (events are plain data; one C call of msgspec packs or unpacks a batch), in
  ``pseq`` order; an item into another space than the frame's is ``(pseq, event, space)``,
  so that one publisher's events into several spaces keep their order. ``pseq`` numbers the client's
  publishes from 1 up; ``(client, pseq)`` is the event's id everywhere. The broker answers
  :class:`PubAck` once every broker and every subscriber that needed the event has it (see
  the broker's custody), or :class:`Nack` for an event it refused (unknown space, schema).
  A client re-sends what was not acknowledged after a reconnect; the id removes duplicates.
* :class:`Subscribe` ``(req, sub_id, space, filter, durable, collapse, resume)``: answered by
  :class:`Reply` ``(req, ok, error)``. ``resume=True`` re-attaches to a subscription this
  client made before (on this broker or on the one that took over from a dead broker);
  a broker that does not serve it answers ``error="not here"``.
* :class:`SubscribeMany` ``(req, space, sub_ids, filters, durable, collapse)``: new
  subscriptions in bulk, answered by one :class:`Reply`: made all or none (refused, the
  error names the first bad one: ``sub_ids[i]`` and why), checked before any is made,
  recorded in one transaction and backed up in one copy.
* :class:`Unsubscribe` ``(req, sub_id)`` -> :class:`Reply`.
* :class:`Ack` ``(batch)``: ranges ``[first, last]`` of this connection's delivery numbers:
  every subscription those deliveries were for has taken them (the client counts, per
  delivery, the subscriptions still to take it).
* :class:`Deploy` ``(req, text)``, :class:`Undeploy` ``(req, name)``, :class:`ListFlows`
  ``(req)``: deploy a flow (its document, :attr:`flowbus.flow.deploy.Deployment.text`) on the
  network, withdraw one, list them; answered by :class:`Reply` whose ``data`` describes the
  flow(s) (name, version, spaces).
* :class:`QueueOpen` ``(req, sub_id, space, filter, resume)``, :class:`QueueRead` ``(req,
  sub_id, after, upto, limit, marks)``, :class:`QueueAck` ``(req, sub_id, upto)``: a *pulled*
  durable subscription (:mod:`flowbus.broker.pull`): no connection is attached to it, so
  every event it gets waits in its broker's SQLite queue at a position (the queue's
  increasing key); a reader reads positions ``(after, upto]`` as often as it likes and
  acknowledges up to a position when it is done with them. Answered by :class:`Reply`, whose
  ``data`` holds the name of the store whose positions they are (``store``), the highest
  position queued (``top``) and the rows read (``[position, publisher, pseq, event]``), or
  with ``marks`` each publisher's highest sequence number in the range (``marks``).
* :class:`ReloadAcl` ``(req)``: the broker reads the rights of its config file again
  (needs the ``admin`` right on ``acl``); answered by :class:`Reply` whose ``data`` says what
  changed (docs/security.md).
* :class:`Bye`: the client closes; its non-durable subscriptions end at once.

Broker -> client:

* :class:`Events` ``(batch)``: ``(sub_ids, cseq, event_id, event)`` deliveries, packed
  like ``Publish``'s: an event goes to a connection once, with the ids of every
  subscription of that connection it is for; ``cseq`` numbers the connection's deliveries
  from 1 up. Each subscription's events come in order.
* :class:`Error` ``(what)``: the connection broke the protocol (a bad frame), or its
  identity was revoked: the broker closes it after this.
* :class:`SubEnded` ``(sub_id, error)``: the broker ended the subscription (its client's
  identity lost the right to it): no more events come for it.
* :class:`Keepalive` ``()``: the broker has written nothing else to the connection for a
  while (its ``keepalive``, 1 s by default); a client hears from a live broker at least
  every two of them, and takes a broker silent for longer than its ``idle_timeout`` for gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from flowbus import wire
from flowbus.errors import ProtocolError

__all__ = [
    "Ack",
    "Advertise",
    "Bye",
    "Deploy",
    "Error",
    "Events",
    "Hello",
    "Keepalive",
    "ListFlows",
    "Nack",
    "PubAck",
    "Publish",
    "QueueAck",
    "QueueOpen",
    "QueueRead",
    "ReloadAcl",
    "Reply",
    "SubEnded",
    "Subscribe",
    "SubscribeMany",
    "Unadvertise",
    "Undeploy",
    "Unsubscribe",
    "Welcome",
]

PROTOCOL_VERSION = 1
"""The client protocol's version, sent in a Hello."""

_ENCODE = msgspec.msgpack.Encoder().encode  # (plain msgpack: the batches are plain data)
_DECODE = msgspec.msgpack.Decoder().decode


def _name(value: object, what: str) -> None:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ProtocolError(f"{what} must be a non-empty string of at most 200 characters, got {value!r}")


@wire.message("client.hello")
@dataclass(frozen=True, slots=True)
class Hello:
    client: str
    version: int = PROTOCOL_VERSION
    token: str | None = None  # an identity's token (the broker's config has its hash)

    def __post_init__(self) -> None:
        _name(self.client, "Hello.client")


@wire.message("client.welcome")
@dataclass(frozen=True, slots=True)
class Welcome:
    broker: str  # "host:port"
    peers: tuple[str, ...]
    spaces: dict[str, dict[str, str] | None]  # name -> schema (field -> type name), None: any


@wire.message("client.publish")
@dataclass(frozen=True, slots=True)
class Publish:
    """``batch``: plain msgpack of ``[[pseq, event], ...]`` (:func:`pack_publish`): events
    are plain data, and the hot path decodes them in one C call."""

    space: str
    batch: bytes

    def __post_init__(self) -> None:
        _name(self.space, "Publish.space")

    def items(self) -> list[tuple[int, dict[str, Any], str]]:
        """The ``(pseq, event, space)`` items; a :class:`ProtocolError` for a malformed batch."""
        raw = _unpack(self.batch, "Publish")
        out = []
        space = self.space
        for item in raw:
            if not (isinstance(item, list) and len(item) in (2, 3) and type(item[0]) is int):
                raise ProtocolError("Publish: each item is [pseq, event] or [pseq, event, space]")
            if len(item) == 3 and not isinstance(item[2], str):
                raise ProtocolError("Publish: an item's space is a name")
            out.append((item[0], item[1], item[2] if len(item) == 3 else space))
        return out


@wire.message("client.pub_ack")
@dataclass(frozen=True, slots=True)
class PubAck:
    """``batch``: plain msgpack of the acknowledged ``pseq`` numbers (:func:`pack_pubacks`)."""

    batch: bytes

    @property
    def pseqs(self) -> list[int]:
        raw = _unpack(self.batch, "PubAck")
        if not all(type(n) is int for n in raw):
            raise ProtocolError("PubAck: a list of publish sequence numbers")
        return raw


@wire.message("client.nack")
@dataclass(frozen=True, slots=True)
class Nack:
    pseq: int
    error: str


@wire.message("client.subscribe")
@dataclass(frozen=True, slots=True)
class Subscribe:
    req: int
    sub_id: str
    space: str
    filter: str
    durable: bool = False
    collapse: str | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        _name(self.sub_id, "Subscribe.sub_id")
        _name(self.space, "Subscribe.space")


@wire.message("client.subscribe_many")
@dataclass(frozen=True, slots=True)
class SubscribeMany:
    """New subscriptions ``sub_ids[i]`` of ``space`` with ``filters[i]``, all ``durable`` or
    none, each with the collapse rule set ``collapse``: made all or none."""

    req: int
    space: str
    sub_ids: tuple[str, ...]
    filters: tuple[str, ...]
    durable: bool = False
    collapse: str | None = None

    def __post_init__(self) -> None:
        _name(self.space, "SubscribeMany.space")
        if len(self.sub_ids) != len(self.filters):
            raise ProtocolError(f"SubscribeMany: {len(self.sub_ids)} sub_ids for {len(self.filters)} filters")
        for sub_id in self.sub_ids:
            _name(sub_id, "SubscribeMany.sub_ids[]")


@wire.message("client.unsubscribe")
@dataclass(frozen=True, slots=True)
class Unsubscribe:
    req: int
    sub_id: str


@wire.message("client.advertise")
@dataclass(frozen=True, slots=True)
class Advertise:
    """This client will publish events of ``space`` matching ``filter`` (brokers with
    ``advertising`` on: subscriptions go only towards advertised publishers, and a publish
    no advertisement of its client matches is refused)."""

    req: int
    adv_id: str
    space: str
    filter: str

    def __post_init__(self) -> None:
        _name(self.adv_id, "Advertise.adv_id")
        _name(self.space, "Advertise.space")


@wire.message("client.unadvertise")
@dataclass(frozen=True, slots=True)
class Unadvertise:
    req: int
    adv_id: str


@wire.message("client.reply")
@dataclass(frozen=True, slots=True)
class Reply:
    req: int
    ok: bool
    error: str | None = None
    data: Any = None  # what a request asked for (plain data), if anything


@wire.message("client.deploy")
@dataclass(frozen=True, slots=True)
class Deploy:
    req: int
    text: str


@wire.message("client.undeploy")
@dataclass(frozen=True, slots=True)
class Undeploy:
    req: int
    name: str


@wire.message("client.list_flows")
@dataclass(frozen=True, slots=True)
class ListFlows:
    req: int


@wire.message("client.ack")
@dataclass(frozen=True, slots=True)
class Ack:
    """``batch``: plain msgpack of ``[[first, last], ...]``: the deliveries of this connection
    numbered ``first`` to ``last`` (both in) are taken by every subscription they were for
    (:func:`pack_acks`)."""

    batch: bytes

    def ranges(self) -> list[tuple[int, int]]:
        raw = _unpack(self.batch, "Ack")
        try:
            out = [(a, b) for a, b in raw]
        except (TypeError, ValueError):
            raise ProtocolError("Ack: each item is [first, last]") from None
        if not all(type(a) is int and type(b) is int and 0 < a <= b for a, b in out):
            raise ProtocolError("Ack: each item is [first, last], delivery numbers with 0 < first <= last")
        return out


@wire.message("client.events")
@dataclass(frozen=True, slots=True)
class Events:
    """``batch``: plain msgpack of ``[[sub_ids, cseq, publisher, pseq, event], ...]``
    (:func:`pack_events`): one row per event and connection, for every subscription of the
    connection it goes to (``sub_ids``), numbered ``cseq`` on the connection from 1;
    ``(publisher, pseq)`` is the event's id."""

    batch: bytes

    def items(self) -> list[tuple[list[str], int, tuple[str, int], dict[str, Any]]]:
        raw = _unpack(self.batch, "Events")
        try:
            return [(s, d, (who, n), e) for s, d, who, n, e in raw]
        except (TypeError, ValueError):
            raise ProtocolError("Events: each item is [sub_ids, cseq, publisher, pseq, event]") from None


def pack_acks(ranges: Iterable[tuple[int, int]]) -> bytes:
    return _ENCODE([[a, b] for a, b in ranges])


def pack_pubacks(pseqs: Iterable[int]) -> bytes:
    return _ENCODE(list(pseqs))


def pack_publish(items: Sequence[tuple[int, Mapping[str, Any]]], spaces: Sequence[str] = ()) -> bytes:
    """``(pseq, event)`` items; with ``spaces``, each item's space, written for the items not
    in the first item's (the frame's) space."""
    if not spaces:
        return _ENCODE([[pseq, dict(event)] for pseq, event in items])
    first = spaces[0]
    rows = [
        [pseq, dict(event)] if space == first else [pseq, dict(event), space]
        for (pseq, event), space in zip(items, spaces, strict=True)
    ]
    return _ENCODE(rows)


def pack_events(items: Sequence[tuple[list[str], int, tuple[str, int], Mapping[str, Any]]]) -> bytes:
    return pack_event_rows([[s, d, eid[0], eid[1], e] for s, d, eid, e in items])


def pack_event_rows(rows: Sequence[list[Any]]) -> bytes:
    """An ``Events`` batch of rows ``[subscriptions, delivery number, publisher, pseq, event]``."""
    return _ENCODE(rows)


def _unpack(batch: bytes, what: str) -> list[Any]:
    try:
        raw = _DECODE(batch)
    except Exception as e:  # msgspec's own errors, ValueError, ...
        raise ProtocolError(f"{what}: a malformed batch ({type(e).__name__})") from None
    if not isinstance(raw, list):
        raise ProtocolError(f"{what}: a batch is a list")
    return raw


@wire.message("client.queue_open")
@dataclass(frozen=True, slots=True)
class QueueOpen:
    """Make (or find) the pulled durable subscription ``sub_id`` to ``space`` (``filter``);
    ``resume``: only find it (``error="not here"`` at a broker that does not serve it)."""

    req: int
    sub_id: str
    space: str
    filter: str
    resume: bool = False

    def __post_init__(self) -> None:
        _name(self.sub_id, "QueueOpen.sub_id")
        _name(self.space, "QueueOpen.space")


@wire.message("client.queue_read")
@dataclass(frozen=True, slots=True)
class QueueRead:
    """The first ``limit`` events of ``sub_id``'s queue at positions in ``(after, upto]``;
    ``marks``: instead, per publisher the highest sequence number queued there."""

    req: int
    sub_id: str
    after: int
    upto: int
    limit: int
    marks: bool = False


@wire.message("client.queue_ack")
@dataclass(frozen=True, slots=True)
class QueueAck:
    """``sub_id``'s events at positions up to ``upto`` are done with: dropped from its queue."""

    req: int
    sub_id: str
    upto: int


@wire.message("client.bye")
@dataclass(frozen=True, slots=True)
class Bye:
    pass


@wire.message("client.error")
@dataclass(frozen=True, slots=True)
class Error:
    what: str


@wire.message("client.reload_acl")
@dataclass(frozen=True, slots=True)
class ReloadAcl:
    req: int


@wire.message("client.sub_ended")
@dataclass(frozen=True, slots=True)
class SubEnded:
    sub_id: str
    error: str


@wire.message("client.keepalive")
@dataclass(frozen=True, slots=True)
class Keepalive:
    """Broker -> client: nothing else was written to the connection since the last tick."""


NOT_HERE = "not here"
"""The error of a ``Subscribe(resume=True)`` at a broker that does not serve it (and of a
durable one made afresh that another broker serves: :func:`not_here`)."""

_SERVED_AT = re.compile(r"broker (\S+) serves it")


def not_here(why: str = "", *, at: str | None = None) -> str:
    """The "not here" error, saying why, or naming ``at``, the broker that serves it."""
    if at is not None:
        why = f"broker {at} serves it"
    return f"{NOT_HERE}: {why}" if why else NOT_HERE


def served_at(error: str) -> str | None:
    """The broker a "not here" error names as serving the subscription, if it names one."""
    found = _SERVED_AT.search(error) if error.startswith(NOT_HERE) else None
    return found.group(1) if found else None
