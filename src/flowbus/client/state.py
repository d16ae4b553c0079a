"""The client's protocol without I/O: everything :class:`~flowbus.client.Client` knows and
decides, and nothing it waits for.

How it works: :class:`ClientState` is a state machine in the manner of h11. Its driver (the
asyncio :class:`~flowbus.client.Client`, and through it :class:`~flowbus.client.SyncClient`)
tells it what happened (a publish asked for, a message from the broker, a delivery taken, a
connection made or lost, the time) and writes what it gives (:meth:`ClientState.outgoing`);
nothing here touches a socket, a clock, a future or the event loop, so all of it is tested
by feeding it messages (``tests/client/test_state.py``).

* **Brokers.** :attr:`~ClientState.addresses` holds those given, then those the brokers
  named (:meth:`~ClientState.welcomed`); :meth:`~ClientState.next_address` rotates them.
* **Publishing.** :meth:`~ClientState.check` checks an event against its space's schema (the
  broker's ``Welcome`` lists them); :meth:`~ClientState.publish` numbers it (its ``pseq``)
  and keeps it, in pseq order, until the broker acknowledges it (``PubAck``) or refuses it
  (``Nack``: a :class:`PublishError` waits in :attr:`~ClientState.errors` until raised).
  :attr:`~ClientState.full` says the window of unacknowledged publishes is full (the driver
  waits); :meth:`~ClientState.expire` gives up those unacknowledged for too long.
* **Deliveries.** A connection is an *epoch* (:meth:`~ClientState.connected`). An ``Events``
  frame's deliveries go to the subscriptions they name, each dropping an event id it has had
  already (:class:`Seen`: at least the last ``dedup`` ids); the state counts per delivery
  the subscriptions that must take it, and :meth:`~ClientState.took` counts one down: a
  delivery every subscription took (or that none wanted) is acknowledged.
* **Out.** :meth:`~ClientState.outgoing` gives the bytes due: the publishes not sent on this
  connection yet, in pseq order whatever their spaces (a publisher's order is kept), in
  frames of at most 2,000, then the acknowledgements as ranges of delivery numbers. After a
  reconnect :meth:`~ClientState.resend` queues every unacknowledged publish again.
* **Subscriptions and requests.** :meth:`~ClientState.add` records a subscription (its
  options, and the driver's ``handle`` for it); a request is numbered by
  :meth:`~ClientState.request_id`. :meth:`~ClientState.resubscribe` gives the ``Subscribe``
  requests that re-attach subscriptions at a new broker (asking afresh, ``resume`` off, once
  they have been without a broker for ``resume_timeout``).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flowbus.client import protocol as p
from flowbus.errors import ClientError, ProtocolError, PublishError, SchemaError, SubscribeError
from flowbus.model import Schema
from flowbus.net.codec import encode, frame

__all__ = ["BATCH", "ClientState", "Happened", "Seen", "Subscribed", "ranges"]

BATCH = 2000
"""The most publishes one ``Publish`` frame carries."""


_NONE_SEEN: frozenset[Any] = frozenset()


class Seen:
    """The event ids a subscription has had lately: at least the last ``limit`` (two sets of
    ``limit`` ids, the older dropped when the newer is full)."""

    __slots__ = ("_before", "_now", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._now: set[Any] | frozenset[Any] = _NONE_SEEN  # (made on the first event: two empty
        self._before: set[Any] | frozenset[Any] = _NONE_SEEN  # sets cost 432 bytes a subscription)

    def first(self, eid: Any) -> bool:
        """Whether ``eid`` is new (noted), not one had already."""
        key = tuple(eid) if isinstance(eid, list) else eid
        now = self._now
        if key in now or key in self._before:
            return False
        if type(now) is not set:
            now = self._now = set()
        now.add(key)
        if len(now) >= self.limit:
            self._before, self._now = now, set()
        return True


@dataclass(slots=True)
class Subscribed:
    """A subscription of this client: what re-attaches it, the ids it had, and the driver's
    ``handle`` for it (what deliveries are handed to)."""

    sub_id: str
    space: str
    filter: str
    durable: bool
    collapse: str | None
    handle: Any
    seen: Seen
    duplicates: int = 0


@dataclass(slots=True)
class Happened:
    """What one message from the broker did, for the driver to carry out."""

    offers: list[tuple[Any, int, int, dict[str, Any]]] = field(default_factory=list)
    """(handle, epoch, delivery number, event): deliveries to hand over, in order."""
    acked: bool = False  # publishes were acknowledged, refused or given up: wake who waits
    reply: p.Reply | None = None  # the answer to a request
    ended: list[tuple[Any, SubscribeError]] = field(default_factory=list)  # (handle, why)
    acks_due: bool = False  # acknowledgements are due: write soon


class ClientState:
    """The client's protocol state (see the module note)."""

    def __init__(
        self,
        name: str,
        addresses: Iterable[str],
        *,
        window: int = 10_000,
        dedup: int = 1_000_000,
        token: str | None = None,
    ) -> None:
        if window < 1 or dedup < 1:
            raise ClientError(f"window and dedup are >= 1, got {window}, {dedup}")
        self.name = name
        self.window = window
        self.dedup = dedup
        self.token = token
        self.addresses: deque[str] = deque(dict.fromkeys(addresses))
        self.broker: str | None = None  # the broker that welcomed this connection
        self.spaces: dict[str, Schema | None] = {}
        self.pseq = 0
        self.unacked: OrderedDict[int, tuple[str, dict[str, Any], float]] = OrderedDict()  # pseq ->
        # (space, event, when it was published), in pseq order
        self.errors: list[PublishError] = []  # refusals and give-ups not raised yet
        self.subs: dict[str, Subscribed] = {}
        self.adverts: dict[str, tuple[str, str]] = {}  # advertisement name -> (space, filter)
        self.epoch = 0  # the connection's number
        self.homeless_since: float | None = None  # when a resume first found subscriptions no
        # broker serves (reset once all are re-attached): resume_timeout counts from it
        self._to_send: list[int] = []  # publishes not sent on this connection yet
        self._held: dict[int, int] = {}  # delivery number -> its subscriptions still to take it
        self._taken: list[int] = []  # delivery numbers every subscription took: to acknowledge
        self._req = itertools.count(1)
        self._names = itertools.count(1)

    # -- brokers and connections

    def next_address(self) -> str:
        """The broker to try next (the list rotates)."""
        address = self.addresses[0]
        self.addresses.rotate(-1)
        return address

    def hello(self) -> bytes:
        return frame(encode(p.Hello(self.name, token=self.token)))

    def welcomed(self, w: p.Welcome) -> None:
        """The broker's ``Welcome``: its address, its spaces' schemas, the peers it names."""
        self.broker = w.broker
        self.spaces = {n: None if s is None else Schema.of(s) for n, s in w.spaces.items()}
        for peer in (w.broker, *w.peers):
            if peer not in self.addresses:
                self.addresses.append(peer)

    def connected(self) -> bytes:
        """A new connection (after its ``Welcome``): a new epoch; the advertisements again
        (written before any publish is sent again)."""
        self.epoch += 1
        return b"".join(
            frame(encode(p.Advertise(next(self._req), adv_id, space, filt)))
            for adv_id, (space, filt) in self.adverts.items()
        )

    def lost(self) -> None:
        """The connection ended: what it had delivered and not acknowledged is the broker's
        to send again."""
        self.broker = None
        self._held, self._taken = {}, []

    def request_id(self) -> int:
        return next(self._req)

    def new_name(self) -> int:
        """A number for a name this client makes up (a subscription's, an advertisement's)."""
        return next(self._names)

    # -- publishing

    def check(self, space: str, event: Mapping[str, Any]) -> None:
        """A :class:`ClientError` or :class:`SchemaError` if ``event`` cannot go to ``space``."""
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

    @property
    def full(self) -> bool:
        """``window`` publishes are unacknowledged: the next one waits."""
        return len(self.unacked) >= self.window

    def publish(self, space: str, event: Mapping[str, Any], now: float) -> int:
        """Number ``event`` (checked already) and keep it until acknowledged; its pseq."""
        self.pseq += 1
        self.unacked[self.pseq] = (space, dict(event), now)
        self._to_send.append(self.pseq)
        return self.pseq

    def resend(self) -> None:
        """Every unacknowledged publish goes again (a new connection)."""
        self._to_send = list(self.unacked)

    def expire(self, now: float, timeout: float, where: str) -> bool:
        """Give up the publishes unacknowledged for ``timeout`` (the oldest come first: the
        check stops at the first younger one), each a :class:`PublishError` naming ``where``
        the client was; whether any was."""
        unacked, expired = self.unacked, []
        for pseq, (_, _, at) in unacked.items():
            if now - at < timeout:
                break
            expired.append(pseq)
        reason = f"not acknowledged within {timeout:g} s ({where})"
        for pseq in expired:
            del unacked[pseq]
            self.errors.append(PublishError(pseq, reason))
        return bool(expired)

    def raise_errors(self) -> None:
        if self.errors:
            raise self.errors.pop(0)

    def take_errors(self) -> list[PublishError]:
        errors, self.errors = self.errors, []
        return errors

    # -- subscriptions

    def add(
        self, sub_id: str, space: str, filter: str, *, durable: bool, collapse: str | None, handle: Any
    ) -> Subscribed:
        if sub_id in self.subs:
            raise SubscribeError(f"subscription {sub_id!r} is open in this client already")
        sub = Subscribed(sub_id, space, filter, durable, collapse, handle, Seen(self.dedup))
        self.subs[sub_id] = sub
        return sub

    def remove(self, sub_id: str) -> Subscribed | None:
        return self.subs.pop(sub_id, None)

    def resubscribe(self, sub_ids: Iterable[str], *, fresh: bool) -> tuple[dict[int, str], bytes]:
        """The ``Subscribe`` requests that re-attach ``sub_ids`` here (``fresh``: asked for
        afresh, not resumed): request number -> subscription, and the bytes to write."""
        reqs: dict[int, str] = {}
        out: list[bytes] = []
        for sub_id in sub_ids:
            s = self.subs[sub_id]
            req = next(self._req)
            reqs[req] = sub_id
            msg = p.Subscribe(req, sub_id, s.space, s.filter, s.durable, s.collapse, not fresh)
            out.append(frame(encode(msg)))
        return reqs, b"".join(out)

    # -- the broker's messages

    def receive(self, msg: Any) -> Happened:
        """What ``msg`` from the broker does (a :class:`ClientError` if the broker closes the
        connection with an ``Error``, a :class:`ProtocolError` for a message no broker sends)."""
        h = Happened()
        match msg:
            case p.Events():
                self._deliveries(msg.items(), h)
            case p.PubAck():
                for pseq in msg.pseqs:
                    self.unacked.pop(pseq, None)
                h.acked = True
            case p.Nack():
                if self.unacked.pop(msg.pseq, None) is not None:
                    self.errors.append(PublishError(msg.pseq, msg.error))
                h.acked = True
            case p.Reply():
                h.reply = msg
            case p.SubEnded():
                sub = self.subs.pop(msg.sub_id, None)
                if sub is not None:
                    h.ended.append(
                        (sub.handle, SubscribeError(f"subscription {msg.sub_id!r} ended: {msg.error}"))
                    )
            case p.Keepalive():
                pass  # (its coming is what counts: the driver's idle watchdog)
            case p.Error():
                raise ClientError(f"the broker closed the connection: {msg.what}")
            case _:
                raise ProtocolError(f"client {self.name}: unexpected {type(msg).__name__} from the broker")
        return h

    def _deliveries(
        self, items: list[tuple[list[str], int, tuple[str, int], dict[str, Any]]], h: Happened
    ) -> None:
        """Each delivery to the subscriptions it is for (the second and later get a copy of
        the event), counting those that must take it before it is acknowledged."""
        epoch, subs, held, offers = self.epoch, self.subs, self._held, h.offers
        for sub_ids, cseq, eid, event in items:
            waiting = 0
            for sub_id in sub_ids:
                sub = subs.get(sub_id)
                if sub is None:
                    continue
                if not sub.seen.first(eid):
                    sub.duplicates += 1
                    continue
                offers.append((sub.handle, epoch, cseq, event if not waiting else dict(event)))
                waiting += 1
            if waiting:
                held[cseq] = waiting
            else:  # (no subscription of ours wants it any more, or it was a duplicate)
                self._taken.append(cseq)
                h.acks_due = True

    def took(self, epoch: int, cseq: int) -> bool:
        """One subscription took delivery ``cseq`` of connection ``epoch``; whether that made
        an acknowledgement due (every subscription it was for took it)."""
        if epoch != self.epoch:
            return False  # (a delivery of a connection gone: the broker sends it again)
        held = self._held
        left = held.pop(cseq, 1) - 1
        if left:
            held[cseq] = left
            return False
        self._taken.append(cseq)
        return True

    # -- out

    def outgoing(self) -> bytes:
        """The bytes due: the publishes not sent on this connection yet, then the
        acknowledgements."""
        out: list[bytes] = []
        if self._to_send:
            items: list[tuple[int, dict[str, Any]]] = []
            spaces: list[str] = []
            for pseq in self._to_send:
                item = self.unacked.get(pseq)
                if item is not None:
                    items.append((pseq, item[1]))
                    spaces.append(item[0])
            self._to_send = []
            for i in range(0, len(items), BATCH):
                chunk, where = items[i : i + BATCH], spaces[i : i + BATCH]
                mixed = any(s != where[0] for s in where)
                batch = p.pack_publish(chunk, where if mixed else ())
                out.append(frame(encode(p.Publish(where[0], batch))))
        if self._taken:
            out.append(frame(encode(p.Ack(p.pack_acks(ranges(self._taken))))))
            self._taken = []
        return b"".join(out)


def ranges(numbers: list[int]) -> list[tuple[int, int]]:
    """``numbers`` (sorted in place) as ranges ``(first, last)`` of consecutive numbers."""
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
