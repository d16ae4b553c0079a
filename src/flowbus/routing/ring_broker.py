"""A content-routing broker of the chordal reliability ring (sans-IO core).

How it works: one core joins two protocols.

* :class:`~flowbus.overlay.chordal_ring.RingNode` handles membership, the window,
  backups, failure detection and takeover.
* :class:`~flowbus.routing.cbr.ContentRouter` does covering-based subscription forwarding
  with delivery along the reverse path, over a tree of the brokers.

* **The tree.** The ring itself, cut where the ids wrap round (between the largest id and
  the smallest): a broker's tree neighbours are its Right and Left, except across the cut.
  Every broker computes it from its own window, so when the ring is repaired around a dead
  broker, the tree is repaired with it. The routers are told with ``set_neighbours`` after
  every message that changed the window. A routing message from a broker that is not (yet)
  a tree neighbour is kept until it becomes one (the two ends learn of a new link at
  different times).
* **New links are flooded until synced.** A broker that gets a new tree neighbour sends
  it its subscriptions, then ``Synced``. Until the neighbour's own ``Synced`` arrives, it
  sends the neighbour every event, matching or not: its table for that direction may still
  miss subscriptions (those a dead broker's covering filters hid, say), and an event
  routed by an incomplete table would be lost. The neighbour delivers only what matches.
  ``Synced`` says the table is whole: a broker sends it to a new neighbour only once its
  other new neighbours have sent theirs (their subscriptions passed on before it), so a
  broker that joins between two others is flooded by each until it knows the other's
  side (the tree has no cycle: nobody waits for itself).
* **Subscriptions are state.** ``subscribe`` files ``("sub", id) -> filter text`` in the
  ring node's state, so it is backed up on the ring neighbours. When a broker takes over a
  dead one's state, the subscriptions in it are subscribed here: their events are delivered
  by the broker that took over (a client would re-attach to it).
* Each subscription id is global (say ``(client, n)``): ``Deliver(sub_id, event)``.
* **The parts.** ``RingBroker`` reads every message and timer and ends every step in
  ``_out`` (deliveries de-duplicated, custody counted, confirmations due); each concern
  keeps its state in a part it composes: the custody records
  (:class:`~flowbus.routing.ring_custody.Custodian`), the events kept for the ring's repair
  and the subscriptions taken over (:class:`~flowbus.routing.ring_repair.Repair`), the
  deployed flows' folds and edges (:class:`~flowbus.routing.ring_flows.FlowSide`), the
  subscriptions shared under load (:mod:`~flowbus.routing.ring_share`), express links
  (:mod:`~flowbus.routing.express`), link classes (:mod:`~flowbus.routing.link_classes`).

* **Events sent into a failure** (:mod:`flowbus.routing.ring_repair`). An event whose send
  to a tree neighbour fails (the driver's failure notice) is kept, with the side of the ring
  it was going to; later events for that side wait behind it, so each publisher's order
  holds.
  - When the ring has a new neighbour on that side, the event goes there. That broker is
    the first one of the part of the tree the dead broker led to, so nothing there had the
    event yet.
  - When this broker takes the dead one's subscriptions over itself, the kept events are
    delivered to them.
  So one crash loses no event, as long as its subscriptions were backed up and the
  failure is detected (heartbeats or failed sends).

* **Custody** (``custody=True``, what the broker network runs;
  :mod:`flowbus.routing.ring_custody`). A broker keeps every event it has sent on until the
  receiver confirms it (``Confirm``), and a receiver confirms only when its own part is
  done: every neighbour it sent the event on has confirmed, and, with ``local_ack=True``,
  every local subscription it delivered to has been settled by the driver
  (:meth:`RingBroker.settle`, called when the subscriber's client acknowledged it or it was
  queued on disk; the record counts the deliveries not settled yet). When a neighbour dies,
  every event it had not confirmed goes the way of a failed send (above): so the events a
  dead broker held in transit, or had not yet handed to its clients, are not lost, and two
  adjacent crashes lose nothing the ring's repair reaches. An event published here and
  confirmed by all is *settled*: its id goes to the driver in a :class:`~flowbus.core.Settled`
  effect (the driver acknowledges the publisher). Delivery stays at least once across a crash; each broker
  drops the duplicates it can see (the ``DEDUP_WINDOW``), the client library the rest, by
  event id.
* **Secure spaces** (:mod:`flowbus.routing.link_classes`). Each broker announces the class
  of its tree links to the whole tree (``announce_links``); an event its driver would not
  send over a plain link is released as *refused* (:meth:`RingBroker.refuse`), and a record
  with a refusal answers ``Refused`` upstream instead of ``Confirm``: the publisher's broker
  reports the publish in a :class:`~flowbus.core.PublishRefused` effect, not ``Settled``.

What is not done here: a link failure whose broker is alive (the tree keeps the link; its
events wait until the link is back).
"""

from __future__ import annotations

import functools
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec

from flowbus import wire
from flowbus.core import Core, Deliver, DeliverAll, Effect, Ended, PublishRefused, Send, Settled
from flowbus.errors import FilterError, ProtocolError, SubscriptionError, UserError
from flowbus.filters import Filter, parse
from flowbus.flow.deploy import Deployment
from flowbus.matching import Matcher
from flowbus.meta import EVENT_ID, PARTITION, SPACE
from flowbus.overlay.chordal_ring import MESSAGES as RING_MESSAGES
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.class_router import LinkBeat, LinkEcho
from flowbus.overlay.ring_messages import Peer, cw
from flowbus.routing import cbr
from flowbus.routing.express import Detour, ExpressRoutes, LinkLatency
from flowbus.routing.flows import DeployRecord, Flows, FlowSync, SnapshotAsk, SnapshotRows
from flowbus.routing.link_classes import LinkBook, LinkClasses, Refused
from flowbus.routing.memo import compiled
from flowbus.routing.ring_barrier import Barriers, Drain, Drained
from flowbus.routing.ring_custody import (
    Again,
    Confirm,
    Custodian,
    Declined,
    Key,
    Resume,
    Resumed,
    publish_order,
    relay_id,
    relayed,
)
from flowbus.routing.ring_flows import DERIVED_NOW, DERIVED_TIMER, DERIVED_WAIT, FLOW_GRACE, FlowSide
from flowbus.routing.ring_handover import MAX_HOPS, Backlog, BacklogAck, HeldHere, WhereIs, awaited
from flowbus.routing.ring_keys import (
    CONSUMED,
    DISK,
    SUB,
    ConsumedKey,
    SubKey,
    consumed_key,
    disk_key,
    flow_sub_key,
    record,
    sub_key,
)
from flowbus.routing.ring_moves import Moves
from flowbus.routing.ring_repair import HandedOver, Repair
from flowbus.routing.ring_share import Delegated, SharedSubs, Undelegated, Unshare

__all__ = [
    "DEDUP_EVENTS",
    "DEDUP_WINDOW",
    "DERIVED_NOW",
    "DERIVED_TIMER",
    "DERIVED_WAIT",
    "FLOW_GRACE",
    "Confirm",
    "Declined",
    "HandedOver",
    "RingBroker",
    "Synced",
    "origin_of",
]


def origin_of(key: SubKey) -> tuple[int, Hashable]:
    """The routing origin of a subscription's state key: ``(home broker, sub_id)``."""
    return (key.home, key.sub)


DEDUP_WINDOW = 100_000
"""How many recent (subscription, event id) deliveries a broker remembers (IRBR's)."""

DEDUP_EVENTS = 50_000
"""How many recent events a ring broker remembers the local deliveries of."""

OWED_ROUNDS = 10
"""Heartbeat rounds a new tree neighbour waits at most for our ``Synced`` (see the note)."""

EARLY_ROUNDS = 3
"""Heartbeat rounds a routing message from a broker that is no tree neighbour here waits for
the link to be new to this end too, before its events are routed as a former neighbour's
(:meth:`RingBroker._stale_early`)."""

HEIR_ROUNDS = 1
"""Heartbeat rounds after a dead tree neighbour's place went to its replacement during which
what is routed to the replacement by what came from the dead one alone is kept for the dead
one's taker too (see :meth:`RingBroker._heir`): about the time the taker's announcement takes
round the tree."""

REPLAY_ROUNDS = 12
"""Heartbeat rounds of events a broker routed that it delivers again to subscriptions it
takes over from a dead broker (see :meth:`RingBroker._replay`): longer than a death takes
to be found and taken up (the guard, a probe, the backup's first live holder)."""


@wire.message("ringbroker.synced")
@dataclass(frozen=True, slots=True)
class Synced:
    """The sender has sent the receiver, a new tree neighbour, every subscription it has
    for it: until this arrives, the receiver sends the sender every event (see the note)."""


_P = ParamSpec("_P")


def _reports(
    call: Callable[Concatenate[RingBroker, _P], list[Effect]],
) -> Callable[Concatenate[RingBroker, _P], list[Effect]]:
    """A call of the core from its driver: its effects, then what it settled, refused or
    ended, as :class:`~flowbus.core.Outcome` effects (:meth:`RingBroker._report`)."""

    @functools.wraps(call)
    def step(self: RingBroker, /, *args: _P.args, **kwargs: _P.kwargs) -> list[Effect]:
        return self._report(call(self, *args, **kwargs))

    return step


def check_new_subs(addr: int, subs: Collection[Hashable], ids: Sequence[Hashable]) -> None:
    """A :class:`ProtocolError` unless ``ids`` are new subscriptions at broker ``addr``,
    which serves ``subs``: none of them, and no id twice."""
    seen: set[Hashable] = set()
    for sub_id in ids:
        if sub_id in subs or sub_id in seen:
            raise ProtocolError(f"broker {addr}: subscription {sub_id!r} exists already")
        seen.add(sub_id)


class RingBroker(Core):
    """One broker: a ring node and a content router over the ring's tree. It reads its
    messages in one ``match``: custody, handed-over events and the router's messages here,
    the ring's to the ring node."""

    def __init__(
        self,
        addr: int,
        *,
        backup: int = 2,
        heartbeat: float | None = None,
        custody: bool = False,
        local_ack: bool = False,
        advertising: bool = False,
        grouped: bool = False,
        share_subs: bool = False,
        express: ExpressRoutes | None = None,
        **ring: Any,
    ) -> None:
        if local_ack and not custody:
            raise ProtocolError("local_ack needs custody=True")
        if grouped and not local_ack:
            raise ProtocolError("grouped needs local_ack=True")
        self.custody = custody
        self.local_ack = local_ack
        self.custodian = Custodian()  # the events held until others are done (ring_custody.py)
        # the classes of every broker's tree links (link_classes.py)
        self.link_book: LinkBook[LinkClasses] = LinkBook()
        self.shared = SharedSubs(addr)  # subscriptions shared under load (ring_share.py)
        self.express = express if express is not None else ExpressRoutes(addr)  # (express.py; off)
        self._count_cost = share_subs  # deliveries counted per subscription (the busiest move first)
        if share_subs:
            ring["movable"] = self._movable
        self.ring = RingNode(addr, backup=backup, heartbeat=heartbeat, keyed=record, **ring)
        self.router = cbr.ContentRouter(addr, (), advertising=advertising, grouped=grouped)
        self.subs: set[Hashable] = set()  # subscriptions served here (own and taken over)
        self._early: dict[int, list[Any]] = {}  # routing messages from not-yet neighbours
        self._early_rounds: dict[int, int] = {}  # senders in _early -> heartbeat rounds since
        self._syncing: set[int] = set()  # new tree neighbours whose Synced has not come
        self._owed: dict[int, int] = {}  # new tree neighbours owed our Synced -> rounds waited
        self._declining: set[int] = set()  # neighbours whose events we decline until their Resume
        self._deferred: dict[int, dict[tuple[type, Any], Any]] = {}  # src -> delegations kept unread
        self._tables = (-1, -1)  # the router's changes at the last prepare() and those prepared for
        self.barrier = Barriers()  # takeovers' deliveries waiting for what was kept (ring_barrier.py)
        self.repair = Repair(self.ring, self.router, self.custodian, self.barrier)  # kept events
        self.moves = Moves(self.custodian)  # events for a route's new way wait for the old (ring_moves.py)
        self.repair.moving = self.moves
        self._takeovers = 0  # how many of the ring node's takeovers we have taken up
        self._recent: deque[list[Mapping[str, Any]]] = deque([[]], maxlen=REPLAY_ROUNDS)  # events
        # routed here, by heartbeat round (with custody: see _replay)
        self._adopted: dict[Hashable, tuple[int, Hashable]] = {}  # taken-over sub -> its origin
        self._seq = 0
        self._delivered: OrderedDict[Any, Any] = OrderedDict()  # event id -> its subs (tuple, set)
        self._state_seen: tuple[int, int, int] = (-1, -1, -1)  # the ring state _sync last read
        self._fenced: dict[int, Peer] = {}  # address -> the dead broker that was there (no live one is)
        self._placeholders: set[int] = set()  # dead tree neighbours kept until replaced (_gaps)
        # a dead tree neighbour's replacement -> (it, the origins that came from it, the heartbeat
        # round it was replaced in: see _heir)
        self._inherited: dict[int, tuple[int, set[cbr.Origin], int]] = {}
        self._dead_seen: set[int] = set()  # the ring's dead (ids) at the last _sync
        self._orphaned: dict[int, int] = {}  # of those, kept for their orphans -> heartbeat rounds
        self._buried: set[int] = set()  # the ring ids of dead tree neighbours whose custody records were kept
        self._resyncing: set[int] = set()  # neighbours whose link broke: told our side again at Resumed
        self._tree_ids: dict[int, int] = {}  # tree neighbour address -> the ring id there (_renewed)
        self._former_ids: dict[int, int] = {}  # former tree neighbour address -> its ring id then
        self._fence_sig: tuple[int, tuple[int, ...]] = (0, ())  # (what _fenced was made from)
        # the deployed flows (ring_flows.py); a taken-over partition gathers events this long
        self.flow_side = FlowSide(self, 2.0 * heartbeat if heartbeat is not None else 5.0)
        self.flows: Flows = self.flow_side.flows  # (routing/flows.py)

    def _report(self, out: list[Effect]) -> list[Effect]:
        """``out``, and what this call settled, refused or ended as :class:`Outcome` effects:
        the ids of events published here that everyone is done with (:class:`Settled`), those
        refused on the way instead (:class:`PublishRefused`), the flow subscriptions an
        undeploy ended (:class:`Ended`)."""
        custodian, flows = self.custodian, self.flows
        if not (custodian.settled or custodian.refused or flows.ended):
            return out
        out = list(out)
        if custodian.settled:
            out.append(Settled(tuple(custodian.settled)))
            custodian.settled = []
        if custodian.refused:
            out.append(PublishRefused(tuple(custodian.refused)))
            custodian.refused = []
        if flows.ended:
            out.append(Ended(tuple(flows.ended)))
            flows.ended = []
        return out

    @property
    def addr(self) -> int:
        return self.ring.addr

    @property
    def joined(self) -> bool:
        return self.ring.joined

    @property
    def node_id(self) -> int:
        return self.ring.me.id

    def serving(self, now: float) -> bool:
        """Whether this broker may serve its clients now (the ring node's lease: see
        :meth:`RingNode.serving <flowbus.overlay.chordal_ring.RingNode.serving>`)."""
        return self.ring.serving(now)

    def peer_addrs(self) -> list[int]:
        """The live brokers this one links to (the window and chords)."""
        if not self.ring.joined:
            return []
        return [p.addr for p in self.ring.links() if p.id not in self.ring.dead]

    @property
    def syncing(self) -> set[int]:
        """The new tree neighbours whose ``Synced`` has not come (their tables not whole here)."""
        return self._syncing

    def tree_neighbours(self) -> set[int]:
        """Right and Left, except across the cut where the ids wrap round."""
        if not self.ring.joined:
            return set()
        me = self.ring.me.id
        right, left = self.ring.right, self.ring.left
        out = set()
        if right is not None and right.id > me:
            out.add(right.addr)
        if left is not None and left.id < me:
            out.add(left.addr)
        return out

    # -- local calls

    @_reports
    def start(self) -> list[Effect]:
        return self._sync(self.ring.start())

    @_reports
    def join(self, candidates: Sequence[int]) -> list[Effect]:
        return self.ring.join(candidates)

    @_reports
    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]:
        """Serve ``filt`` here as ``sub_id``; ``meta`` (what the driver needs to serve it
        elsewhere after a takeover) is backed up with it."""
        if sub_id in self.subs:
            raise ProtocolError(f"broker {self.addr}: subscription {sub_id!r} exists already")
        self.subs.add(sub_id)
        out = self.router.subscribe(sub_id, filt)
        value = filt.to_text() if meta is None else (filt.to_text(), meta)
        return out + self.ring.set_state(sub_key(sub_id, self.addr), value)

    @_reports
    def subscribe_many(self, items: Sequence[tuple[Hashable, Filter, Any]]) -> list[Effect]:
        """:meth:`subscribe` for each of ``items`` ``(sub_id, filt, meta)``, all checked first;
        their backups go in one copy (and one report)."""
        check_new_subs(self.addr, self.subs, [sub_id for sub_id, _, _ in items])
        out: list[Effect] = []
        changes: dict[Hashable, Any] = {}
        for sub_id, filt, meta in items:
            self.subs.add(sub_id)
            out += self.router.subscribe(sub_id, filt)
            changes[sub_key(sub_id, self.addr)] = filt.to_text() if meta is None else (filt.to_text(), meta)
        return out + self.ring.set_states(changes)

    def _sub_key(self, sub_id: Hashable) -> SubKey | None:
        """The state key of a subscription served here, from the index."""
        keys = [k for k in map(record, self.ring.keys_of(SUB, sub_id)) if isinstance(k, SubKey)]
        return min(keys, key=repr, default=None)

    def meta_of(self, sub_id: Hashable) -> Any:
        """The ``meta`` a subscription served here was made with (None if none)."""
        key = self._sub_key(sub_id)
        value = self.ring.state.get(key) if key is not None else None
        return value[1] if isinstance(value, tuple) else None

    @_reports
    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.subs:
            raise ProtocolError(f"broker {self.addr}: no subscription {sub_id!r}")
        self.subs.discard(sub_id)
        if sub_id in self.shared.out:  # (held by a neighbour: it drops it)
            return self.shared.unshare(sub_id)
        key = self._sub_key(sub_id)
        if key is None:  # (in a share not acknowledged yet: out of it, and the receiver drops it)
            key = sub_key(sub_id, self.addr)
            to = self.ring.shares.withdraw(key)
            return self.router.drop(origin_of(key)) + ([Send(to, Unshare((key,)))] if to is not None else [])
        self.repair.forget(sub_id)
        self.barrier.forget(sub_id)
        out = self.router.drop(origin_of(key)) + self.ring.del_state(key)
        for k in sorted(self.ring.keys_of(DISK, sub_id) | self.ring.keys_of(CONSUMED, sub_id), key=repr):
            out += self.ring.del_state(k)
        return out + self.flow_side.unsubscribed(sub_id)

    @_reports
    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]:
        """Publishers here will publish events matching ``filt`` (``advertising`` on): only
        subscriptions that may match an advertisement are forwarded towards it."""
        return self._out(self.router.advertise(adv_id, filt))

    @_reports
    def unadvertise(self, adv_id: Hashable) -> list[Effect]:
        return self._out(self.router.unadvertise(adv_id))

    @_reports
    def publish(self, event: Mapping[str, Any], *, event_id: Hashable = None) -> list[Effect]:
        """Route ``event``; it travels with an id (by default this broker and a sequence
        number; the broker network passes the publisher's own) that de-duplicates the
        deliveries to taken-over subscriptions. Without ``local_ack`` the id is removed
        before any subscriber sees the event; with it, the driver needs it to settle."""
        if event_id is None:
            self._seq += 1
            event_id = (self.addr, self._seq)
        stamped = {**event, EVENT_ID: event_id}
        if self.flows.records:
            self.flow_side.stamp(stamped)
        self._open(None, stamped)
        return self._out(self._extra(self.router.publish(stamped), stamped, self.addr))

    @_reports
    def publish_batch(self, items: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[Effect]:
        """Route many ``(event id, event)`` pairs at once: the effects of publishing them
        one by one, in order, with one pass of the matcher (while the tree is being
        repaired, one event at a time)."""
        stamped = [{**event, EVENT_ID: eid} for eid, event in items]
        if self.flows.records:
            self.flow_side.take_derived(stamped)
        return self._out(self.route_own(stamped))

    def route_own(self, events: list[dict[str, Any]]) -> list[Effect]:
        """Route events published here (in custody), in one matcher pass when the tree is whole.
        A flow's derived event is in custody only where it leaves this broker (see
        :meth:`FlowSide.custody_of <flowbus.routing.ring_flows.FlowSide.custody_of>`)."""
        flows = self.flows.parts
        for event in events:
            if not flows or PARTITION not in event:
                self._open(None, event)
        if not self.repair.orphans and not self._syncing:
            few = self.flow_side.route_few(events) if flows else None  # (alone: no matcher pass)
            out = self.router.route_batch(events, self.addr) if few is None else few
        else:
            out = []
            for event in events:
                out.extend(self._extra(self.router.route_batch([event], self.addr), event, self.addr))
        if flows and self.custody:
            self.flow_side.custody_of(out)
        return out

    def prepare(self) -> None:
        """Once the routing tables have not changed between two calls (the driver calls every
        ``PREPARE_EVERY``), build what the next events would: the router's matchers, the flows'
        gate and own index. A burst of subscriptions is prepared for once, when it ends, and the
        first events after it do not wait for ~0.1-0.3 s of building (400 subscriptions)."""
        changes = self.router.changes
        last, done = self._tables
        self._tables = (changes, done)
        if changes == done or changes != last:  # (prepared already, or still changing)
            return
        self._tables = (changes, changes)
        self.router.prepare()
        if self.flows.parts:
            self.flow_side.prepare()

    @_reports
    def settle(self, sub_id: Hashable, event_id: Hashable) -> list[Effect]:
        """The driver is done with the delivery of ``event_id`` to ``sub_id`` (its client
        acknowledged it, or it was queued on disk): part of custody with ``local_ack``."""
        return self.settle_many([(event_id, 1)])

    @_reports
    def settle_many(self, counts: Iterable[tuple[Hashable, int]]) -> list[Effect]:
        """:meth:`settle` in one step for ``(event id, n)``: ``n`` of its local deliveries."""
        self.custodian.settle_many(counts, self.flow_side.aliases)
        return self._out(self.repair.resend() if self.repair.release_due else [])

    @_reports
    def refuse_local(self, items: Iterable[tuple[Hashable, str]]) -> list[Effect]:
        """The driver gave up local deliveries (``(event id, reason)``, one delivery each: a
        subscription's queue could not take the event): settled as :meth:`settle_many` would,
        and their events refused with the reason, upstream to the publisher (as :meth:`refuse`)."""
        self.custodian.refuse_local(items, self.flow_side.aliases)
        return self._out([])

    def in_custody(self) -> int:
        """How many events this broker holds until others are done with them."""
        return len(self.custodian.records)

    # -- queues on disk and their handover (routing/ring_handover.py)

    def mark_backlog(self, sub_id: Hashable, on: bool) -> tuple[int, list[Effect]]:
        """``sub_id``'s queue has events on this broker's disk (``on``), or none any more: the
        ring state says so (see ring_handover). The backup version to wait for before a
        spill's settle is relied on (:meth:`backups_confirmed`), and the effects."""
        key = disk_key(sub_id, self.addr)
        if on:
            out = self.ring.set_state(key, True)
            out += self.ring.flush_backups()
            return self.ring.version, out
        return self.ring.version, self.ring.del_state(key) if key in self.ring.state else []

    def backups_confirmed(self) -> int:
        """The backup version every holder has acknowledged (see :meth:`mark_backlog`)."""
        return self.ring.backups.confirmed()

    def awaited(self, sub_id: Hashable) -> int | None:
        """The address of the broker whose disk holds older events of ``sub_id``, taken over
        here: its backlog is awaited (see ring_handover)."""
        return awaited(self.ring.keys_of(DISK, sub_id), self.addr)

    def consume(
        self, sub_id: Hashable, upto: Mapping[str, int], *, now: bool = True
    ) -> tuple[int, list[Effect]]:
        """``sub_id``'s client has consumed each publisher's events up to the sequence number
        ``upto`` names for it (a client that does not drop an event it had by its id: a STOMP
        one's). The ring state says so, backed up now: a broker that takes the subscription
        over delivers again what it routed of late (:meth:`_replay`, the repair), and the
        driver drops what :meth:`consumed` covers. The backup version to wait for before the
        client is told its consumption is safe, and the effects. Not ``now``: the copy goes
        with the step's others (no version to wait for: 0)."""
        out = self.ring.set_states({consumed_key(sub_id, pub): seq for pub, seq in upto.items()})
        if not now:
            return 0, out
        return self.ring.version, out + self.ring.flush_backups()

    def consumed(self, sub_id: Hashable) -> dict[str, int]:
        """How far ``sub_id``'s client has consumed each publisher's events (see
        :meth:`consume`; taken over with the subscription): publisher -> sequence number."""
        state = self.ring.state
        keys = [k for k in map(record, self.ring.keys_of(CONSUMED, sub_id)) if isinstance(k, ConsumedKey)]
        return {k.publisher: state[k] for k in keys if k in state}

    @_reports
    def backlog_done(self, sub_id: Hashable, home: int) -> list[Effect]:
        """``home``'s backlog of ``sub_id`` is here (or given up): no more waiting for it."""
        key = disk_key(sub_id, home)
        return self.ring.del_state(key) if key in self.ring.state else []

    @_reports
    def hand_over(self, dst: int, msg: Backlog | BacklogAck) -> list[Effect]:
        """Send a part of a backlog (or its acknowledgement) to ``dst`` (the driver's protocol
        on the ring's links: see ring_handover)."""
        return [Send(dst, msg)]

    @_reports
    def ask_where(self, subs: Sequence[str]) -> list[Effect]:
        """Ask the ring which brokers serve ``subs`` (see ring_handover): ``HeldHere`` answers
        and the question back come to the driver as ``("ring", "handover")`` notices."""
        return self._where_is(WhereIs(self.addr, tuple(subs), 0)) if subs else []

    def _where_is(self, msg: WhereIs) -> list[Effect]:
        here = tuple(s for s in msg.subs if s in self.subs)
        rest = tuple(s for s in msg.subs if s not in self.subs)
        if msg.asker == self.addr and msg.hops:  # (round the ring: nobody serves the rest)
            return [Deliver(("ring", "handover"), (self.addr, WhereIs(msg.asker, rest, msg.hops)))]
        out: list[Effect] = [Send(msg.asker, HeldHere(here))] if here and msg.hops else []
        right = self.ring.right if self.ring.joined else None
        if (rest or not msg.hops) and right is not None and msg.hops < MAX_HOPS:
            out.append(Send(right.addr, WhereIs(msg.asker, rest if msg.hops else msg.subs, msg.hops + 1)))
        return out

    # -- flows (routing/flows.py; the broker's side of them: ring_flows.py)

    def deploy(
        self, d: Deployment, *, nonce: int = 0, taken: Iterable[str] = ()
    ) -> tuple[DeployRecord, list[Effect]]:
        """Deploy ``d`` on the network from here: its record (the one deployed already if
        this version is) and the effects. A :class:`~flowbus.errors.UserError` if its name is
        taken by another version, or a space (``taken`` too) or function by another flow.
        ``d`` is this broker's from then on (not built again: it counts what goes through
        its routes and arcs); a caller that evaluates the flow too gives a copy."""
        existing = self.flows.check_new(d, taken)
        if existing is not None:
            return existing, []
        if not self.ring.joined:
            raise UserError(f"broker {self.addr} has not joined the ring yet: deploy again in a moment")
        owners = {self.node_id} | {p.id for p in self.ring.links() if p.id not in self.ring.dead}
        rec = DeployRecord(d.name, d.version, d.text, tuple(sorted(owners)), (self.node_id, nonce))
        return rec, self._report(
            self._out(self.flow_side.take_records((rec,), (), fresh=True, src=None, built=d))
        )

    @_reports
    def restore_flow(self, rec: DeployRecord) -> list[Effect]:
        """A flow this broker had deployed before a restart (its store keeps them): known
        again, with no partitions made (those it had were taken over)."""
        return self._out(self.flow_side.take_records((rec,), (), fresh=False, src=None))

    @_reports
    def undeploy(self, name: str) -> list[Effect]:
        """Withdraw flow ``name`` from the network (a UserError if none is deployed)."""
        rec = self.flows.records.get(name)
        if rec is None:
            known = ", ".join(sorted(self.flows.records)) or "none"
            raise UserError(f"no flow {name!r} is deployed (deployed: {known})")
        return self._out(self.flow_side.take_records((), (rec.deploy_id,), fresh=False, src=None))

    @_reports
    def subscribe_flow(
        self, sub_id: Hashable, space: str, filter_text: str = "", *, meta: Any = None
    ) -> list[Effect]:
        """Subscribe ``sub_id`` to ``space`` of a deployed flow with ``filter_text`` over its
        schema: the network routes the pulled-back filter, this broker applies the edge
        transforms (a UserError naming the space or field if it cannot be)."""
        sub = self.flows.plan(space, filter_text)
        out = self.subscribe(sub_id, sub.routing, meta=meta)
        self.flows.subs[sub_id] = sub
        out += self.ring.set_state(flow_sub_key(sub_id), (space, filter_text))
        return self._out(out + self.flow_side.ask_snapshot(sub_id, sub))

    # -- the driver's entry points

    @_reports
    def on_messages(self, src: int, msgs: Sequence[Any], now: float) -> list[Effect]:
        """Messages from ``src`` that came together: the effects of taking them one by one,
        in order, but each run of events from a tree neighbour routed in one matcher pass."""
        out: list[Effect] = []
        i = 0
        while i < len(msgs):
            j = i
            while j < len(msgs) and type(msgs[j]) is cbr.Publish:
                j += 1
            if j - i > 1 and src in self.router.neighbours:
                out.extend(self._publishes_from(src, [m.event for m in msgs[i:j]], now))
                i = j
            else:
                out.extend(self.on_message(src, msgs[i], now))
                i += 1
        return out

    def _publishes_from(self, src: int, events: list[Mapping[str, Any]], now: float) -> list[Effect]:
        """Events a tree neighbour sent (what ``on_message`` does with each, in one pass)."""
        self.ring.heard_from(src, now)
        if not self.ring.joined and (told := self.ring.met(src)):  # (see on_message)
            return told + self._publishes_from(src, events, now)
        if self.custody and (src in self._declining or not self.ring.serving(now)):  # (see on_message)
            self._declining.add(src)
            return [Send(src, Declined(tuple(e[EVENT_ID] for e in events)))]
        if self._deferred and src in self._deferred:
            return self._undefer(src, now) + self._publishes_from(src, events, now)
        before = self._early_before(src, events, now) if self._early else []
        for event in events:
            self._open(src, event)
        if not self.repair.orphans and not self._syncing:
            return before + self._out(self._not_again(self.router.route_batch(events, src)))
        out: list[Effect] = []
        for event in events:
            out.extend(self._extra(self.router.route_batch([event], src), event, src))
        return before + self._out(self._not_again(out))

    @_reports
    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        self.ring.heard_from(src, now)  # (a busy broker is alive: the ring's tests ask)
        if not self.ring.joined and (told := self.ring.met(src)):  # (a restarted broker: whoever
            return told + self.on_message(src, msg, now)  # takes it for the member it was is told)
        if type(msg) in _HANDOVER:  # (from or for a broker back as a new one: ring_handover)
            if type(msg) is WhereIs:
                return self._where_is(msg)
            return [Deliver(("ring", "handover"), (src, msg))]
        if self.custody and type(msg) in _EVENTS and (src in self._declining or not self.ring.serving(now)):
            # (without its lease, this broker may have been taken over: an event is not taken,
            # nor confirmed; its sender keeps it, in order, for us once back, or for the taker;
            # see ring_custody.py)
            inner = msg.msg if type(msg) is Again else msg
            if type(inner) is Delegated or type(inner) is Undelegated:  # (read once we may)
                self._deferred.setdefault(src, {}).setdefault((type(inner), inner.event[EVENT_ID]), msg)
                return []
            self._declining.add(src)
            return [Send(src, Declined((inner.event[EVENT_ID],)))]
        if self._deferred and src in self._deferred and type(msg) in _EVENTS:
            return self._undefer(src, now) + self.on_message(src, msg, now)
        match msg:
            case Confirm(ids=ids):
                for eid in ids:
                    self.custodian.release(src, eid)
                self.repair.heard.add(src)
                return self._out(self.repair.resend() if self.repair.release_due else [])
            case Declined(ids=ids):
                return self._out(self._declined(src, ids))
            case Drain(dead=dead):
                self.barrier.asked.setdefault(dead, set()).add(src)
                return self._answer_drains()
            case Drained(dead=dead):
                return self.barrier.drained(src, dead)
            case Resume():
                self._declining.discard(src)
                return [Send(src, Resumed())]
            case Resumed():
                out = self._resync(src) if src in self._resyncing else []
                if src not in self.repair.paused:
                    return out
                self.repair.paused.discard(src)
                return out + self._out(self.repair.retry_live(round=False))
            case Again(msg=again):  # (sent again: a copy of what is under way here is nothing new)
                if self.custody and self.custodian.seen(src, again.event[EVENT_ID]):
                    return self._out([])
                return self.on_message(src, again, now)
            case HandedOver():
                self._open(src, msg.event)
                if self.repair.took_from(msg.dead):
                    return self._out(self.repair.handed_over(msg))
                return self._out(self._relay(src, msg))
            case Delegated():
                self._open(src, msg.event)
                return self._out(self.shared.deliveries(src, msg, self.subs, self.router.grouped))
            case Undelegated():
                self._open(src, msg.event)
                out = self._out(self.shared.undelegated(msg, self.subs, self.router.grouped))
                return out + self._answered(src, msg.event[EVENT_ID])
            case Unshare(keys=keys):
                return self._out(self._unshared(keys))
            case LinkBeat() | LinkEcho() | LinkLatency():
                return self.express.take(src, msg, now, self.tree_neighbours())
            case Detour(via=via):
                if via:
                    return self.express.pass_on(msg)
                return self._from_router(msg.origin, cbr.Publish(msg.event), now)
            case Refused(items=items):
                return self.refuse(src, [(eid, why) for eid, why in items])
            case LinkClasses():
                return (
                    self.link_book.flood(msg, self.tree_neighbours(), src) if self.link_book.take(msg) else []
                )
            case FlowSync():
                return self._out(self.flow_side.on_flow_sync(src, msg))
            case SnapshotAsk():
                return self._out(self.flow_side.on_snapshot_ask(src, msg))
            case SnapshotRows():
                return self._out(self.flow_side.on_snapshot_rows(msg))
            case (
                cbr.Publish()
                | cbr.Subscribe()
                | cbr.Unsubscribe()
                | cbr.Advertise()
                | cbr.Unadvertise()
                | Synced()
            ):
                return self._from_router(src, msg, now)
            case _ if type(msg) in RING_MESSAGES:
                return self._out(self._sync(self.ring.on_message(src, msg, now), now))
        raise ProtocolError(f"RingBroker {self.addr}: unknown message {msg!r} from {src}")

    def _new_member_at(self, addr: int) -> bool:
        """Whether the ring knows a member at ``addr`` other than the one that was our tree
        neighbour there: a broker restarted on the address, whose subscriptions' changes are
        a new neighbour's, kept until the link is new to this end too. Taken for the former
        neighbour's, its subscriptions were dropped, and it had sent them once: a new member
        that took a dead neighbour's state over, announced it through a broker whose tree had
        not changed yet, and the events for those subscriptions were routed nowhere for 5.6 s
        (a simulator schedule of members killed as they joined: 142 deliveries lost; the
        campaign's crash-1 at f11c79d: 124)."""
        old = self._former_ids.get(addr)
        return old is not None and any(p.addr == addr and p.id != old for p in self.ring.window)

    def _dead_elsewhere(self) -> set[int]:
        """The addresses of members found dead that we never linked to, where no live member
        of our window speaks now: a subscription's home there is dead (hosting it, we
        delegated its deliveries to nobody; see the note in :meth:`_sync`)."""
        ring, known = self.ring, self.repair.known
        live = {p.addr for p in ring.window if p.id not in ring.dead}
        return {a for d, a in ring.dead_at.items() if d not in known and a not in live}

    def _relay(self, src: int, msg: HandedOver) -> list[Effect]:
        """A hand-over for a dead broker whose subscriptions we did not take over (we are not
        the one it was meant for: a broker restarted on the dead one's address, a neighbour
        that joined after the takeover): relayed, hop by hop, towards where the tables say the
        dead one's subscriptions it matches are now, under a relay id (``relay_id``: the
        relays so far) whose custody records are its own, each hop's kept in the record it
        came in. Routed on as a publish of ours, it went everywhere, came back over a link it
        had taken, was held there as a copy of itself under way, and the records waited on
        each other for good (a traced pause run; every later event of its publisher held
        behind it). A first hand-over where the tables know no such subscription is routed
        on all the same (dropped and confirmed, it was lost), unless this broker routed the
        event already (:meth:`_routed`); a relay that finds no way on (or would come round
        to a relay it passed: tables in flux) ends here."""
        event = msg.event
        eid = event[EVENT_ID]
        inner = relayed(eid)
        trail: tuple[int, ...] = eid[2] if inner is not None else ()
        toward = self.router.toward(msg.dead, event) - {src, self.addr, *trail}
        if not toward:
            if inner is not None or self.addr in trail or self._routed(eid, src):
                return []
            via = src if src in self.router.neighbours else self.addr
            return self._extra(self.router.route_batch([event], via), event, via)
        rid = relay_id(eid if inner is None else inner, (*trail, self.addr))
        key = self.custodian.step.get(eid)
        if key is not None:
            self.custodian.relays[rid] = key
            self.custodian.step[rid] = key
        return [Send(d, HandedOver({**event, EVENT_ID: rid}, msg.dead)) for d in sorted(toward)]

    def _not_again(self, effects: list[Effect]) -> list[Effect]:
        """``effects`` (the routing of events from another broker) less the sends of an event
        published here, still under way, to a neighbour our own record of it waits on: it is
        on its way there already. Sent again, a copy that had come back round went round a
        ring of brokers whose views of the tree were in flux, each one's record waiting on the
        next for good (a simulator schedule: 483 publishes never settled). The copy still goes
        where our own record did not send it: it may be what a neighbour kept for a dead
        broker, for subscriptions taken over beyond us (confirmed here without routing, they
        were lost: 18,425 deliveries in a campaign run)."""
        if not self.custody:
            return effects
        records, by_id = self.custodian.records, self.custodian.by_id
        out: list[Effect] = []
        for e in effects:
            if type(e) is Send and type(e.msg) is cbr.Publish:
                eid = e.msg.event[EVENT_ID]
                srcs = by_id.get(eid)
                if srcs and None in srcs and e.dst in records[(None, eid)].waiting:
                    continue
            out.append(e)
        return out

    def _routed(self, eid: Any, src: int) -> bool:
        """Whether this broker routed the event ``eid`` already, as it came on the tree (or
        published here), not from ``src``: a hand-over of it for a dead broker whose
        subscriptions the tables do not know is then nothing new. Routed on again as our
        own, it went back the way it had come, round to brokers it had passed, and the
        records waited on each other for good (a traced mixed run, a broker paused, found
        dead and back as a new member on its address: its neighbour across the cut handed
        it what it had kept for the old one; 155 publishes never settled, 7,334 refused)."""
        custodian = self.custodian
        if any(s != src for s in custodian.by_id.get(eid, ())):
            return True
        return any((s, eid) in custodian.done for s in (*self.router.neighbours, None) if s != src)

    def _early_before(self, src: int, events: Sequence[Mapping[str, Any]], now: float) -> list[Effect]:
        """Events kept in ``_early`` (from a broker that takes us for its tree neighbour, not
        we it) that come before ``events`` in their publishers' order, routed now as a former
        neighbour's are (see :meth:`_stale_early`), ahead of them: the sender's view of the
        tree was behind ours (a broker had joined between us), its events waited here for
        rounds while the publisher's later ones came the new way, and went first (a simulator
        schedule of two restarts: 226 out of order at two subscriptions)."""
        first: dict[str, int] = {}
        for event in events:
            publisher, seq = publish_order(event[EVENT_ID])
            if seq > first.get(publisher, -1):
                first[publisher] = seq
        out: list[Effect] = []
        for early_src in sorted(a for a in self._early if a != src):
            kept = self._early[early_src]
            due = [
                m
                for m in kept
                if type(m) is cbr.Publish
                and (order := publish_order(m.event[EVENT_ID]))[0] in first
                and order[1] < first[order[0]]
            ]
            if not due:
                continue
            self._early[early_src] = [m for m in kept if not any(m is d for d in due)]
            if not self._early[early_src]:
                del self._early[early_src]
            for m in due:
                out.extend(self._out(self._routing_message(early_src, m, now)))
        return out

    def _stale_early(self, now: float) -> list[Effect]:
        """Routing messages kept for a link new to its other end only (``_early``) whose
        sender is still no tree neighbour here ``EARLY_ROUNDS`` heartbeat rounds later: that
        link is not coming (the two ends' views of the tree differed, and have moved on). Its
        events are routed as a former neighbour's are, and confirmed to it; the rest is
        dropped. Kept, they waited for ever, and so did the sender's custody records,
        sending them again each round (a simulator run of the campaign's crash-1 schedule:
        45,154 messages kept, 1,672 publishes never settled)."""
        tree = self.tree_neighbours() | self.router.neighbours
        rounds = {a: self._early_rounds.get(a, 0) + 1 for a in self._early if a not in tree}
        stale = sorted(a for a, n in rounds.items() if n >= EARLY_ROUNDS)
        self._early_rounds = {a: n for a, n in rounds.items() if n < EARLY_ROUNDS}
        out: list[Effect] = []
        for src in stale:
            for msg in self._early.pop(src):
                if isinstance(msg, cbr.Publish):
                    out.extend(self._out(self._routing_message(src, msg, now)))
        return out

    def _from_router(self, src: int, msg: Any, now: float) -> list[Effect]:
        """A content router's message (or ``Synced``): routed if ``src`` is a tree neighbour
        (or a former one), else kept until the link is new to this end too."""
        router = self.router
        if src in router.neighbours or (
            src in router.former
            and src not in self.tree_neighbours()
            and (type(msg) is cbr.Publish or not self._new_member_at(src))  # (its events are
            # routed as the former's were, from its side; kept, one waited for its sender's
            # Again behind later ones: simulator schedules 74 and 79 of rejoin, 12 and 24)
        ):
            early = self._early and type(msg) is cbr.Publish  # (kept events that come first)
            before = self._early_before(src, [msg.event], now) if early else []
            return before + self._out(self._routing_message(src, msg, now))
        self._early.setdefault(src, []).append(msg)  # the link is new to its other end only
        return []

    @_reports
    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if isinstance(key, tuple) and key[:1] == (FLOW_GRACE,):
            buffered = self.flow_side.fold_buffered(key[1])
            return self._out(buffered) if buffered is not None else []
        if key == DERIVED_TIMER:
            derived = self.flow_side.on_derived_timer()
            return self._out(self.route_own(derived)) if derived else []
        out = self._out(self._sync(self.ring.on_timer(key, now), now))
        if key == ("ring", "heartbeat"):
            if self.custody:
                self._recent.append([])
            if self._owed:
                self._owed = {a: n + 1 for a, n in self._owed.items()}
                out += self._pay(overdue=True)
            if self._orphaned:
                self._orphaned = {a: n + 1 for a, n in self._orphaned.items()}
            if self._deferred and self.ring.serving(now):
                for src in sorted(self._deferred):
                    out += self._undefer(src, now)
            if self._early or self._early_rounds:
                out += self._stale_early(now)
            if self.custody:  # (not through _out: they are in custody already)
                beat = self.ring.heartbeat or 1.0
                self.moves.round(lambda a: self.ring.detector.quiet(a, now, limit=1.5 * beat))
                out += self._resend_stale() + self._out([])
                out += self.barrier.round(self.repair.gone_addrs()) + self._answer_drains()
            if self.express.on:  # (links measured at each round)
                out += self.express.beat_round(self.peer_addrs(), self.tree_neighbours(), now)
        return out

    def _resend_stale(self) -> list[Effect]:
        """What has waited on a live neighbour for rounds, sent to it again (a message lost
        in a broken connection, or dropped by a broker cut off for a while); what waits for a
        neighbour's replacement, sent again if the neighbour is back (see ring_repair)."""
        out: list[Effect] = []
        paused = self.repair.paused
        for dst, rec in self.custodian.stale():
            if dst in self._fenced or dst in paused:  # (found dead, nobody new there: its taker
                continue  # got them; or it declined events: kept for it until it resumes)
            msg = rec.sent.get(dst) if rec.sent else None
            out.append(Send(dst, Again(msg if msg is not None else cbr.Publish(rec.event))))
        out.extend(Send(a, Resume()) for a in sorted(paused))  # (in case one was lost)
        return out + self.repair.retry_live()

    @_reports
    def on_peer_gone(self, dst: int, now: float) -> list[Effect]:
        return self._out(self._sync(self.ring.on_peer_gone(dst, now), now))

    def _declined(self, src: int, ids: Sequence[Any]) -> list[Effect]:
        """A ring neighbour without its lease did not take these events: kept for it (sent
        again when it is back, in order) or for the broker that takes its place."""
        side = self.ring.side_of_addr(src) if self.custody and self.ring.joined else 0
        if not side:  # (no ring neighbour: it declines all we send until our Resume: a taker
            # handed what we kept for its dead one declined it for good, and the records
            # waiting on it with it; a former neighbour's events go the new way)
            return [*self._former(src, ids), Send(src, Resume())] if self.custody else []
        out: list[Effect] = []
        for eid in ids:
            for key in self.custodian.waiting_on(src, eid):
                rec = self.custodian.records[key]
                if not rec.sent or src not in rec.sent:  # (a Publish: others come Again)
                    out.extend(self.repair.keep(rec.event, src, side, key))
        if src not in self.repair.paused:  # (all else for it is kept until it resumes)
            self.repair.paused.add(src)
            out.append(Send(src, Resume()))
        return out

    def _former(self, dst: int, ids: Iterable[Any]) -> list[Effect]:
        """Events ``dst``, a ring neighbour no more (a broker joined between us), did not take
        (declined, or lost in a connection that broke): kept for its side of the ring and sent
        at once to our neighbour there, the way to it now, in each publisher's order; later
        ones wait behind them (:meth:`Repair.behind_kept`). Left to be sent again to ``dst``
        at the next rounds (``Again``), they came after the later events that had gone the
        new way, through the joiner: the campaign's pause-3 at ``c9ec30e``, 89 out of order
        at the flow's subscriptions, and simulator schedule 207 of ``starve``."""
        side = self.repair.side_of(dst) if self.ring.joined else 0
        if not side or dst in self.repair.gone_addrs():
            return []
        out: list[Effect] = []
        kept = False
        for eid in ids:
            for key in self.custodian.waiting_on(dst, eid):
                rec = self.custodian.records[key]
                if not rec.sent or dst not in rec.sent:  # (a Publish: others come Again)
                    out.extend(self.repair.keep(rec.event, dst, side, key))
                    kept = True
        return out + self.repair.resend() if kept else out

    def _undefer(self, src: int, now: float) -> list[Effect]:
        """The :class:`Delegated` and :class:`Undelegated` ``src`` sent while we had no lease,
        read now, before its next event (and at a heartbeat round with the lease back).
        Dropped, they were left to their sender's ``Again``; but a plain copy of the same
        event, taken first, was confirmed, and the confirmation (by event id) ended the
        sender's wait for them too: a home's deliveries lost for good (a traced crash run,
        a broker whose lease had lapsed: 61 acknowledged events lost to 11 subscriptions)."""
        out: list[Effect] = []
        for msg in self._deferred.pop(src, {}).values():
            out.extend(self.on_message(src, msg, now))
        return out

    def _bury(self, dead: int) -> list[Effect]:
        """What waits on the broker found dead at ``dead``: the deliveries we delegated to it
        (its clients' subscriptions that we match, :mod:`~flowbus.routing.ring_share`) are
        ours to make now, as if it had sent them back (:class:`Undelegated`), counted in
        their records; the rest is kept for its side (:meth:`Repair.bury`). Kept as events,
        they were handed over round the ring, where nobody served those subscriptions, and
        confirmed: a home restarted on the address of one taken over (so its subscriptions
        held here still named it) died with a ``Delegated`` on its way, released as gone with
        its sessions (a simulator schedule with the brokers' 1 s heartbeats: 1 delivery lost)."""
        return self._undelegate(dead) + self.repair.bury(dead)

    def _undelegate(self, dead: int) -> list[Effect]:
        """The deliveries we delegated to the home found dead at ``dead``, ours to make (see
        :meth:`_bury`)."""
        out: list[Effect] = []
        step = self.custodian.step
        for key, rec in list(self.custodian.records.items()):
            sent = rec.sent
            msg = sent.get(dead) if sent and dead in rec.waiting else None
            if sent is not None and type(msg) is Delegated:
                del sent[dead]
                rec.waiting.discard(dead)  # (done once the deliveries here are settled)
                step[key[1]] = key
                back = Undelegated(msg.subs, msg.event)
                out.extend(self.shared.undelegated(back, self.subs, self.router.grouped))
        return out

    def _answered(self, src: int, eid: Any) -> list[Effect]:
        """``src`` sent back our :class:`Delegated` of ``eid`` (:class:`Undelegated`), which it
        had from us: the deliveries are ours now (counted in the record). If that record is
        the one ``src`` sent the event in, it no longer waits on ``src``: it waited for the
        answer to our ``Delegated`` while ``src``, in custody of its ``Undelegated``, waited
        for the record's confirmation (a campaign crash run: 13 publishes that never
        settled, its publisher's acknowledgements stopped for good)."""
        key = (src, eid)
        rec = self.custodian.records.get(key) if self.custody else None
        if rec is None or src not in rec.waiting or type((rec.sent or {}).get(src)) is not Delegated:
            return []
        self.custodian.release(src, eid, only=key)
        return self.custodian.end_step()

    @_reports
    def on_link_lost(self, dst: int, now: float) -> list[Effect]:
        """Our connection to ``dst`` closed or broke (the driver's notice): what it held was
        lost without a failure notice. For a live tree neighbour, everything it has not
        confirmed is kept for it, and all else for it held, as if it had declined them,
        until it answers our ``Resume`` (then sent in each publisher's order; sent again
        one by one at the next heartbeat rounds, it came after newer events that went
        straight on the new connection)."""
        if not self.custody or not self.ring.joined or dst in self.repair.gone_addrs():
            return []
        ids = list(dict.fromkeys(key[1] for key, rec in self.custodian.records.items() if dst in rec.waiting))
        if dst not in self.router.neighbours or not self.ring.side_of_addr(dst):  # (a former one)
            return self._out(self._former(dst, ids))
        self._resyncing.add(dst)  # (what the router sent it may be lost too: see _resync)
        return self._out(self._declined(dst, ids))

    def _resync(self, dst: int) -> list[Effect]:
        """``dst`` answered our ``Resume`` after its link broke, on a connection that works:
        what we told it of our side (subscriptions, advertisements, our ``Synced``, flows,
        link classes) is sent again, lost in the broken one or not. A subscription announced
        in it and lost was never known there: the events for it went the old way, round to
        brokers that did not know it either."""
        self._resyncing.discard(dst)
        if dst not in self.router.neighbours:
            return []
        out = self.router.resend(dst)
        if dst not in self._owed:
            out.append(Send(dst, Synced()))
        out.extend(self.flow_side.welcome([dst]))
        out.extend(self.link_book.welcome({dst}))
        out.extend(self.express.book.welcome({dst}))
        return out

    def _answer_drains(self) -> list[Effect]:
        """``Drained`` to the brokers that asked, for each dead broker we keep nothing for
        any more (see ring_barrier): found dead (or never known), out of the tree (kept in it,
        what is routed its way is kept for its taker), no event kept for it, no custody
        record waiting on it."""
        asked = self.barrier.asked
        if not asked:
            return []
        repair = self.repair
        known = set(repair.known.values())
        dead = repair.dead_addrs()
        kept_for = {to for _, to, _ in repair.retry}
        waiting: set[Hashable] = set()
        for rec in self.custodian.records.values():
            waiting |= rec.waiting
        out: list[Effect] = []
        for d in sorted(asked):
            if (d in dead or d not in known) and d not in kept_for | waiting | self.router.neighbours:
                out.extend(Send(a, Drained(d)) for a in sorted(asked.pop(d)))
        return out

    @_reports
    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """A failed send (a routing message too) is a failure clue for the ring; the ring's
        repair then changes the tree, and the routers re-send what the new links need. An
        event is kept for the broker that takes the dead one's place (and delivered at once
        to its subscriptions if we took them over already)."""
        out: list[Effect] = []
        if isinstance(msg, cbr.Publish | HandedOver) and self.ring.joined:
            eid = msg.event.get(EVENT_ID)  # (kept for dst's side, by its id if the ring moved on)
            keys: list[Key | None] = list(self.custodian.waiting_on(dst, eid)) if self.custody else []
            out.extend(self.repair.failed(msg.event, dst, keys or [None]))
        elif isinstance(msg, Detour):
            out.extend(self.express.failed(msg))
        elif isinstance(msg, Undelegated) and self.custody:  # (gone: so are its sessions)
            for key in self.custodian.waiting_on(dst, msg.event.get(EVENT_ID)):
                self.custodian.release(dst, key[1], only=key)
        # (a Delegated that failed waits on its home: sent again at the custody's rounds if the
        # home lives, delivered here once it is found dead, _bury)
        return self._out(out + self._sync(self.ring.on_send_failed(dst, msg, now), now))

    def _routing_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        """A content router's message from a tree neighbour (or a former one: its
        subscriptions' changes are dropped, but an event it sent before the tree changed
        under it is routed as if it came from the neighbour now on its side: dropped, and
        confirmed, it was lost beyond this broker, a join racing a stream of events)."""
        if isinstance(msg, Synced):
            self._syncing.discard(src)
            return self.router.synced(src) + self._pay()
        if isinstance(msg, cbr.Publish):
            self._open(src, msg.event)
            self.ring.routed(now)  # (the ring's load: events routed a second)
            if src not in self.router.neighbours:
                via = self._side_now(src)
                return self._extra(self.router.route_batch([msg.event], via), msg.event, via)
        if self.custody and isinstance(msg, cbr.Subscribe) and src in self.router.neighbours:
            old = self.router.directions(msg.origin) - {src, self.addr}
            if old and self.ring.side_of_addr(src):  # (the route moves: what goes to src waits
                self.moves.moved(src, old)  # for what went the old way, kept for its side)
        routed = self.router.on_message(src, msg, now)  # (removed for good: dropped there)
        if isinstance(msg, cbr.Publish) and src in self.router.neighbours:
            return self._not_again(self._extra(routed, msg.event, src))
        return routed

    def _pay(self, *, overdue: bool = False) -> list[Effect]:
        """``Synced`` to each new neighbour whose table is whole here: every other new
        neighbour synced us (or, ``overdue``, it waited ``OWED_ROUNDS`` heartbeat rounds: the
        ends of a tree being changed may wait on each other for a moment; flooding ends)."""
        due = [
            a
            for a, rounds in self._owed.items()
            if not (self._syncing - {a}) or (overdue and rounds >= OWED_ROUNDS)
        ]
        for a in due:
            del self._owed[a]
        return [Send(a, Synced()) for a in sorted(due)]

    def _side_now(self, former: int) -> int:
        """The tree neighbour now on the side a former tree neighbour was, or this broker if
        that side has none (the event then goes every way it matches)."""
        side = self.repair.side_by_id(former)
        near = self.ring.left if side < 0 else self.ring.right if side > 0 else None
        return near.addr if near is not None and near.addr in self.tree_neighbours() else self.addr

    def _extra(self, effects: list[Effect], event: Mapping[str, Any], src: int) -> list[Effect]:
        """An event also goes where the tree's tables may not know of its subscribers yet:
        a dead neighbour's orphans (across the cut), new neighbours not yet synced."""
        out = self.repair.route_orphans(effects, event)
        if self._syncing:
            sent = {e.dst for e in out if isinstance(e, Send) and isinstance(e.msg, cbr.Publish)}
            for m in sorted(self._syncing - sent - {src}):
                if m in self.router.neighbours:
                    out.append(Send(m, cbr.Publish(event)))
        return out

    def _out(self, effects: list[Effect]) -> list[Effect]:
        """Deliveries de-duplicated, each (subscription, event) once: a kept event re-sent
        after a repair may meet one that went round (the subscriptions of the last
        ``DEDUP_EVENTS`` events delivered are remembered). With custody, what this step
        handed on is recorded against the events' custody records (a count of the local
        deliveries), and the confirmations that are due go out."""
        if self.flows.parts or self.flows.subs:
            effects = self.flow_side.effects(effects)
        if self.shared.hosted:
            effects = self.shared.redirect(effects)
        if self._placeholders:
            effects = list(effects)  # (kept events' deliveries are appended while it is read)
        out: list[Effect] = []
        custodian, repair, barrier, moves = self.custodian, self.repair, self.barrier, self.moves
        step = custodian.step
        delivered, custody, local_ack = self._delivered, custodian.records, self.local_ack
        for e in effects:
            if type(e) is DeliverAll:  # (the hot path: an event's ~20 local deliveries)
                eid = e.event[EVENT_ID]
                subs = e.subs
                seen = delivered.get(eid)
                if seen is None:
                    delivered[eid] = subs
                    if len(delivered) > DEDUP_EVENTS:
                        delivered.popitem(last=False)
                else:
                    subs = tuple([s for s in subs if s not in seen])
                    if not subs:
                        continue
                    _remember(delivered, eid, seen, subs)
                    e = DeliverAll(subs, e.event)
                held = step.get(eid)
                rec = custody.get(held) if held is not None else None
                if rec is not None:
                    rec.local += len(subs)
                if self._count_cost:
                    self._cost(subs)
                if barrier:  # (a takeover's deliveries wait for what was kept: counted already)
                    kept = barrier.hold(subs, e.event)
                    if kept is not subs:
                        if not kept:
                            continue
                        e = DeliverAll(kept, e.event)
            elif type(e) is Deliver:
                event = e.event
                if (event.__class__ is not dict and not isinstance(event, Mapping)) or EVENT_ID not in event:
                    out.append(e)
                    continue
                eid = event[EVENT_ID]
                seen = delivered.get(eid)
                if seen is None:
                    delivered[eid] = {e.sub}
                    if len(delivered) > DEDUP_EVENTS:
                        delivered.popitem(last=False)
                elif e.sub in seen:
                    continue
                else:
                    _remember(delivered, eid, seen, (e.sub,))
                if local_ack:
                    held = step.get(eid)
                    rec = custody.get(held) if held is not None else None
                    if rec is not None:
                        rec.local += 1
                    if barrier and not barrier.hold((e.sub,), event):
                        continue
                else:
                    e = Deliver(e.sub, {k: v for k, v in e.event.items() if k != EVENT_ID})
            elif isinstance(e, Send) and type(e.msg) in _IN_CUSTODY:
                dead = (
                    e.dst
                    if self._placeholders and e.dst in self._placeholders
                    else self._heir(e.dst, e.msg.event)
                    if self._inherited and type(e.msg) is cbr.Publish
                    else None
                )
                if dead is not None and type(e.msg) is cbr.Publish:
                    ev = e.msg.event  # (a dead neighbour not replaced yet: kept for its replacement;
                    # routed to its replacement by what came from it alone: kept for it too, for
                    # its taker, see _heir)
                    key = step.get(ev[EVENT_ID]) if step else None
                    side = repair.side_of(e.dst)
                    if dead != e.dst:
                        repair.wait_for_taker(dead)
                    taken = repair.keep(ev, dead, side, key)
                    if taken and (self.flows.parts or self.flows.subs):  # (a partition taken over
                        # folds them, a flow subscription's edge transforms them: read here after
                        # the flow side, they went to the driver as they were, which serves no
                        # partition: never settled, the publishes never acknowledged, the folds
                        # short of them; a simulator schedule with the brokers' clocks: 26)
                        taken = self.flow_side.effects(taken)
                    effects.extend(taken)
                    continue  # (the deliveries it makes, to what was taken over, come next)
                if ((repair.paused and e.dst in repair.paused) or (moves and e.dst in moves)) and type(
                    e.msg
                ) is cbr.Publish:  # (it declined events: kept until it resumes;
                    repair.hold(e.msg.event, e.dst)  # a route's new way: until the old is confirmed)
                    continue
                if repair.retry and type(e.msg) is cbr.Publish and repair.behind_kept(e.dst, e.msg.event):
                    continue
                if step:
                    key = step.get(e.msg.event[EVENT_ID])
                    custodian.hold(key, e.dst)
                    if type(e.msg) is not cbr.Publish:
                        custodian.note(key, e.dst, e.msg)
            out.append(e)
        if moves and moves.due():
            out.extend(repair.resend())
        out.extend(custodian.end_step())
        return self.express.route(out, SPACE) if self.express.on else out

    def _heir(self, dst: int, event: Mapping[str, Any]) -> int | None:
        """The dead broker whose place ``dst`` took in our tables, if ``event`` goes to ``dst``
        by what came from the dead one (make before break, :meth:`ContentRouter.set_neighbours
        <flowbus.routing.cbr.ContentRouter.set_neighbours>`) and still comes from there only:
        ``dst`` never had those subscriptions and confirms the event having delivered it to
        none, while their taker, elsewhere in the tree, has not announced them here yet (a
        simulator schedule: 24 deliveries confirmed and lost in the second before its
        announcement came round). Such an event is kept for the dead one too, for its taker."""
        entry = self._inherited.get(dst)
        if entry is None or self.repair.resending(event, dst):  # (kept already: going now)
            return None
        dead, came, since = entry
        if self.custodian.round - since > HEIR_ROUNDS:
            del self._inherited[dst]
            return None
        router = self.router
        table = router.received_from(dst)
        came &= table.keys()  # (withdrawn or replaced: gone)
        came -= {o for o in came if router.directions(o) - {dst} or router.announced(dst, o)}  # (their
        # taker's word came, or ``dst`` is their taker)
        if not came:
            del self._inherited[dst]
            return None
        return dead if any(table[o].matches(event) for o in came) else None

    def _open(self, src: int | None, event: Mapping[str, Any]) -> None:
        """This step routes ``event`` (from ``src``; None: published here), in custody if on
        (and remembered for a while: :meth:`_replay`)."""
        if self.custody:
            self.custodian.open(src, event)
            self._recent[-1].append(event)

    def _replay(self, taken: Sequence[tuple[Hashable, Filter]]) -> list[Effect]:
        """The events routed here in the last ``REPLAY_ROUNDS`` heartbeat rounds, delivered
        again to the subscriptions ``taken`` over now from a dead broker that they match (in
        each publisher's order, held by the takeover's barrier with the kept ones; those the
        clients had are dropped by id, here, in the store, in the client). Those this broker
        routed before it served them were owed to them and kept by nobody when the brokers
        on their way to them died too: two adjacent brokers at an end of the tree die at
        once, the far one is taken over across the cut by a broker whose own publishes of
        the moment went towards the near one; the near one's taker, which knew nothing of
        the far one's subscriptions, delivered them to its own only (a simulator run: 5-19
        acknowledged events lost of each of the far one's subscriptions). One matcher pass
        over the remembered events for all of them."""
        seen: dict[Any, Mapping[str, Any]] = {}
        for events in self._recent:
            for e in events:
                eid = e[EVENT_ID]
                if relayed(eid) is None:
                    seen.setdefault(eid, e)
        if not seen or not taken:
            return []
        owed = sorted(seen.values(), key=lambda e: publish_order(e[EVENT_ID]))
        matcher = Matcher(workers=1)
        slow: list[tuple[Hashable, Any]] = []  # (the filters the matcher does not take)
        for i, (sub, filt) in enumerate(taken):
            try:
                matcher.add(i, filt)
            except (FilterError, SubscriptionError):
                slow.append((sub, compiled(filt)))
        hits: list[Any] = matcher.match_batch(owed) if len(matcher) else [()] * len(owed)
        out: list[Effect] = []
        for event, ids in zip(owed, hits, strict=True):
            out.extend(Deliver(taken[int(i)][0], event) for i in ids)
            out.extend(Deliver(sub, event) for sub, matches in slow if matches(event))
        return out

    def _cost(self, subs: Iterable[Hashable]) -> None:
        """Deliveries to our own subscriptions, counted per state entry (a load share moves
        the busiest first)."""
        self.ring.loads.meter.by_key.update(sub_key(s, self.addr) for s in subs)

    # -- secure spaces: link classes ring-wide, refusals upstream (routing/link_classes.py)

    @_reports
    def announce_links(self, version: int, links: tuple[tuple[int, bool], ...]) -> list[Effect]:
        """The driver's view of this broker's tree links (``(neighbour, secure)``), as of
        ``version`` (growing), to every broker of the tree."""
        msg = LinkClasses(self.addr, version, links)
        return self.link_book.flood(msg, self.tree_neighbours(), None) if self.link_book.take(msg) else []

    @_reports
    def refuse(self, dst: int, items: Sequence[tuple[Any, str]]) -> list[Effect]:
        """Broker ``dst`` is done with these events (``(event id, reason)``) without carrying
        them on: the driver did not send them to it (a secure space's events on a plain
        link), or ``dst`` answered :class:`Refused`. Their publishes are refused upstream."""
        if self.custody:
            self.custodian.refuse(dst, items)
        return self._out([])

    # -- subscriptions shared under load (routing/ring_share.py)

    def _movable(self, key: Hashable) -> bool:
        """Whether a load share may pass the state entry ``key`` on (own plain subscriptions)."""
        return self.shared.movable(key, self.subs, self.flows.subs, self.flows.parts, self._adopted)

    def _unshared(self, keys: Iterable[Hashable]) -> list[Effect]:
        """A home's :class:`Unshare`: its entries held here go, and their routing."""
        out: list[Effect] = []
        for key in keys:
            if key in self.ring.state:
                out.extend(self.ring.del_state(key))
                out.extend(self._drop_adopted(record(key).sub))  # type: ignore[attr-defined]
        return out

    def _drop_adopted(self, sub: Hashable) -> list[Effect]:
        """Stop serving the adopted subscription ``sub`` (passed on, or unshared)."""
        origin = self._adopted.pop(sub, None)
        out = self.router.drop(origin) if origin and self.addr in self.router.directions(origin) else []
        self.subs.discard(sub)
        self.shared.hosted.pop(sub, None)
        self.shared.refused.discard(sub)
        self.repair.forget(sub)
        self.barrier.forget(sub)
        return out

    # -- keeping the router in step with the ring

    def _sync(self, effects: list[Effect], now: float | None = None) -> list[Effect]:
        """After a ring step (at ``now``): take up taken-over subscriptions, follow the tree's
        changes, send on what was kept (see :meth:`Repair.resend`)."""
        out = list(effects)
        self.flow_side.backups_confirmed()
        ring, repair = self.ring, self.repair
        fresh_dead = [repair.known.get(d) for d in ring.taken_over[self._takeovers :]]
        self._takeovers = len(ring.taken_over)
        if self.custody:  # (what the dead had not confirmed is kept before its subscriptions are
            # taken up here: they then get it in each publisher's order, first; so is what waits
            # on a dead tree neighbour, once: it may have stood in for one taken over now, and
            # kept in the tree, what is routed its way is kept: the older ones go first, not on
            # their failed sends' notices, later)
            # (by ring id: a member found dead at an address where one died before was not
            # buried, and what was routed its way meanwhile went to its taker ahead of what
            # waited on it: simulator schedule 141 of starve, 64 out of order)
            neighbours = self.router.neighbours
            gone = {d for d in ring.dead if repair.known.get(d) in neighbours}
            fresh = {a for a in fresh_dead if a is not None}
            for a in sorted(fresh | {repair.known[d] for d in gone - self._buried}):
                out.extend(self._bury(a))
            self._buried = gone
            # (and what waits on a broker found dead now that is no tree neighbour any more:
            # the tree moved on while it lived, then it died; its address may speak for a new
            # member already, which never had those events: a rolling restart in the
            # simulator, the records waited on the address for good, 173 publishes unsettled)
            fresh_ids = ring.dead - self._dead_seen
            newly = {repair.known[d] for d in fresh_ids if d in repair.known}
            self._dead_seen = set(ring.dead)
            repair.found_dead(newly)
            for a in sorted(newly - fresh - self.router.neighbours):
                out.extend(self._bury(a))
            # (a member we never linked to, found dead: the home of subscriptions we hold may
            # have been there, a new member on a dead home's address that died as it joined;
            # what we delegated to it comes back here now. Left waiting on the address, it came
            # when a broker spoke there again, 6 s later, after later events: a simulator
            # schedule of members killed as they joined, 138 out of order)
            unknown = {ring.dead_at[d] for d in fresh_ids if d not in repair.known and d in ring.dead_at}
            for a in sorted(unknown):
                out.extend(self._undelegate(a))
        signature = (ring.backups.foreign, len(ring.taken_over), len(ring.dead))  # (own set_state: no scan)
        changed = signature != self._state_seen  # (scanning the state costs O(subscriptions))
        self._state_seen = signature
        # (an adopted subscription stays in every direction it came from, a dead neighbour kept in
        # the tree as a live one: it may cover subscriptions beyond that were never sent here;
        # taken out, nothing was routed their way until the neighbour sent them, a live one once
        # it learns where the subscription is now: it withdraws the entry then, with them)
        keep = set(self.router.neighbours) if changed else set()
        behind: dict[int, list[Hashable]] = {}  # fresh dead -> the subs taken over from it now
        replay: list[tuple[Hashable, Filter]] = []  # (see _replay)
        for key, text in list(ring.state.items()) if changed else ():
            if isinstance(key, SubKey) and key.sub not in self.subs:
                sub = key.sub
                self.subs.add(sub)
                filt = parse(text[0] if isinstance(text, tuple) else text)
                self._adopted[sub] = origin_of(key)
                out.extend(self.router.adopt(origin_of(key), filt, keep=keep))
                out.extend(self.flow_side.adopted(sub))
                out.extend(repair.taken_over(sub, filt, fresh_dead))
                if self.custody and sub not in self.flows.parts:
                    replay.append((sub, filt))
                for a in {a for a in fresh_dead if a is not None}:
                    behind.setdefault(a, []).append(sub)
        if replay and any(a is not None for a in fresh_dead):
            out.extend(self._replay(replay))
        if behind and self.custody and ring.joined:  # (their deliveries wait for what was kept)
            live = [p.addr for p in ring.links() if p.id not in ring.dead and p.addr != self.addr]
            for a, subs in sorted(behind.items()):
                out.extend(self.barrier.open(a, subs, live))
        held = {k.sub for k in ring.keys_where(SUB, lambda _: True)} if changed else set()  # type: ignore[attr-defined]
        for sub in sorted(set(self._adopted) - held, key=repr) if changed else ():  # passed on (sharing)
            out.extend(self._drop_adopted(sub))
        if changed or ring.shares.placed:
            gone = repair.dead_addrs() | self._dead_elsewhere()
            flows = self.flows.subs.keys() | self.flows.parts.keys()
            out.extend(
                self.shared.after_step(ring, self.router, self._adopted, gone, changed=changed, flows=flows)
            )
        if ring.joined:
            repair.known.update((p.id, p.addr) for p in ring.links())
        if repair.paused:  # (one no longer a neighbour: what is kept for it goes to who took its side)
            repair.paused &= {p.addr for p in (ring.left, ring.right) if p is not None}
        if ring.dead:
            self._fence(ring, repair.known)
        wanted = self.tree_neighbours()
        self._placeholders = self._gaps(ring, repair)
        wanted |= self._placeholders
        out.extend(self._renewed(ring, wanted))
        if wanted != set(self.router.neighbours):
            added = wanted - set(self.router.neighbours)
            handover = repair.handover(wanted)
            repair.keep_orphans(wanted, handover)
            if self.custody:
                dead_addrs = repair.dead_addrs()
                for a, h in handover.items():
                    came = set(self.router.received_from(a)) if a in dead_addrs else set()
                    if came:
                        self._inherited[h] = (a, came, self.custodian.round)
                for a in sorted(self.router.neighbours - wanted):
                    if a in dead_addrs:
                        out.extend(self._bury(a))
                    elif side := repair.side_of(a):  # (a broker joined between us: what goes the
                        for b in self._between(a, side, added):  # new way waits for what went to
                            self.moves.moved(b, (a,), join=True)  # it, see ring_moves)
            out.extend(self.router.set_neighbours(wanted, handover=handover))
            self._syncing &= wanted
            self._inherited = {h: a for h, a in self._inherited.items() if h in wanted}
            self._owed = {a: n for a, n in self._owed.items() if a in wanted}
            out.extend(self._welcome(added))
            for src in sorted(added):
                for msg in self._early.pop(src, []):
                    out.extend(self._routing_message(src, msg, 0.0))
        repair.drop_orphans()  # (adopted and routed by now)
        return out + repair.resend(now)

    def _between(self, old: int, side: int, added: set[int]) -> list[int]:
        """The new tree neighbours on ``side`` that joined between us and ``old``, a live member
        of our window still (not one that took the place of ``old`` gone silent beyond it: a
        cut neighbour's events would wait on it for the whole partition, publishes refused at
        their timeout; a campaign mixed run, 1,165 refused and 7,973 out of order)."""
        ring = self.ring
        me = ring.me.id
        live = {p.addr: p.id for p in ring.window if p.id not in ring.dead}
        if old not in live:
            return []
        far = cw(me, live[old]) if side > 0 else cw(live[old], me)
        out: list[int] = []
        for p in ring.window:
            if p.addr in added and ring.side_of_addr(p.addr) == side:
                near = cw(me, p.id) if side > 0 else cw(p.id, me)
                if near < far:
                    out.append(p.addr)
        return sorted(out)

    def _renewed(self, ring: RingNode, wanted: set[int]) -> list[Effect]:
        """A tree neighbour's address now speaks for another broker (one restarted on it, a new
        member): a new neighbour to sync (the same address hid the change, and the new broker
        never got the subscriptions of this side), whose predecessor's part of the tables
        stays until it synced us (:meth:`ContentRouter.renew <flowbus.routing.cbr.ContentRouter.renew>`)."""
        ids = {p.addr: p.id for p in (ring.left, ring.right) if p is not None and p.addr in wanted}
        renewed = {a for a, i in ids.items() if self._tree_ids.get(a, i) != i and a in self.router.neighbours}
        for a in wanted - ids.keys():  # (a dead one kept until replaced: its id, not a new one's)
            if a in self._tree_ids:
                ids[a] = self._tree_ids[a]
        self._former_ids.update((a, i) for a, i in self._tree_ids.items() if a not in ids)
        self._tree_ids = ids
        if not renewed:
            return []
        out: list[Effect] = []
        for a in sorted(renewed):  # (make before break: see ContentRouter.renew)
            out.extend(self.router.renew(a))
        return out + self._welcome(renewed)

    def _welcome(self, added: set[int]) -> list[Effect]:
        """New tree neighbours (or a new broker on a neighbour's address): synced both ways
        (flooded until their ``Synced``, ours owed), told our flows and link classes."""
        self._syncing |= added
        self._owed.update(dict.fromkeys(added, 0))
        out = list(self.flow_side.welcome(sorted(added)))
        out.extend(self.link_book.welcome(added))
        out.extend(self.express.book.welcome(added))
        return out + self._pay()

    def _gaps(self, ring: RingNode, repair: Repair) -> set[int]:
        """Dead tree neighbours kept in the tree (make before break; what is routed their way
        meanwhile is kept, :meth:`_out`):

        * on a side of the ring not refilled yet, until their replacement comes (what they led
          to is then handed to it). Taken out at once, their part of the tables went with
          them: events for the brokers beyond were routed nowhere;
        * whose side was refilled across the tree's cut (they were at an end of the tree),
          while subscriptions that came from them come from nowhere else yet
          (:meth:`Repair.keep_orphans`), at most ``OWED_ROUNDS`` heartbeat rounds: their
          taker serves them across the cut, and what is kept for them is handed to it over
          the ring link. Taken out at once, their withdrawal went up the tree ahead of the
          taker's own announcement, and an event on its way there met a broker that knew
          them nowhere: dropped, and confirmed. So, as long, is one that never synced us:
          what it led to is unknown here (it died as we joined next to it), and the events
          flooded its way (all of them) are kept for its taker; taken out, those on their
          way here were routed by tables that never had its subscriptions (a simulator
          schedule: 54 events of each of two subscriptions confirmed, never delivered).
        """
        dead = repair.dead_addrs() & self.router.neighbours
        if not dead:
            self._orphaned = {}
            return set()
        out = {a for a in dead if ring.side_of_addr(a) in ring.open} if ring.open else set()
        tree = self.tree_neighbours()
        for a in sorted(dead - out):
            side = repair.side_of(a)
            near = ring.right if side > 0 else ring.left if side < 0 else None
            if near is None or near.addr in tree or self._orphaned.get(a, 0) >= OWED_ROUNDS:
                continue
            router = self.router
            if a in self._syncing or any(not (router.directions(o) - {a}) for o in router.received_from(a)):
                out.add(a)
                self._orphaned.setdefault(a, 0)
        self._orphaned = {a: n for a, n in self._orphaned.items() if a in dead}
        return out

    def _fence(self, ring: RingNode, known: Mapping[int, int]) -> None:
        """The addresses of brokers found dead (not those a live member speaks from now: a
        broker restarted on its address joins anew), when the dead or the window changed:
        nothing is sent to them again. What a broker found dead still sends (a paused one,
        before it hears ``Dead``) needs no fence: its confirmations release nothing (what
        waited on it was kept for its taker when it was buried), its events are routed as
        any former neighbour's, and it acknowledges no publish without its lease."""
        live = tuple(p.addr for p in ring.links()) if ring.joined else ()
        sig = (len(ring.dead), live)
        if sig == self._fence_sig:
            return
        self._fence_sig = sig
        self._fenced = {known[d]: Peer(d, known[d]) for d in ring.dead if d in known and known[d] not in live}


_HANDOVER = frozenset({Backlog, BacklogAck, WhereIs, HeldHere})

_IN_CUSTODY = frozenset({cbr.Publish, HandedOver, Delegated, Undelegated})
"""The messages whose sends are recorded against their events' custody records."""

_EVENTS = frozenset({*_IN_CUSTODY, Again})
"""The messages that carry an event in custody (not taken without the ring's lease)."""


def _remember(delivered: OrderedDict[Any, Any], eid: Any, seen: Any, subs: tuple[Hashable, ...]) -> None:
    """``subs`` got event ``eid`` too (it had gone to ``seen``: a tuple, or a set to add to)."""
    if type(seen) is set:
        seen.update(subs)
    else:
        delivered[eid] = {*seen, *subs}
