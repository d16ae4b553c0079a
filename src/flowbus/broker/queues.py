"""The subscriptions a broker serves, each with one ordered queue: flow control, spilling to
SQLite, acknowledgements, lingering, takeover and catch-up.

How it works (flowbus's own delivery guarantees, on the custody of
:mod:`flowbus.routing.ring_broker`):

* **One queue per subscription** (:class:`SubQueue`), oldest first: ``pending`` (to
  send); what is sent waits in its connection's ``inflight``
  (:class:`~flowbus.broker.sessions.Session`).
  - At most ``window`` deliveries are in flight to its client, unacknowledged. The client
    acknowledges deliveries of its connection (``Ack``), and the core is told those
    deliveries are settled.
  - At most ``memory`` deliveries (those in flight included) are held in memory, still in
    the sender's custody. Beyond that, events are *spilled* to the SQLite queue and settled
    once written (after the core's step): the disk has them.
  - A subscription with no client attached (a durable one whose client is away, one taken
    over from a dead broker) queues on disk straight away; when a durable subscription's
    client leaves, what waited for it in memory goes to disk too (if none of its queue is
    there yet: the order is kept), and is settled.
  - So a slow or absent subscriber costs this broker bounded memory, and holds a
    publisher's acknowledgements up for at most ``memory`` events (keep it below the
    clients' publish window): the rest wait on disk. Once anything is on disk, later
    events go there too, until the disk part is drained, so the order is kept.
* **A full disk** (:class:`~flowbus.errors.StoreFull`). A spill is *held* (``held``, after
  the disk part of the queue) until it is written, and settled only then. When the store
  cannot take it, it stays held, in memory and in custody: its publisher is not
  acknowledged. The store is tried again every ``RETRY_EVERY`` (the broker's timer,
  :meth:`Queues.retry`), and by a step that holds more, at most every ``TOUCH_EVERY``;
  once it takes them, they are written and settled as usual.
  - Later deliveries to the subscription are held behind them, so nothing overtakes them;
    with nothing on disk before them, the pump sends them to an attached client from memory.
  - Once a write has failed, and until what waits is written, a subscription holds at most
    ``HOLD_LIMIT`` times ``memory`` deliveries in memory; a further one is refused (the
    core's ``refuse_local``), and its publisher gets ``Nack`` with the reason.
  - A client's acknowledgement of disk rows the store cannot delete is kept and written
    later; the rows were loaded, so they are not sent again meanwhile. A subscription the
    store cannot record is refused (the reply names the store).
* **The hot path: one delivery per event and connection.** The core's deliveries come one
  by one (:meth:`Queues.on_deliver`, the runtime's ``on_deliver``): an event's fields are
  stripped of the hidden ones (:func:`flowbus.meta.strip`) once for all its deliveries. A delivery to
  a subscription with nothing queued before it and room in its window goes straight to its
  connection, where the event's deliveries to that connection's subscriptions share one
  ``Events`` row (the ids of the subscriptions, one delivery number): the event is packed,
  sent, unpacked and acknowledged once per connection, not once per subscription. The
  others wait in their subscription's queue: subscriptions with something queued are
  pumped once per turn of the event loop, a row per delivery, as their windows allow. The
  spilled rows of one core step go to SQLite in one transaction, and their settles to the
  core in one call, after the step (:meth:`Queues.after_step`).
* **Connections.** A subscription is attached to at most one client connection. When it
  ends, the deliveries in flight go back to the front of the queue, for the next one. A
  non-durable subscription ends with a ``Bye``, or ``linger`` seconds after a lost
  connection if its client does not come back; a durable one waits for its client.
* **Given back, or acknowledged out of order** (a STOMP client's ``NACK`` and
  ``client-individual`` acknowledgements, :mod:`flowbus.broker.stomp`). A delivery its
  client gives back goes to the front of its subscription's queue and is sent again
  (:meth:`Queues.give_back`); the row stays in flight for its other subscriptions. A native
  client takes each subscription's events in order, a STOMP one may acknowledge them in any
  order: the rows of a SQLite queue are deleted only up to the first one loaded and not
  acknowledged yet (:meth:`SubQueue.acked_from_disk`), never past it.
* **Resuming.** A client whose broker died reconnects to another one and re-attaches its
  subscriptions (``resume``). The broker that took the dead one's state over serves them
  (the core knows them, with the ``meta`` they were made with): the core re-sends what the
  dead broker had not finished (custody), and the client drops what it had seen (by event
  id). A taken-over subscription that gets a delivery before its client is back is served
  here from then on, on disk.
* **Consumed.** A client that cannot drop an event it had by its id (a STOMP client) has
  its broker say, in the ring state, how far it consumed each publisher's events
  (:meth:`Queues.consume`: its durable subscriptions' acknowledgements, in each publisher's
  order). A broker that takes the subscription over delivers again what it routed of late
  and what the dead one had not confirmed; the deliveries that state covers are dropped
  here (settled, never queued: ``SubQueue.consumed``). The rows of a queue on a dead
  broker's disk, handed over when it comes back, are not checked: a client that acknowledged
  rows out of order may see those again.
* **Queues on disk are known to the ring** (:mod:`flowbus.routing.ring_handover`). When a
  subscription's queue first goes to disk, the ring state says so (``mark_backlog``) and
  what that write settles waits until the backups have it; when the queue on disk is empty
  again, the entry goes. A subscription taken over from a broker whose disk holds part of
  its queue *awaits* that backlog: its events go to disk here and none is sent until the
  old broker, back as a new member, hands the rows over (:meth:`Queues.take_backlog`: put
  before what was queued meanwhile).
* **The lease** (:mod:`flowbus.broker.fence`). While the broker may not serve its clients,
  nothing goes to a connection: deliveries wait in the queues.
* **Catch-up** (the IFG's expand, Banavar et al. section 4.2). A subscription that names a
  collapse rule set gets, when its client comes back, instead of its backlog the shortest
  sequence of events equivalent to it (:mod:`flowbus.broker.interpret`), from the state
  folded from what its client took (in batches of ``FOLD_EVERY``). Only a broker that
  served the client knows that state: a subscription taken over from a dead broker, or
  restored from the disk after a restart, delivers its backlog as it is (the client drops
  by id what it had). Caught up from a state it did not know, it gave the client again the
  latest events it had, under new ids (the fault campaign: 29 repeats in one run).
* **Durability.** Durable subscriptions and spilled queues are in SQLite
  (:mod:`flowbus.broker.store`): :meth:`Queues.restore` serves them again after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]

from flowbus.broker.config import BrokerConfig
from flowbus.broker.overlays import BrokerCore, address_text
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import QueuedEvent, Store, SubscriptionRow
from flowbus.client import protocol as p
from flowbus.core import Effect
from flowbus.errors import FlowbusError, StoreError, StoreFull
from flowbus.filters import Filter, parse
from flowbus.meta import EVENT_ID, strip
from flowbus.routing.ring_broker import RingBroker
from flowbus.routing.ring_handover import Backlog

if TYPE_CHECKING:
    from flowbus.broker.fence import Fence
    from flowbus.broker.outbox import Outbox as Session

__all__ = [
    "HOLD_LIMIT",
    "RETRY_EVERY",
    "TOUCH_EVERY",
    "Entry",
    "Flight",
    "Queues",
    "Sent",
    "Settle",
    "SubQueue",
]

Entry = tuple[Any, dict[str, Any], int | None]
"""A queued delivery: (event id, event, where it is kept: None = in custody, settled when the
client acknowledges it; n > 0 = SQLite queue position; 0 = nowhere, a catch-up event)."""

Settle = tuple[Any, int]
"""Deliveries the core may forget: (event id, how many of its deliveries here)."""

Held = tuple[Any, dict[str, Any], tuple[str, str, bytes], int]
"""A delivery for the SQLite queue, not written yet: (event id, event, its row, its place in
the order deliveries came in: the queue's positions follow it over all subscriptions)."""

HOLD_LIMIT = 4
"""While the store fails, a subscription holds at most this many times ``memory`` deliveries
in memory (pending, in flight and held); a further one is refused."""

RETRY_EVERY = 0.5
"""Seconds between two tries of a store that failed, while anything waits for it."""

TOUCH_EVERY = 0.05
"""A step that holds more deliveries tries a failing store again at most this often (seconds)."""


log = logging.getLogger("flowbus.broker")


def _held(sub_id: str, eid: Any, plain: dict[str, Any]) -> Held:
    """A delivery to ``sub_id`` for its SQLite queue, with its row (packed once)."""
    return (eid, plain, (sub_id, repr(eid), msgpack.packb((list(eid), plain))), next(_arrivals))


FOLD_EVERY = 512
"""A subscription with a collapse rule set folds what its client took every this many events."""
_arrivals = itertools.count()  # (numbers the deliveries held for the SQLite queue)
SUB_BYTES = 4096
"""What a subscription costs a broker, about, beyond its filter's text (measured: 3-3.5 KB,
docs/results/broker.md), for ``memory_limit``."""

MB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mb() -> float | None:
    """This process's resident memory in MB (None where /proc does not say)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / MB
    except (OSError, ValueError, IndexError):
        return None


_catch_ups = itertools.count(1)  # (numbers the catch-up sequences of this process)


@dataclass(eq=False, slots=True)
class SubQueue:
    """A subscription served here, and its queue (see the module note)."""

    sub_id: str
    client: str
    space: str
    filter: str
    durable: bool
    collapse: str | None
    session: Session | None = None  # the connection it is attached to; None: its client is away
    _pending: deque[Entry] | None = None  # to send, oldest first (see pending, queue)
    unacked: int = 0  # deliveries in flight on its connection (kept there: Session.inflight)
    on_disk: int = 0  # events in the SQLite queue not loaded into pending
    disk_pos: int = 0  # the queue position of the last event loaded from disk
    loaded_rows: dict[int, None] | None = None  # positions loaded, not acknowledged (None: none)
    disk_acked: int = 0  # the highest position acknowledged and not deleted: one below is loaded
    in_memory: int = 0  # entries in pending/inflight still in custody
    held: list[Held] = field(default_factory=list)  # for the SQLite queue, not written yet (a
    # list: an empty deque costs 760 bytes, and most subscriptions hold nothing)
    flagged: bool = False  # the ring state says its queue has events on this broker's disk
    flag_version: int = 0  # the backup version that says so
    awaiting: int | None = None  # the former broker whose backlog of it is awaited (see note)
    consumed: dict[str, int] | None = None  # (taken over) what its client had consumed: dropped
    seen: Any = None  # the collapsed state of what the client took (collapse rule sets only)
    taken: list[dict[str, Any]] | tuple[()] = ()  # taken, not folded into seen yet
    known: bool = True  # seen is what its client took (False: taken over or restored, see note)
    linger: asyncio.TimerHandle | None = None

    @classmethod
    def from_meta(cls, sub_id: str, meta: Mapping[str, Any]) -> SubQueue:
        """A subscription from what :meth:`meta` gave (taken over from a dead broker)."""
        return cls(
            sub_id,
            meta["client"],
            meta["space"],
            meta["filter"],
            bool(meta["durable"]),
            meta["collapse"],
            known=meta["collapse"] is None,
        )

    def meta(self) -> dict[str, Any]:
        """What another broker needs to serve it after a takeover (backed up with it)."""
        return {
            "client": self.client,
            "space": self.space,
            "filter": self.filter,
            "durable": self.durable,
            "collapse": self.collapse,
        }

    @property
    def pending(self) -> deque[Entry] | tuple[()]:
        """The entries to send, oldest first (read only: :meth:`queue` to add to them)."""
        return self._pending if self._pending is not None else ()

    def queue(self) -> deque[Entry]:
        """The entries to send, to add to (made when the first comes: an empty deque costs
        624 bytes a subscription, and most have nothing waiting most of the time)."""
        if self._pending is None:
            self._pending = deque()
        return self._pending

    def take(self, n: int) -> list[Entry]:
        """The next ``n`` pending entries, now in flight."""
        pending = self.queue()
        self.unacked += n
        taken = [pending.popleft() for _ in range(n)]
        if not pending:
            self._pending = None
        return taken

    def detach(self, returned: Sequence[Entry]) -> None:
        """Its connection ended: the deliveries that were in flight to it there (``returned``,
        in order) go back to the front of the queue."""
        self.session = None
        if returned:
            self.queue().extendleft(reversed(returned))
        self.unacked = 0

    def in_custody(self) -> list[Settle]:
        """The queued deliveries still in the sender's custody (call when detached)."""
        return [(eid, 1) for eid, _, where in self.pending if where is None] + [
            (eid, 1) for eid, *_ in self.held
        ]

    def loaded(self, rows: list[QueuedEvent]) -> None:
        """Events of its SQLite queue, next in order, now pending."""
        if not rows:
            self.on_disk = 0
            return
        pending = self.queue()
        if self.loaded_rows is None:
            self.loaded_rows = {}
        loaded = self.loaded_rows
        for row in rows:
            eid, event = msgpack.unpackb(row.payload)
            pending.append((tuple(eid), event, row.seq))
            loaded[row.seq] = None
            self.disk_pos = row.seq
        self.on_disk = max(0, self.on_disk - len(rows))

    def acked_from_disk(self, positions: Iterable[int]) -> int:
        """Its client acknowledged the events loaded from these positions of its SQLite
        queue: the position the queue may be acknowledged (deleted) up to now, below every
        position loaded and not acknowledged yet (0: none). A client acknowledges one
        subscription's events in order, but a STOMP client may acknowledge them one by one
        in any order (``client-individual``) or give one back (a NACK): the rows before
        one it has not acknowledged stay until it has."""
        rows, top = self.loaded_rows or {}, self.disk_acked
        for where in positions:
            rows.pop(where, None)
            top = max(top, where)
        if not rows:
            self.loaded_rows = None
        low = min(rows) if rows else None
        if low is not None and low < top:  # (one before is out: the rest waits for it)
            self.disk_acked = top
            return low - 1
        self.disk_acked = 0
        return top

    def caught_up(self, events: list[dict[str, Any]]) -> tuple[list[Settle], int]:
        """The pending backlog is replaced by ``events`` (kept nowhere). The backlog's
        deliveries still in custody (to settle) and its highest SQLite queue position (0: none)."""
        settle = [(eid, 1) for eid, _, where in self.pending if where is None]
        disk = max((where for _, _, where in self.pending if where), default=0)
        self.in_memory -= len(settle)
        self.loaded_rows = None  # (what was loaded is acknowledged up to ``disk``: nothing is in flight)
        tag = next(_catch_ups)
        self._pending = deque(((f"catch-up/{tag}", i), e, 0) for i, e in enumerate(events)) or None
        return settle, disk


def consumed(upto: Mapping[str, int], eid: Any) -> bool:
    """Whether event ``eid`` (a published one's: ``(publisher, sequence number)``) is one
    ``upto`` says its client consumed (see "Consumed")."""
    return type(eid) is tuple and len(eid) == 2 and type(eid[1]) is int and eid[1] <= upto.get(eid[0], 0)


Sent = tuple[Any, dict[str, Any], list[SubQueue], int | None]
"""A delivery in flight on a connection: (event id, event, the subscriptions it is for,
where it is kept: see :data:`Entry`)."""


class Flight:
    """The deliveries in flight on one connection: numbered there (``cseq``, from 1), each
    until the client acknowledges its number."""

    __slots__ = ("attached", "cseq", "inflight")

    def __init__(self) -> None:
        self.cseq = 0  # the last delivery number on the connection
        self.inflight: dict[int, Sent] = {}  # delivery number -> what was sent, unacknowledged
        self.attached: set[str] = set()  # the subscriptions attached to the connection

    def offer(self, out: Session, subs: list[SubQueue], eid: Any, event: dict[str, Any]) -> None:
        """``event`` (in custody) to ``subs``, in one row (the last one, if it is the same
        event's)."""
        if out.same_row(event):
            out.extend_row([sub.sub_id for sub in subs])
            self.inflight[self.cseq][2].extend(subs)
            return
        self.cseq += 1
        self.inflight[self.cseq] = (eid, event, subs, None)
        out.add_row([sub.sub_id for sub in subs], self.cseq, eid, event)

    def deliver(self, out: Session, sub: SubQueue, entries: list[Entry]) -> None:
        """Queued ``entries`` of ``sub``, a row each."""
        sub_ids, inflight = [sub.sub_id], self.inflight
        for eid, event, where in entries:
            self.cseq += 1
            inflight[self.cseq] = (eid, event, [sub], where)
            out.add_row(sub_ids, self.cseq, eid, event, extendable=False)

    def acked(self, ranges: Iterable[tuple[int, int]]) -> list[Sent]:
        """The deliveries numbered in ``ranges`` (first, last), now out of flight."""
        inflight = self.inflight
        out = []
        for first, last in ranges:
            if last - first >= len(inflight):  # (a wide range: what is in flight, in order)
                numbers: Iterable[int] = [n for n in inflight if first <= n <= last]
            else:
                numbers = range(first, last + 1)
            for cseq in numbers:
                sent = inflight.pop(cseq, None)
                if sent is not None:
                    out.append(sent)
        return out

    def give_back(self, cseq: int, sub_id: str) -> tuple[SubQueue, Entry] | None:
        """Delivery ``cseq`` is no longer in flight to subscription ``sub_id`` (its client
        gave it back undone): the subscription and the entry to queue again (None: no such
        delivery in flight). The row stays in flight for its other subscriptions."""
        sent = self.inflight.get(cseq)
        if sent is None:
            return None
        eid, event, subs, where = sent
        sub = next((s for s in subs if s.sub_id == sub_id), None)
        if sub is None:
            return None
        subs.remove(sub)
        if not subs:
            del self.inflight[cseq]
        return sub, (eid, event, where)

    def take_back(self, sub: SubQueue) -> list[Entry]:
        """What is in flight to ``sub`` here, in order, no longer (it is detached)."""
        out: list[Entry] = []
        for cseq, (eid, event, subs, where) in list(self.inflight.items()):
            if sub in subs:
                subs.remove(sub)
                out.append((eid, event, where))
                if not subs:
                    del self.inflight[cseq]
        return out

    def take_all_back(self) -> list[Sent]:
        """Everything in flight here, in order (the connection ended)."""
        out = list(self.inflight.values())
        self.inflight.clear()
        return out


class Queues:
    """The subscriptions served here and their queues (see the module note)."""

    def __init__(
        self,
        *,
        core: BrokerCore,
        apply: Callable[[Sequence[Effect]], None],
        store: Store,
        spaces: Spaces,
        config: BrokerConfig,
        name: str = "this broker",
        ring: RingBroker | None = None,
    ) -> None:
        self.core = core
        self.ring_core = ring  # (the same core if it is the ring's: only the ring runs flows)
        self.name = name  # ("broker HOST:PORT": named in the reason of a refused delivery)
        self.apply = apply
        self.store = store
        self.spaces = spaces
        self.window = config.window
        self.memory = config.memory
        self.memory_limit = config.memory_limit
        self.linger = config.linger
        self.backlog_wait = config.backlog_wait
        self.subs: dict[str, SubQueue] = {}
        self.delivered = 0
        self.spilled = 0
        self.sent: Counter[str] = Counter()  # space -> events sent to subscribers' clients
        self.closed = False
        self.full: StoreFull | None = None  # what the store failed with while writes wait for it
        self.refused = 0  # deliveries refused: their subscription held its limit, the store full
        self._holding: dict[SubQueue, None] = {}  # subscriptions with deliveries held
        self._touched = False  # (this step held deliveries)
        self._tried = -1.0  # (the event loop's time of the last try of a failing store)
        self._acks: dict[str, int] = {}  # subscription -> SQLite position acknowledged, not deleted yet
        self._unrecorded: set[str] = set()  # subscriptions taken over the store has not recorded yet
        self._refusing: list[tuple[Any, str]] = []  # (event id, reason): deliveries refused in this step
        self._dropped: list[Settle] = []  # deliveries its client had consumed (see "Consumed"), this step
        self._gated: list[tuple[int, list[Settle]]] = []  # spills settled once backed up (version)
        self._gated_calls: list[tuple[int, Callable[[], None]]] = []  # backlogs answered then
        self.fence: Fence | None = None  # (the broker's lease: nothing to a connection without it)
        self._pumps: set[SubQueue] = set()  # to pump at the end of this turn of the loop
        self._pump_due = False
        self._plain_of: Any = None  # the last event delivered, and its fields without the
        self._plain: dict[str, Any] = {}  # hidden ones (shared by its deliveries: read only)
        self._flights: dict[Session, Flight] = {}  # connection -> what is in flight on it

    def flight(self, session: Session) -> Flight | None:
        """What is in flight on ``session`` (None: nothing attached to it)."""
        return self._flights.get(session)

    def attached(self, session: Session) -> set[str]:
        """The subscriptions attached to ``session`` (a copy)."""
        flight = self._flights.get(session)
        return set(flight.attached) if flight is not None else set()

    def detach(self, sub: SubQueue) -> None:
        """``sub`` leaves its connection: what was in flight to it there goes back to the
        front of its queue."""
        session = sub.session
        returned: list[Entry] = []
        if session is not None:
            flight = self._flights.get(session)
            if flight is not None:
                flight.attached.discard(sub.sub_id)
                returned = flight.take_back(sub)
        sub.detach(returned)

    def in_memory(self) -> int:
        """Deliveries held in memory, in custody, over every subscription."""
        return sum(s.in_memory + len(s.held) for s in self.subs.values())

    # -- a client's requests

    def subscribe(self, session: Session, msg: p.Subscribe) -> tuple[bool, str | None]:
        """``msg`` from ``session``: a new subscription, or one to re-attach."""
        sub = self.subs.get(msg.sub_id)
        if sub is None and msg.sub_id in self.core.subs:  # taken over from a dead broker, and
            sub = self._adopt(msg.sub_id)  # not delivered to since: serve it from now on
        if sub is not None:  # re-attaching
            if sub.session is not None and sub.session is not session:
                if sub.session.client != session.client:
                    return False, f"subscription {msg.sub_id!r} is attached to another client"
                self.detach(sub)
            self._attach(session, sub)
            return True, None
        if msg.resume:
            return False, p.NOT_HERE
        return self._open(session, msg)

    def subscribe_many(self, session: Session, msg: p.SubscribeMany) -> tuple[bool, str | None]:
        """``msg`` from ``session``: new subscriptions, made all or none. Every one is checked
        before any is made (refused: the first bad one and why); then recorded in one
        transaction, given to the core in one call (one backup copy) and attached."""
        space, ids = msg.space, msg.sub_ids
        if len(set(ids)) != len(ids):
            dup = next(i for i, n in Counter(ids).items() if n > 1)
            return False, f"subscription {dup!r}: named twice in one request"
        taken = next((i for i in ids if i in self.subs or i in self.core.subs), None)
        if taken is not None:
            return False, f"subscription {taken!r}: exists already"
        full = self._no_room(msg.filters)
        if full is not None:
            return False, full
        if self.spaces.flow_of(space) is not None:
            return self._open_flows(session, msg)
        if msg.collapse is not None:
            why = self.spaces.check_collapse(msg.collapse, space)
            if why is not None:
                return False, why
        filters: list[Filter] = []
        for sub_id, text in zip(ids, msg.filters, strict=True):
            filt, error = self.spaces.check_filter(space, text)
            if filt is None:
                return False, f"subscription {sub_id!r}: {error}"
            filters.append(filt)
        client, durable, collapse = session.client, msg.durable, msg.collapse
        subs = [
            SubQueue(i, client, space, f.to_text(), durable, collapse)
            for i, f in zip(ids, filters, strict=True)
        ]
        try:
            self.store.add_subscriptions(
                [(s.sub_id, client, space, s.filter, durable, collapse) for s in subs]
            )
        except FlowbusError as e:
            return False, str(e)
        routing = self.spaces.routing_filter
        self.subs.update((s.sub_id, s) for s in subs)
        items = [(s.sub_id, routing(space, f), s.meta()) for s, f in zip(subs, filters, strict=True)]
        self.apply(self.core.subscribe_many(items))
        for sub in subs:
            self._attach(session, sub)
        return True, None

    def _open_flows(self, session: Session, msg: p.SubscribeMany) -> tuple[bool, str | None]:
        """:meth:`subscribe_many` to a space of a deployed flow: every filter planned first,
        then each opened as one :class:`~flowbus.client.protocol.Subscribe` is."""
        core = self.ring_core
        if core is not None and msg.collapse is None:
            for sub_id, text in zip(msg.sub_ids, msg.filters, strict=True):
                try:
                    core.flows.plan(msg.space, text)
                except FlowbusError as e:
                    return False, f"subscription {sub_id!r}: {e}"
        for sub_id, text in zip(msg.sub_ids, msg.filters, strict=True):
            one = p.Subscribe(msg.req, sub_id, msg.space, text, msg.durable, msg.collapse)
            ok, error = self._open_flow(session, one)
            if not ok:  # (the first is refused if any is: no flows, a collapse rule set)
                return False, f"subscription {sub_id!r}: {error}"
        return True, None

    def consume(self, sub_id: str, upto: Mapping[str, int], *, now: bool = True) -> int:
        """``sub_id``'s client has consumed each publisher's events up to the sequence number
        ``upto`` names (see "Consumed"): told to the core. The backup version after which a
        broker that takes the subscription over knows it (:meth:`when_backed_up`); not
        ``now``: backed up with the core's step, no version (0)."""
        version, effects = self.core.consume(sub_id, upto, now=now)
        self.apply(effects)
        return version

    def consumed(self, sub_id: str) -> dict[str, int]:
        """How far ``sub_id``'s client has consumed each publisher's events, as the core knows."""
        return self.core.consumed(sub_id)

    def when_backed_up(self, version: int, call: Callable[[], None]) -> None:
        """Call ``call`` soon once the ring's backups have ``version`` (0: at once)."""
        if version <= self.core.backups_confirmed():
            asyncio.get_running_loop().call_soon(call)
        else:
            self._gated_calls.append((version, call))

    def unknown(self, sub_id: str) -> bool:
        """Whether ``sub_id`` is neither served here nor taken over by this broker's core."""
        return sub_id not in self.subs and sub_id not in self.core.subs

    def unsubscribe(self, session: Session, sub_id: str) -> tuple[bool, str | None]:
        sub = self.subs.get(sub_id)
        if sub is None or (sub.session is not None and sub.session is not session):
            return False, f"no subscription {sub_id!r} of this client here"
        self._remove(sub)
        return True, None

    def ack(self, session: Session, ranges: Iterable[tuple[int, int]]) -> None:
        """``session``'s client took the deliveries numbered in ``ranges``, each by every
        subscription it was for: settled in the core (those in custody), acknowledged in
        SQLite (those from disk), folded (subscriptions with a collapse rule set)."""
        settle: list[Settle] = []
        disk: dict[SubQueue, list[int]] = {}
        more: set[SubQueue] = set()  # (with more to send)
        flight = self._flights.get(session)
        for eid, event, subs, where in flight.acked(ranges) if flight is not None else ():
            n = 0
            for sub in subs:
                if sub.session is not session:
                    continue
                n += 1
                sub.unacked -= 1
                if where is None:
                    sub.in_memory -= 1
                elif where > 0:
                    disk.setdefault(sub, []).append(where)
                if sub.collapse is not None and sub.known:
                    if sub.taken:
                        sub.taken.append(event)
                    else:
                        sub.taken = [event]  # (made for the first: most subscriptions fold nothing)
                    if len(sub.taken) >= FOLD_EVERY:
                        self._fold(sub)
                if sub.pending or sub.on_disk or sub.held:
                    more.add(sub)
            if where is None and n:
                settle.append((eid, n))
        for sub, positions in disk.items():
            upto = sub.acked_from_disk(positions)
            if upto > 0:
                self._ack_disk(sub.sub_id, upto)
        if settle:
            self._settle(settle)
        for sub in more:
            self._pump_soon(sub)

    def give_back(self, session: Session, returned: Iterable[tuple[int, str]]) -> None:
        """``session``'s client gave deliveries back undone (a STOMP ``NACK``): ``(delivery
        number, subscription)`` pairs, in the order they were sent. Each goes back to the
        front of its subscription's queue (before what was not sent yet), to be sent again,
        as when a connection ends; the row stays in flight for its other subscriptions."""
        flight = self._flights.get(session)
        if flight is None:
            return
        back: dict[SubQueue, list[Entry]] = {}
        for cseq, sub_id in returned:
            taken = flight.give_back(cseq, sub_id)
            if taken is not None:
                sub, entry = taken
                sub.unacked -= 1
                back.setdefault(sub, []).append(entry)
        for sub, entries in back.items():
            sub.queue().extendleft(reversed(entries))
            self._pump_soon(sub)

    def session_ended(self, session: Session, *, bye: bool) -> None:
        """Detach ``session``'s subscriptions (what was in flight on it back to the front of
        their queues); end the non-durable ones (``bye``) or let them linger (a lost
        connection)."""
        returned: dict[SubQueue, list[Entry]] = {}
        flight = self._flights.pop(session, None)
        if flight is None:
            return
        for eid, event, sent_to, where in flight.take_all_back():
            for one in sent_to:
                returned.setdefault(one, []).append((eid, event, where))
        for sub_id in sorted(flight.attached):
            sub = self.subs.get(sub_id)
            if sub is None or sub.session is not session:
                continue
            sub.detach(returned.get(sub, []))
            if sub.durable:
                self._away(sub)
            elif bye:
                self._remove(sub)
            else:
                self._start_linger(sub)

    def restore(self, skip: Collection[str] = ()) -> None:
        """Serve again the durable subscriptions the store holds (a restart), but those of
        ``skip`` (handed over to the brokers that took them over: broker/handover.py)."""
        for row in self.store.subscriptions():
            if row.sub_id not in skip:
                self._restore(row)

    def restore_one(self, sub_id: str) -> None:
        """Serve again the store's subscription ``sub_id`` (nobody else serves it)."""
        for row in self.store.subscriptions():
            if row.sub_id == sub_id:
                self._restore(row)

    def _restore(self, row: SubscriptionRow) -> None:
        if row.sub_id not in self.subs:
            if not row.durable:
                with contextlib.suppress(StoreFull):  # (a full store: removed at a later restart)
                    self.store.remove_subscription(row.sub_id)
                return
            sub = SubQueue(
                row.sub_id, row.client, row.space, row.filter, True, row.collapse, known=row.collapse is None
            )
            sub.on_disk = self.store.depth(row.sub_id)
            self._serve_again(sub)

    def _serve_again(self, sub: SubQueue) -> None:
        """Serve ``sub`` (known to the store) here: routed by the core (a flow's by its flow),
        its queue on disk known to the ring."""
        self.subs[sub.sub_id] = sub
        if sub.sub_id not in self.core.subs:
            ring = self.ring_core
            if self.spaces.flow_of(sub.space) is not None and ring is not None:
                try:
                    self.apply(ring.subscribe_flow(sub.sub_id, sub.space, sub.filter, meta=sub.meta()))
                except FlowbusError:  # (its flow was withdrawn meanwhile)
                    self.ended([sub.sub_id])
                    return
            else:
                filt = self.spaces.routing_filter(sub.space, parse(sub.filter))
                self.apply(self.core.subscribe(sub.sub_id, filt, meta=sub.meta()))
        if sub.on_disk and not sub.flagged:
            self._flag([sub])

    def take_backlog(self, msg: Backlog, *, taken: Callable[[], None] | None = None) -> int | None:
        """A part of a subscription's queue from the broker that held it (back as a new
        member, see :mod:`flowbus.broker.handover`): onto this disk, before what was queued
        here meanwhile if the subscription awaited it (nothing of that was sent), else after
        (the client drops what it had). The last part ends the waiting. How many rows were
        new here; None if the subscription is not served here (nothing taken: its sender
        asks the ring where it is).

        ``taken`` (the answer to the sender, which then deletes the part from its disk) is
        called, and the ring told the former broker's disk is done with (the last part),
        once the ring's backups say this disk has the queue: until then the part is also on
        the sender's disk. Answered at once, a taker that died before its backups had the
        mark left a taker after it that did not know of this disk: it served the
        subscription, and the backlog, handed over again, went behind newer events (an
        overload run: 4,322 out of order)."""
        sub = self.subs.get(msg.sub)
        if sub is None and msg.sub in self.core.subs:
            sub = self._adopt(msg.sub)
        if sub is None or self.closed:
            return None
        rows = list(msg.rows)
        if sub.awaiting == msg.previous.addr and not any(w for _, _, w in sub.pending):
            new = self.store.prepend(sub.sub_id, rows, last=msg.last)
            sub.disk_pos = 0
        else:
            new = self.store.enqueue_many([(sub.sub_id, e, b) for e, b in rows])
        sub.on_disk += new
        if sub.on_disk and not sub.flagged:
            self._flag([sub])
        sub_id, home = sub.sub_id, msg.previous.addr

        def done() -> None:
            if msg.last and not self.closed:
                self.apply(self.core.backlog_done(sub_id, home))
            if taken is not None:
                taken()

        if msg.last and sub.awaiting == home:
            sub.awaiting = None
        if sub.flagged and sub.flag_version > self.core.backups_confirmed():
            self._gated_calls.append((sub.flag_version, done))
        else:
            done()
        self._pump_soon(sub)
        return new

    def give_up_backlog(self, sub_id: str) -> None:
        """Stop awaiting ``sub_id``'s backlog (its former broker did not come back within
        ``backlog_wait``): what is here is served; the log says what may be missing."""
        sub = self.subs.get(sub_id)
        if sub is not None and sub.awaiting is not None and not self.closed:
            log.warning(
                "%s: subscription %r gave up waiting for its former broker %s: the events it had "
                "on its disk are missing until it comes back (they are then delivered late)",
                self.name,
                sub_id,
                address_text(sub.awaiting),
            )
            self.apply(self.core.backlog_done(sub_id, sub.awaiting))
            sub.awaiting = None
            self._pump_soon(sub)

    def close(self) -> None:
        """The broker stops: no more lingering or settling."""
        self.closed = True
        for sub in self.subs.values():
            if sub.linger is not None:
                sub.linger.cancel()

    # -- the core's side

    def on_deliver(self, addr: int, sub_id: Hashable, event: Any) -> None:
        """The core delivers ``event`` to the subscription ``sub_id`` (once per delivery)."""
        sub = self.subs.get(sub_id) if isinstance(sub_id, str) else None
        if sub is None:
            sub = self._adopt(sub_id)
            if sub is None:
                return
        eid = event[EVENT_ID]
        if sub.consumed is not None and consumed(sub.consumed, eid):
            self._dropped.append((eid, 1))
            return
        if event is not self._plain_of:  # (an event's deliveries come one after the other)
            self._plain_of = event
            self._plain = strip(event)
        self.delivered += 1
        session = sub.session
        if session is not None and self._straight_on(sub) and (self.fence is None or self.fence.ok()):
            self._flights[session].offer(session, [sub], eid, self._plain)
            self._sent(sub)
        else:
            self._queue(sub, eid, self._plain)

    def on_deliver_all(self, addr: int, sub_ids: tuple[Hashable, ...], event: Any) -> None:
        """The core delivers ``event`` to each of ``sub_ids`` (its local deliveries, at once):
        one row per connection for the subscriptions that take it straight on."""
        eid = event[EVENT_ID]
        plain = strip(event)
        rows: dict[Session, list[SubQueue]] = {}
        subs: dict[Any, SubQueue] = self.subs  # (ids of other kinds: not ours)
        window, memory, straight = self.window, self.memory, 0
        serving = self.fence is None or self.fence.ok()
        for sub_id in sub_ids:
            sub = subs.get(sub_id)
            if sub is None:
                self.on_deliver(addr, sub_id, event)  # (taken over: see _adopt)
                continue
            if sub.consumed is not None and consumed(sub.consumed, eid):
                self._dropped.append((eid, 1))
                continue
            self.delivered += 1
            session = sub.session  # (_straight_on and _sent, inlined: the hot path)
            if (
                session is not None
                and not sub.pending
                and not sub.on_disk
                and not sub.held
                and sub.unacked < window
                and sub.in_memory < memory
                and sub.awaiting is None
                and serving
            ):
                sub.unacked += 1
                sub.in_memory += 1
                straight += 1
                row = rows.get(session)
                if row is None:
                    rows[session] = [sub]
                else:
                    row.append(sub)
            else:
                self._queue(sub, eid, plain)
        flights = self._flights
        for session, row in rows.items():
            flights[session].offer(session, row, eid, plain)
        if straight:  # (a DeliverAll's subscriptions are all to one space: the event's own,
            self.sent[next(iter(rows.values()))[0].space] += straight  # or a flow's derived one)

    def _straight_on(self, sub: SubQueue) -> bool:
        """Whether a delivery to ``sub`` (attached) goes to its connection now: nothing
        queued before it, room in its window and in memory."""
        return (
            not sub.pending
            and not sub.on_disk
            and not sub.held
            and sub.unacked < self.window
            and sub.in_memory < self.memory
            and sub.awaiting is None
        )

    def _sent(self, sub: SubQueue) -> None:
        sub.unacked += 1
        sub.in_memory += 1
        self.sent[sub.space] += 1

    def _queue(self, sub: SubQueue, eid: Any, plain: dict[str, Any]) -> None:
        """A delivery to ``sub`` that waits: in its queue, or for its SQLite queue (past
        ``memory``, its client away, or behind what is there already: see :meth:`_hold`)."""
        if (
            sub.held
            or sub.on_disk
            or sub.session is None
            or sub.in_memory >= self.memory
            or sub.awaiting is not None
        ):
            self._hold(sub, eid, plain)
        else:
            sub.queue().append((eid, plain, None))
            sub.in_memory += 1
        self._pump_soon(sub)

    def _hold(self, sub: SubQueue, eid: Any, plain: dict[str, Any]) -> None:
        """A delivery for ``sub``'s SQLite queue: held until it is written (after the step)
        and settled then; refused if the store is failing and ``sub`` holds its limit."""
        full = self.full
        if full is not None and sub.in_memory + len(sub.held) >= HOLD_LIMIT * self.memory:
            self.refused += 1
            self._refusing.append(
                (
                    eid,
                    f"{self.name} cannot queue the event for subscription {sub.sub_id!r}: "
                    f"its store is full ({full.reason})",
                )
            )
            return
        sub.held.append(_held(sub.sub_id, eid, plain))
        self._holding[sub] = None
        self._touched = True

    def after_step(self) -> None:
        """After a step of the core: what it held written to SQLite (if the store is failing:
        tried again, at most every ``TOUCH_EVERY``) and settled in the core soon, what it
        refused refused there (outside the step)."""
        if self._holding and self._touched:
            self._touched = False
            if self.full is None:
                settle = self._write(list(self._holding))
                if settle:
                    asyncio.get_running_loop().call_soon(self._settle, settle)
            elif asyncio.get_running_loop().time() - self._tried >= TOUCH_EVERY:
                self.retry()
        if self._refusing:
            refusing, self._refusing = self._refusing, []
            asyncio.get_running_loop().call_soon(self._refuse, refusing)
        if self._dropped:
            dropped, self._dropped = self._dropped, []
            asyncio.get_running_loop().call_soon(self._settle, dropped)
        if self._gated or self._gated_calls:
            self._release_gated()

    def _release_gated(self) -> None:
        """Settle the spills, and answer the backlogs, whose ring state entry (their queue on
        disk) is backed up now."""
        confirmed = self.core.backups_confirmed()
        calls = [c for v, c in self._gated_calls if v <= confirmed]
        if calls:
            self._gated_calls = [(v, c) for v, c in self._gated_calls if v > confirmed]
            for call in calls:
                asyncio.get_running_loop().call_soon(call)
        ready = [s for v, s in self._gated if v <= confirmed]
        if ready:
            self._gated = [(v, s) for v, s in self._gated if v > confirmed]
            asyncio.get_running_loop().call_soon(self._settle, [x for s in ready for x in s])

    def retry(self) -> None:
        """Write what waits for the store, in order: acknowledged rows to delete, taken-over
        subscriptions to record, each subscription's held deliveries (a transaction each,
        settled soon), until one fails. :attr:`full` is None once nothing waits."""
        if self.closed:
            return
        self._tried = asyncio.get_running_loop().time()
        try:
            for sub_id, upto in list(self._acks.items()):
                self.store.ack(sub_id, upto)
                del self._acks[sub_id]
            self._record_adopted()
        except StoreFull as e:
            self.full = e
            return
        settle: list[Settle] = []
        for sub in list(self._holding):
            done = self._write([sub])
            if done is None:
                break
            settle.extend(done)
        if settle:
            asyncio.get_running_loop().call_soon(self._settle, settle)
        if not (self._holding or self._acks or self._unrecorded):
            self.full = None

    def _write(self, subs: list[SubQueue]) -> list[Settle] | None:
        """What ``subs`` hold, written to the SQLite queue in one transaction: now on disk, in
        order after what was there, and to be settled (returned). None if the store is full:
        it stays held (:attr:`full` says why)."""
        # (in the order they came over all subscriptions: a reader of several queues, Spark's
        # pulled subscriptions, merges them by position)
        rows = [h[2] for h in heapq.merge(*(sub.held for sub in subs), key=lambda h: h[3])]
        try:
            self._record_adopted()
            if rows:
                self.store.enqueue_many(rows)
        except StoreFull as e:
            self.full = e
            return None
        settle: list[Settle] = []
        fresh = []
        for sub in subs:
            settle.extend((eid, 1) for eid, *_ in sub.held)
            sub.on_disk += len(sub.held)
            sub.held.clear()
            self._holding.pop(sub, None)
            self._pump_soon(sub)
            if not sub.flagged and sub.on_disk:
                fresh.append(sub)
        self.spilled += len(rows)
        if fresh:  # (the ring must know of a queue on disk before its spill is settled)
            version = self._flag(fresh)
            if version > self.core.backups_confirmed():
                self._gated.append((version, settle))
                return []
        return settle

    def _flag(self, subs: list[SubQueue]) -> int:
        """The ring state says ``subs``' queues have events on this disk; the backup version
        that says so."""
        version = 0
        for sub in subs:
            sub.flagged = True
            version, effects = self.core.mark_backlog(sub.sub_id, True)
            sub.flag_version = version
            self.apply(effects)
        return version

    def _unflag(self, sub: SubQueue) -> None:
        """``sub``'s queue on disk is empty again: the ring state says so no more."""
        if sub.flagged and not sub.on_disk and not sub.held and not any(w for _, _, w in sub.pending):
            sub.flagged = False
            self.apply(self.core.mark_backlog(sub.sub_id, False)[1])

    def _record_adopted(self) -> None:
        """Record the subscriptions taken over that the store could not record then (their
        rows' subscription must be known first); a :class:`StoreFull` if it still cannot."""
        for sub_id in sorted(self._unrecorded):
            sub = self.subs.get(sub_id)
            if sub is not None:
                with contextlib.suppress(StoreError):  # (recorded after all)
                    self._record(sub)
            self._unrecorded.discard(sub_id)

    def _ack_disk(self, sub_id: str, upto: int) -> None:
        """``sub_id``'s SQLite rows up to position ``upto`` are taken: deleted, or if the
        store is full, kept to delete later (they were loaded: not sent again meanwhile)."""
        upto = max(upto, self._acks.pop(sub_id, 0))
        try:
            self.store.ack(sub_id, upto)
        except StoreFull as e:
            self._acks[sub_id] = upto
            self.full = e
            return
        sub = self.subs.get(sub_id)
        if sub is not None and sub.flagged and not sub.on_disk:
            self._unflag(sub)

    # -- serving a subscription

    def _no_room(self, filters: Sequence[str]) -> str | None:
        """Why subscriptions with ``filters`` would take this broker past its
        ``memory_limit`` (None: they would not, or it has none)."""
        limit = self.memory_limit
        if limit is None:
            return None
        rss = resident_mb()
        need = (len(filters) * SUB_BYTES + sum(map(len, filters))) / MB
        if rss is None or rss + need <= limit:
            return None
        what = "a subscription" if len(filters) == 1 else f"{len(filters):,} subscriptions"
        return (
            f"out of memory for subscriptions: {what} would take this broker past its "
            f"memory_limit of {limit:,} MB (resident now: {rss:,.0f} MB)"
        )

    def _open(self, session: Session, msg: p.Subscribe) -> tuple[bool, str | None]:
        full = self._no_room([msg.filter])
        if full is not None:
            return False, full
        if self.spaces.flow_of(msg.space) is not None:
            return self._open_flow(session, msg)
        filt, error = self.spaces.check_filter(msg.space, msg.filter)
        if filt is None:
            return False, error
        if msg.collapse is not None:
            why = self.spaces.check_collapse(msg.collapse, msg.space)
            if why is not None:
                return False, why
        sub = SubQueue(msg.sub_id, session.client, msg.space, filt.to_text(), msg.durable, msg.collapse)
        try:
            self._record(sub)
        except FlowbusError as e:
            return False, str(e)
        self.subs[sub.sub_id] = sub
        routing = self.spaces.routing_filter(msg.space, filt)
        self.apply(self.core.subscribe(sub.sub_id, routing, meta=sub.meta()))
        self._attach(session, sub)
        return True, None

    def _open_flow(self, session: Session, msg: p.Subscribe) -> tuple[bool, str | None]:
        """A subscription to a space of a deployed flow: the core routes its pulled-back
        filter and applies the flow's transforms (:mod:`flowbus.routing.flows`)."""
        core = self.ring_core
        if core is None:  # (only the ring's brokers have flows)
            return False, f"{self.name} runs no flows (its overlay is not the chordal ring)"
        if msg.collapse is not None:
            return False, "a subscription to a flow's space names no collapse rule set (the flow's own apply)"
        try:
            core.flows.plan(msg.space, msg.filter)  # (checked before anything changes)
            collapse = self.spaces.flow_collapse(msg.space)  # (an expand's rule set: see Spaces)
            sub = SubQueue(msg.sub_id, session.client, msg.space, msg.filter, msg.durable, collapse)
            self._record(sub)
        except FlowbusError as e:
            return False, str(e)
        self.subs[sub.sub_id] = sub
        self.apply(core.subscribe_flow(sub.sub_id, msg.space, msg.filter, meta=sub.meta()))
        self._attach(session, sub)
        return True, None

    def ended(self, sub_ids: list[Hashable]) -> None:
        """Subscriptions the core ended (their flow was withdrawn): their queues go."""
        for sub_id in sub_ids:
            sub = self.subs.pop(sub_id, None) if isinstance(sub_id, str) else None
            if sub is not None:
                self.detach(sub)
                self._drop_held(sub)
                with contextlib.suppress(FlowbusError):
                    self.store.remove_subscription(sub.sub_id)

    def _adopt(self, sub_id: Hashable) -> SubQueue | None:
        """A subscription the core took over from a dead broker: serve it here."""
        meta = self.core.meta_of(sub_id)
        if not isinstance(sub_id, str) or not isinstance(meta, Mapping):
            return None
        sub = SubQueue.from_meta(sub_id, meta)
        sub.awaiting = self.core.awaited(sub_id)
        sub.consumed = self.core.consumed(sub_id) or None
        if sub.awaiting is not None and not self.closed:  # (its former broker may never come back)
            asyncio.get_running_loop().call_later(self.backlog_wait, self.give_up_backlog, sub_id)
        self.subs[sub_id] = sub
        try:
            self._record(sub)
        except StoreFull as e:  # (recorded later: before any row of its queue is written)
            self._unrecorded.add(sub_id)
            self.full = e
        except FlowbusError:
            pass
        if not sub.durable:
            self._start_linger(sub)
        return sub

    def _record(self, sub: SubQueue) -> None:
        self.store.add_subscription(
            sub.sub_id,
            client=sub.client,
            space=sub.space,
            filter=sub.filter,
            durable=sub.durable,
            collapse=sub.collapse,
        )

    def _attach(self, session: Session, sub: SubQueue) -> None:
        if sub.linger is not None:
            sub.linger.cancel()
            sub.linger = None
        sub.session = session
        flight = self._flights.get(session)
        if flight is None:
            flight = self._flights[session] = Flight()
        flight.attached.add(sub.sub_id)
        if (
            sub.collapse is not None
            and sub.known
            and (sub.pending or sub.on_disk or sub.held)
            and sub.awaiting is None
        ):
            self._catch_up(sub)
        self._pump_soon(sub)

    def _away(self, sub: SubQueue) -> None:
        """A durable subscription's client left: what waits for it in memory, still in the
        sender's custody (its deliveries in flight included), goes to its SQLite queue in
        order and is settled, as if the client had been away all along: a publisher is not
        kept waiting for a subscriber that may be gone for long. Only when nothing of its
        queue is on disk already (else those rows come first: the entries wait in memory).
        If the store is full, they are held (before what was held already) until it is not."""
        pending = sub.pending
        if self.closed or sub.on_disk or not pending or any(where is not None for _, _, where in pending):
            return  # (closed: what is in custody stays with its senders, see Broker's step-down)
        sub.held[:0] = [_held(sub.sub_id, eid, plain) for eid, plain, _ in pending]
        sub.in_memory -= len(pending)
        pending.clear()
        self._holding[sub] = None
        settle = self._write([sub]) if self.full is None else None
        if settle:
            self._settle(settle)

    def _start_linger(self, sub: SubQueue) -> None:
        if self.closed:
            return
        if sub.linger is not None:
            sub.linger.cancel()
        sub.linger = asyncio.get_running_loop().call_later(self.linger, self._expire, sub.sub_id)

    def _expire(self, sub_id: str) -> None:
        sub = self.subs.get(sub_id)
        if sub is not None and sub.session is None and not self.closed:
            self._remove(sub)

    def _remove(self, sub: SubQueue) -> None:
        self.subs.pop(sub.sub_id, None)
        self.detach(sub)  # (what was in flight to it: back in its queue, settled below)
        if sub.linger is not None:
            sub.linger.cancel()
        settle = sub.in_custody()
        self._drop_held(sub, settle=False)  # (settled with the rest below)
        if sub.sub_id in self.core.subs:
            self.apply(self.core.unsubscribe(sub.sub_id))
        if settle:
            self._settle(settle)
        with contextlib.suppress(FlowbusError):
            self.store.remove_subscription(sub.sub_id)

    def _drop_held(self, sub: SubQueue, *, settle: bool = True) -> None:
        """``sub`` ends: what it held is not written (it is settled soon: dropped, as if
        written; ``settle=False``: the caller settles it)."""
        if self._holding.pop(sub, None) is not None and settle and sub.held:
            asyncio.get_running_loop().call_soon(self._settle, [(eid, 1) for eid, *_ in sub.held])
        sub.held.clear()
        self._acks.pop(sub.sub_id, None)
        self._unrecorded.discard(sub.sub_id)

    def _settle(self, settling: list[Settle]) -> None:
        """The core may forget these deliveries: taken, on disk, or dropped."""
        if self.closed:
            return
        self.apply(self.core.settle_many(settling))

    def _refuse(self, refusing: list[tuple[Any, str]]) -> None:
        """These deliveries (``(event id, reason)``) are refused: their publishers are told."""
        if self.closed:
            return
        self.apply(self.core.refuse_local(refusing))

    # -- pumping queues to clients

    def _pump_soon(self, sub: SubQueue) -> None:
        if sub.session is None:
            return
        self._pumps.add(sub)
        if not self._pump_due:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump_all)

    def _pump_all(self) -> None:
        self._pump_due = False
        pumps, self._pumps = self._pumps, set()
        for sub in pumps:
            self._pump(sub)

    def _pump(self, sub: SubQueue) -> None:
        """Send what the window has room for, loading from disk when memory is empty."""
        session = sub.session
        if session is None or session.closed or sub.awaiting is not None:
            return
        if self.fence is not None and not self.fence.ok():
            return
        room = self.window - sub.unacked
        while room > 0:
            if not sub.pending:
                if sub.on_disk:
                    self._load(sub, room)
                elif sub.held:
                    self._unhold(sub, room)
            n = min(room, len(sub.pending))
            if not n:
                break
            self._flights[session].deliver(session, sub, sub.take(n))
            self.sent[sub.space] += n
            room -= n

    def _load(self, sub: SubQueue, n: int) -> None:
        sub.loaded(self.store.pending(sub.sub_id, limit=max(n, 256), after=sub.disk_pos))

    def _unhold(self, sub: SubQueue, n: int) -> None:
        """The next ``n`` held deliveries of ``sub`` (nothing of its queue on disk before
        them: the store failed to take them), now pending: sent from memory, in custody."""
        held, pending = sub.held, sub.queue()
        n = min(n, len(held))
        for eid, plain, *_ in held[:n]:
            pending.append((eid, plain, None))
        del held[:n]
        sub.in_memory += n
        if not held:
            self._holding.pop(sub, None)

    # -- collapse rule sets

    def _fold(self, sub: SubQueue) -> None:
        """What ``sub``'s client took, folded into its state (in batches: the fold's cost is
        mostly per call, and the state is only read by a catch-up)."""
        assert sub.collapse is not None  # (only subscriptions with a rule set keep events)
        taken, sub.taken = sub.taken, ()
        it = self.spaces.interpretation(sub.collapse, sub.space)
        sub.seen = it.fold(sub.seen, taken, delivered=True)

    def _catch_up(self, sub: SubQueue) -> None:
        """Replace the backlog of a subscription with a collapse rule set by its shortest
        equivalent sequence (the backlog's own events are settled: this broker has them)."""
        assert sub.collapse is not None  # (called for subscriptions with a rule set only)
        if sub.taken:
            self._fold(sub)
        if sub.on_disk:
            self._load(sub, sub.on_disk + 1)
        if sub.held and not sub.on_disk:  # (the store failed to take them: the backlog's end)
            self._unhold(sub, len(sub.held))
        if len(sub.pending) < 2:
            return
        interpretation = self.spaces.interpretation(sub.collapse, sub.space)
        events = interpretation.catch_up(sub.seen, [e for _, e, _ in sub.pending])
        settle, disk = sub.caught_up(events)
        if disk:
            self._ack_disk(sub.sub_id, disk)
        if settle:
            self._settle(settle)
