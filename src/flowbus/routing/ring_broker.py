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
* **Subscriptions are state.** ``subscribe`` files ``("sub", id) -> filter text`` in the
  ring node's state, so it is backed up on the ring neighbours. When a broker takes over a
  dead one's state, the subscriptions in it are subscribed here: their events are delivered
  by the broker that took over (a client would re-attach to it).
* Each subscription id is global (say ``(client, n)``): ``Deliver(sub_id, event)``.

* **Events sent into a failure.** An event whose send to a tree neighbour fails (the
  driver's failure notice) is kept, with the side of the ring it was going to; later
  events for that side wait behind it, so each publisher's order holds.
  - When the ring has a new neighbour on that side, the event goes there. That broker is
    the first one of the part of the tree the dead broker led to, so nothing there had the
    event yet.
  - When this broker takes the dead one's subscriptions over itself, the kept events are
    delivered to them.
  So one crash loses no event, as long as its subscriptions were backed up and the
  failure is detected (heartbeats or failed sends).

* **Custody** (``custody=True``, what the broker network runs). A broker keeps every event
  it has sent on until the receiver confirms it (``Confirm``), and a receiver confirms only
  when its own part is done: every neighbour it sent the event on has confirmed, and, with
  ``local_ack=True``, every local subscription it delivered to has been settled by the
  driver (:meth:`RingBroker.settle`, called when the subscriber's client acknowledged it or
  it was queued on disk; the record counts the deliveries not settled yet). When a neighbour
  dies, every event it had not confirmed goes the way of a failed send (above): so the
  events a dead broker held in transit, or had not yet handed to its clients, are not lost,
  and two adjacent crashes lose nothing the ring's repair reaches. An event published here
  and confirmed by all is *settled*: its id is listed in :attr:`RingBroker.settled` (the
  driver acknowledges the publisher).
  Delivery stays at least once across a crash; each broker drops the duplicates it can see
  (the ``DEDUP_WINDOW``), the client library the rest, by event id.
* **Secure spaces** (:mod:`flowbus.routing.link_classes`). Each broker announces the class
  of its tree links to the whole tree (``announce_links``); an event its driver would not
  send over a plain link is released as *refused* (:meth:`RingBroker.refuse`), and a record
  with a refusal answers ``Refused`` upstream instead of ``Confirm``: the publisher's broker
  lists the publish in :attr:`RingBroker.refused`, not ``settled``.

What is not done here: a link failure whose broker is alive (the tree keeps the link; its
events wait until the link is back).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Core, Deliver, DeliverAll, Effect, Send, SetTimer
from flowbus.errors import ProtocolError, UserError
from flowbus.filters import Filter, parse
from flowbus.flow.deploy import SPACE, Deployment, FlowSubscription
from flowbus.overlay.chordal_ring import MESSAGES as RING_MESSAGES
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.class_router import LinkBeat, LinkEcho
from flowbus.routing import cbr
from flowbus.routing.express import Detour, ExpressRoutes, LinkLatency
from flowbus.routing.flows import (
    PARTITION,
    SEEN,
    DeployRecord,
    Flows,
    FlowSync,
    Partition,
    SnapshotAsk,
    SnapshotRows,
)
from flowbus.routing.link_classes import LinkBook, LinkClasses, Refused
from flowbus.routing.memo import compiled
from flowbus.routing.ring_share import Delegated, SharedSubs, Unshare

__all__ = ["Confirm", "HandedOver", "RingBroker", "Synced"]


def _publish_order(eid: Any) -> tuple[str, int]:
    """An event id's place in its publisher's order (``(publisher, sequence number)``)."""
    if isinstance(eid, tuple) and len(eid) == 2 and isinstance(eid[1], int):
        return (repr(eid[0]), eid[1])
    return (repr(eid), 0)


def origin_of(key: Hashable) -> tuple[int, Hashable]:
    """The routing origin of a subscription's state key ``("sub", sub_id, home broker)``."""
    assert isinstance(key, tuple)
    return (key[2], key[1])


FLOW_GRACE = "flows.grace"
"""The timer key (with a partition's id) that ends a taken-over partition's grace period."""
DERIVED = ("flows.derived",)
"""The timer that routes the events the folds derived, unless a publish here took them
along first (see :meth:`RingBroker._flow_effects`)."""
DERIVED_WAIT = 0.005
"""How long derived events wait at most for a publish to share its matcher pass (seconds):
longer than a paced publisher's gap between frames (a few ms at 5,000 events/s), so a step
costs one pass, not two; the timer is set once for all the events that wait."""
DERIVED_NOW = 128
"""As many derived events as this are routed in the step that made them (a busy broker's big
steps: a second matcher pass costs little there, and they do not wait a step behind)."""

DEDUP_WINDOW = 100_000
"""How many recent (subscription, event id) deliveries a broker remembers (IRBR's)."""

DEDUP_EVENTS = 50_000
"""How many recent events a ring broker remembers the local deliveries of."""

EVENT_ID = "__flowbus_event_id"
"""The field an event carries between brokers: (publishing broker, sequence number)."""


@wire.message("ringbroker.handed_over")
@dataclass(frozen=True, slots=True)
class HandedOver:
    """An event that a broker could not send to the dead broker ``dead``, handed to the ring
    neighbour that took its place across the tree's cut."""

    event: Mapping[str, Any]
    dead: int


@wire.message("ringbroker.synced")
@dataclass(frozen=True, slots=True)
class Synced:
    """The sender has sent the receiver, a new tree neighbour, every subscription it has
    for it: until this arrives, the receiver sends the sender every event (see the note)."""


@wire.message("ringbroker.confirm")
@dataclass(frozen=True, slots=True)
class Confirm:
    """The sender is done with these events the receiver sent it (custody, see the note)."""

    ids: tuple[Any, ...]


class _Custody:
    """An event this broker is responsible for until everyone it handed it to is done."""

    __slots__ = ("event", "local", "refused", "retries", "src", "waiting")

    def __init__(self, event: Mapping[str, Any], src: int | None) -> None:
        self.event = event
        self.src = src  # the broker it came from; None: published here
        self.waiting: set[Hashable] = set()  # neighbour addrs it was handed to
        self.local = 0  # deliveries to subscriptions here not settled by the driver yet
        self.retries = 0  # kept for the broker that takes a dead one's place
        self.refused: str | None = None  # why a broker further on did not carry it (secure spaces)


_Key = tuple[int | None, Any]
"""A custody record's key: (the broker the event came from or None, the event id)."""


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
        self._custody: dict[_Key, _Custody] = {}  # (src, event id) -> record
        self._step: dict[Any, _Key] = {}  # event id -> its record, for the step under way
        self._confirms: dict[int, list[Any]] = {}  # confirmations due, per upstream broker
        self._by_id: dict[Any, set[int | None]] = {}  # event id -> the srcs of its records
        self.settled: list[Any] = []  # ids of events published here that everyone is done with
        self.refused: list[tuple[Any, str]] = []  # (id, reason) of those refused on the way instead
        self._refusals: dict[int, list[tuple[Any, str]]] = {}  # refusals due, per upstream broker
        # the classes of every broker's tree links (link_classes.py)
        self.link_book: LinkBook[LinkClasses] = LinkBook()
        self.shared = SharedSubs(addr)  # subscriptions shared under load (ring_share.py)
        self.express = express if express is not None else ExpressRoutes(addr)  # (express.py; off)
        self._count_cost = share_subs  # deliveries counted per subscription (the busiest move first)
        if share_subs:
            ring["movable"] = self._movable
        self.ring = RingNode(addr, backup=backup, heartbeat=heartbeat, **ring)
        self.router = cbr.ContentRouter(addr, (), advertising=advertising, grouped=grouped)
        self.subs: set[Hashable] = set()  # subscriptions served here (own and taken over)
        self._early: dict[int, list[Any]] = {}  # routing messages from not-yet neighbours
        self._syncing: set[int] = set()  # new tree neighbours whose Synced has not come
        self._retry: list[tuple[Mapping[str, Any], int, int]] = []  # (event, dead addr, ring side)
        self._retry_for: list[_Key | None] = []  # the custody record of each
        self._known: dict[int, int] = {}  # ring id -> address of the brokers we have linked to
        self._takeovers = 0  # how many of the ring node's takeovers we have taken up
        self._orphans: dict[int, dict[Any, Filter]] = {}  # dead addr -> its subs, across the cut
        self._orphan_side: dict[int, int] = {}
        self._adopted: dict[Hashable, tuple[int, Hashable]] = {}  # taken-over sub -> its origin
        self._seq = 0
        self._delivered: OrderedDict[Any, Any] = OrderedDict()  # event id -> its subs (tuple, set)
        self._taken_from: dict[Hashable, tuple[Filter, set[int]]] = {}  # sub -> (filter, dead addrs)
        self._taken_by_dead: dict[int, list[tuple[Hashable, Any]]] | None = None  # (see _taken)
        self._state_seen: tuple[int, int, int] = (-1, -1, -1)  # the ring state _sync last read
        self.flows = Flows()  # the deployed flows (routing/flows.py)
        # how long a taken-over partition gathers events before folding them in order
        self.flow_grace = 2.0 * heartbeat if heartbeat is not None else 5.0
        self._aliases: dict[Any, Any] = {}  # the id of a 2nd, 3rd... delivery of one event -> the event's
        self._backed_up: list[tuple[int, _Key]] = []  # (backup version, custody record) of folds
        self._derived: list[dict[str, Any]] = []  # derived events waiting to be routed (DERIVED)
        self._derived_due = False  # (the DERIVED timer is set)

    @property
    def addr(self) -> int:
        return self.ring.addr

    @property
    def joined(self) -> bool:
        return self.ring.joined

    @property
    def node_id(self) -> int:
        return self.ring.me.id

    def peer_addrs(self) -> list[int]:
        """The live brokers this one links to (the window and chords)."""
        if not self.ring.joined:
            return []
        return [p.addr for p in self.ring.links() if p.id not in self.ring.dead]

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

    def start(self) -> list[Effect]:
        return self._sync(self.ring.start())

    def join(self, candidates: Sequence[int]) -> list[Effect]:
        return self.ring.join(candidates)

    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]:
        """Serve ``filt`` here as ``sub_id``; ``meta`` (what the driver needs to serve it
        elsewhere after a takeover) is backed up with it."""
        if sub_id in self.subs:
            raise ProtocolError(f"broker {self.addr}: subscription {sub_id!r} exists already")
        self.subs.add(sub_id)
        out = self.router.subscribe(sub_id, filt)
        value = filt.to_text() if meta is None else (filt.to_text(), meta)
        return out + self.ring.set_state(("sub", sub_id, self.addr), value)

    def meta_of(self, sub_id: Hashable) -> Any:
        """The ``meta`` a subscription served here was made with (None if none)."""
        for key, value in self.ring.state.items():
            if isinstance(key, tuple) and key[:2] == ("sub", sub_id):
                return value[1] if isinstance(value, tuple) else None
        return None

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.subs:
            raise ProtocolError(f"broker {self.addr}: no subscription {sub_id!r}")
        self.subs.discard(sub_id)
        if sub_id in self.shared.out:  # (held by a neighbour: it drops it)
            return self.shared.unshare(sub_id)
        key = next((k for k in self.ring.state if isinstance(k, tuple) and k[:2] == ("sub", sub_id)), None)
        if key is None:  # (in a share not acknowledged yet: out of it, and the receiver drops it)
            key = ("sub", sub_id, self.addr)
            to = self.ring.shares.withdraw(key)
            return self.router.drop(origin_of(key)) + ([Send(to, Unshare((key,)))] if to is not None else [])
        self._taken_from.pop(sub_id, None)
        self._taken_by_dead = None
        out = self.router.drop(origin_of(key)) + self.ring.del_state(key)
        if self.flows.subs.pop(sub_id, None) is not None:
            self.flows.waiting.pop(sub_id, None)
            out += self.ring.del_state(("fsub", sub_id))
        self.flows.parts.pop(sub_id, None)
        return out

    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]:
        """Publishers here will publish events matching ``filt`` (``advertising`` on): only
        subscriptions that may match an advertisement are forwarded towards it."""
        return self._out(self.router.advertise(adv_id, filt))

    def unadvertise(self, adv_id: Hashable) -> list[Effect]:
        return self._out(self.router.unadvertise(adv_id))

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
            self._stamp(stamped)
        self._open(None, stamped)
        return self._out(self._extra(self.router.publish(stamped), stamped, self.addr))

    def publish_batch(self, items: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[Effect]:
        """Route many ``(event id, event)`` pairs at once: the effects of publishing them
        one by one, in order, with one pass of the matcher (while the tree is being
        repaired, one event at a time)."""
        stamped = [{**event, EVENT_ID: eid} for eid, event in items]
        if self.flows.records:
            for event in stamped:
                self._stamp(event)
            if self._derived:  # (what earlier folds derived goes first, in the same pass;
                stamped[:0], self._derived = self._derived, []  # the timer is set again for
                self._derived_due = False  # what this step's folds derive: it replaces the old)
        return self._out(self._route_own(stamped))

    def _route_own(self, events: list[dict[str, Any]]) -> list[Effect]:
        """Route events published here (in custody), in one matcher pass when the tree is whole."""
        for event in events:
            self._open(None, event)
        if not self._orphans and not self._syncing:
            return self.router.route_batch(events, self.addr)
        out: list[Effect] = []
        for event in events:
            out.extend(self._extra(self.router.route_batch([event], self.addr), event, self.addr))
        return out

    def settle(self, sub_id: Hashable, event_id: Hashable) -> list[Effect]:
        """The driver is done with the delivery of ``event_id`` to ``sub_id`` (its client
        acknowledged it, or it was queued on disk): part of custody with ``local_ack``."""
        return self.settle_many([(event_id, 1)])

    def settle_many(self, counts: Iterable[tuple[Hashable, int]]) -> list[Effect]:
        """:meth:`settle` in one step for ``(event id, n)``: ``n`` of its local deliveries."""
        aliases, by_id, custody = self._aliases, self._by_id, self._custody
        for event_id, n in counts:
            if aliases and event_id in aliases:
                aliases.pop(event_id)  # (the event's first delivery settles it)
                continue
            srcs = by_id.get(event_id)
            if not srcs:
                continue
            for src in (next(iter(srcs)),) if len(srcs) == 1 else list(srcs):
                rec = custody[(src, event_id)]
                took = min(n, rec.local)
                if took:
                    rec.local -= took
                    n -= took
                    if not rec.local:
                        self._maybe_done((src, event_id))  # (may change srcs: iterated on a copy)
                if not n:
                    break
        return self._out([])

    def in_custody(self) -> int:
        """How many events this broker holds until others are done with them."""
        return len(self._custody)

    # -- flows (routing/flows.py)

    def deploy(
        self, d: Deployment, *, nonce: int = 0, taken: Iterable[str] = ()
    ) -> tuple[DeployRecord, list[Effect]]:
        """Deploy ``d`` on the network from here: its record (the one deployed already if
        this version is) and the effects. A :class:`~flowbus.errors.UserError` if its name is
        taken by another version, or a space (``taken`` too) or function by another flow."""
        existing = self.flows.check_new(d, taken)
        if existing is not None:
            return existing, []
        if not self.ring.joined:
            raise UserError(f"broker {self.addr} has not joined the ring yet: deploy again in a moment")
        owners = {self.node_id} | {p.id for p in self.ring.links() if p.id not in self.ring.dead}
        rec = DeployRecord(d.name, d.version, d.text, tuple(sorted(owners)), (self.node_id, nonce))
        return rec, self._out(self._take_records((rec,), (), fresh=True, src=None))

    def restore_flow(self, rec: DeployRecord) -> list[Effect]:
        """A flow this broker had deployed before a restart (its store keeps them): known
        again, with no partitions made (those it had were taken over)."""
        return self._out(self._take_records((rec,), (), fresh=False, src=None))

    def undeploy(self, name: str) -> list[Effect]:
        """Withdraw flow ``name`` from the network (a UserError if none is deployed)."""
        rec = self.flows.records.get(name)
        if rec is None:
            known = ", ".join(sorted(self.flows.records)) or "none"
            raise UserError(f"no flow {name!r} is deployed (deployed: {known})")
        return self._out(self._take_records((), (rec.deploy_id,), fresh=False, src=None))

    def subscribe_flow(
        self, sub_id: Hashable, space: str, filter_text: str = "", *, meta: Any = None
    ) -> list[Effect]:
        """Subscribe ``sub_id`` to ``space`` of a deployed flow with ``filter_text`` over its
        schema: the network routes the pulled-back filter, this broker applies the edge
        transforms (a UserError naming the space or field if it cannot be)."""
        sub = self.flows.plan(space, filter_text)
        out = self.subscribe(sub_id, sub.routing, meta=meta)
        self.flows.subs[sub_id] = sub
        out += self.ring.set_state(("fsub", sub_id), (space, filter_text))
        return self._out(out + self._ask_snapshot(sub_id, sub))

    def _ask_snapshot(self, sub_id: Hashable, sub: FlowSubscription) -> list[Effect]:
        ask = self.flows.snapshot_ask(sub_id, sub, self.addr)
        if ask is None:
            return []
        return self._on_snapshot_ask(None, ask)

    def _stamp(self, event: dict[str, Any]) -> None:
        d = self.flows.flow_of_space(event.get(SPACE, ""))
        if d is not None:
            d.stamp(event)

    def _take_records(
        self,
        deployed: Sequence[DeployRecord],
        withdrawn: Sequence[tuple[int, int]],
        *,
        fresh: bool,
        src: int | None,
    ) -> list[Effect]:
        """Records and withdrawals (local, or a FlowSync from ``src``): what is new here is
        installed or torn down, and flooded on to the other tree neighbours."""
        flows = self.flows
        out: list[Effect] = []
        news: list[DeployRecord] = []
        gone: list[tuple[int, int]] = []
        for did in withdrawn:
            if did in flows.withdrawn:
                continue
            flows.withdrawn.add(did)
            gone.append(did)
            for rec in [r for r in flows.records.values() if r.deploy_id == did]:
                out += self._tear_down(rec)
        for rec in deployed:
            installed, old = flows.install(rec)
            if not installed:
                continue
            news.append(rec)
            if old is not None:
                out += self._tear_down(old, removed=True)
            if fresh and self.ring.joined:
                for sub_id, _, filt in flows.partitions_to_make(rec, self.node_id):
                    if sub_id not in self.subs:
                        out += self.subscribe(sub_id, filt)
                        flows.serve_partition(sub_id)
        if news or gone:
            msg = FlowSync(tuple(news), tuple(gone), fresh)
            out += [Send(n, msg) for n in sorted(self.tree_neighbours()) if n != src]
        return out

    def _tear_down(self, rec: DeployRecord, *, removed: bool = False) -> list[Effect]:
        """Forget ``rec``: its partitions and subscriptions here end, its rows go."""
        out: list[Effect] = []
        if not removed:
            self.flows.remove(rec)
        for sub_id, part in list(self.flows.parts.items()):
            if part.sub_id[1] == rec.name and part.sub_id[2] == rec.deploy_id and sub_id in self.subs:
                out += self.unsubscribe(sub_id)
        for sub_id, sub in list(self.flows.subs.items()):
            if sub.flow == rec.name and sub_id in self.subs:
                out += self.unsubscribe(sub_id)
                self.flows.ended.append(sub_id)
        for key in [
            k for k in self.ring.state if isinstance(k, tuple) and k[:3] == ("frow", rec.name, rec.deploy_id)
        ]:
            out += self.ring.del_state(key)
        return out

    def _on_flow_sync(self, src: int, msg: FlowSync) -> list[Effect]:
        return self._take_records(msg.deployed, msg.withdrawn, fresh=msg.fresh, src=src)

    def _on_snapshot_ask(self, src: int | None, msg: SnapshotAsk) -> list[Effect]:
        """Forwarded on the tree; answered for the partitions served here."""
        out: list[Effect] = [Send(n, msg) for n in sorted(self.tree_neighbours()) if n != src]
        for rows in self.flows.snapshot_rows(msg, self.ring.state):
            if msg.reply_to == self.addr:
                out += self._on_snapshot_rows(rows)
            else:
                out.append(Send(msg.reply_to, rows))
        return out

    def _on_snapshot_rows(self, msg: SnapshotRows) -> list[Effect]:
        """A partition's rows for a subscription here: what it is to get now, as bus events
        (the edge transforms them in :meth:`_flow_effects`)."""
        return [Deliver(msg.sub, event) for event in self.flows.snapshot_in(msg)]

    def _flow_adopted(self, sub_id: Hashable) -> list[Effect]:
        """A subscription taken over: a partition is served here, and what its folds
        published is published again (ids de-duplicate it); a flow subscription gets its edge."""
        state = self.ring.state
        part = self.flows.serve_partition(sub_id)
        if part is not None:
            again: list[dict[str, Any]] = []
            for key, value in list(state.items()):
                if isinstance(key, tuple) and key[:2] == ("fseen", sub_id):
                    part.seen.append(key[2])
                    again.extend({**ev, EVENT_ID: eid} for eid, ev in self.flows.outputs_of(part, value))
            for event in again:
                self._stamp(event)
            part.buffer = []
            grace = SetTimer(self.flow_grace, (FLOW_GRACE, sub_id))
            return [grace, *self._route_own(again)] if again else [grace]
        spec = state.get(("fsub", sub_id))
        if spec is not None and sub_id not in self.flows.subs:
            try:
                self.flows.subs[sub_id] = self.flows.plan(*spec)
            except UserError:  # (its flow is gone)
                return []
        return []

    def _flow_effects(self, effects: list[Effect]) -> list[Effect]:
        """Deliveries to partitions folded (what they publish routed, the fold backed up
        before anything else of this step is relied on), to flow subscriptions transformed."""
        parts, subs = self.flows.parts, self.flows.subs
        out: list[Effect] = []
        grouped = self.router.grouped
        results: dict[int, dict[Any, Any]] = {}  # id(event) -> its paths' results (see _edge)
        publish: list[dict[str, Any]] = []
        folded: list[_Key] = []  # the custody records of the events folded
        for e in effects:
            if type(e) is DeliverAll:
                if parts.keys().isdisjoint(e.subs) and subs.keys().isdisjoint(e.subs):
                    out.append(e)
                else:
                    self._flow_deliver_all(e, out, publish, folded, results)
                continue
            if type(e) is Deliver:
                part = parts.get(e.sub)
                if part is not None:
                    self._fold_into(part, e.sub, e.event, out, publish, folded, results)
                    continue
                sub = subs.get(e.sub)
                if sub is not None:
                    edge = self._edge(e.sub, sub, e.event, results.setdefault(id(e.event), {}))
                    if grouped and len(edge) == 1 and out and _same_event(out[-1], edge[0]):
                        out[-1] = _joined(out[-1], edge[0])  # (one result shared: one effect)
                    else:
                        out.extend(edge)
                    continue
            out.append(e)
        if folded:  # the folds' backup goes before what they publish; the events they
            out.extend(self.ring.flush_backups())  # folded are confirmed upstream once
            version = self.ring.backups.version  # the holders have that backup
            for key in folded:
                self._hold(key, ("backup", version))
                self._backed_up.append((version, key))
        if publish:  # (routed with the next publish here, or after DERIVED_WAIT: one
            self._derived.extend(publish)  # matcher pass instead of two for a step of few events)
            if len(self._derived) >= DERIVED_NOW:  # (a big step: a pass of their own costs
                derived, self._derived = self._derived, []  # little, and they leave with it)
                out.extend(self._flow_effects(self._route_own(derived)))
            elif not self._derived_due:
                self._derived_due = True
                out.append(SetTimer(DERIVED_WAIT, DERIVED))
        return out

    def _flow_deliver_all(
        self,
        e: DeliverAll,
        out: list[Effect],
        publish: list[dict[str, Any]],
        folded: list[_Key],
        results: dict[int, dict[Any, Any]],
    ) -> None:
        """An event's local deliveries, some to a flow's partitions or subscriptions: the
        others as they are; the subscriptions that share the space's one result (see
        :meth:`~flowbus.flow.deploy.FlowSubscription.shares`) in one ``DeliverAll`` of it, the
        transforms run once; the rest one by one (:meth:`_edge`)."""
        parts, subs, flows = self.flows.parts, self.flows.subs, self.flows
        event = e.event
        got = results.setdefault(id(event), {})
        waits = bool(flows.waiting) and PARTITION in event  # (see Flows.admit: a derived event)
        rest: list[Hashable] = []
        shared: dict[str, list[Hashable]] = {}
        edges: list[Effect] = []
        for sub_id in e.subs:
            sub = subs.get(sub_id)
            if sub is None:
                part = parts.get(sub_id)
                if part is None:
                    rest.append(sub_id)
                else:
                    self._fold_into(part, sub_id, event, edges, publish, folded, results)
            elif not sub.shares(event):
                edges.extend(self._edge(sub_id, sub, event, got))
            elif not waits or flows.admit(sub_id, event):
                same = shared.get(sub.space)
                if same is None:
                    shared[sub.space] = [sub_id]
                else:
                    same.append(sub_id)
        if rest:
            out.append(DeliverAll(tuple(rest), event) if len(rest) < len(e.subs) else e)
        for ids in shared.values():
            result = self._shared_result(subs[ids[0]], event, got)
            if result is not None:
                out.append(DeliverAll(tuple(ids), result))
        out.extend(edges)

    def _fold_into(
        self,
        part: Partition,
        sub_id: Hashable,
        event: Mapping[str, Any],
        out: list[Effect],
        publish: list[dict[str, Any]],
        folded: list[_Key],
        results: dict[int, dict[Any, Any]],
    ) -> None:
        """A delivery to partition ``part``: folded (or buffered, if taken over a moment ago)."""
        key = self._step.get(event.get(EVENT_ID))
        if part.buffer is not None:  # (taken over a moment ago: see _flow_adopted)
            part.buffer.append((event, key))
            self._hold(key, (FLOW_GRACE, sub_id))
            return
        done, events = self._fold(part, event, results.setdefault(id(event), {}))
        out.extend(done)
        publish.extend(events)
        if key is not None:
            folded.append(key)

    def _backups_confirmed(self) -> None:
        """The events whose folds every backup holder now has are done with here."""
        waits = self._backed_up
        if not waits:
            return
        confirmed = self.ring.backups.confirmed()
        i = 0
        while i < len(waits) and waits[i][0] <= confirmed:
            version, key = waits[i]
            self._release(("backup", version), key[1], only=key)
            i += 1
        del waits[:i]

    def _fold_buffered(self, sub_id: Hashable) -> list[Effect]:
        """A taken-over partition's grace period is over: what came meanwhile is folded in
        each publisher's order (the events the dead owner had not folded come round again
        from its upstream, maybe after newer ones), then it folds as events come."""
        part = self.flows.parts.get(sub_id)
        if part is None or part.buffer is None:
            return []
        buffered, part.buffer = part.buffer, None
        buffered.sort(key=lambda item: _publish_order(item[0].get(EVENT_ID)))
        for event, key in buffered:
            if key is not None:
                self._step[event[EVENT_ID]] = key
                self._release((FLOW_GRACE, sub_id), key[1], only=key)
        return self._out([Deliver(sub_id, event) for event, _ in buffered])

    def _fold(
        self, part: Partition, event: Mapping[str, Any], results: dict[Any, Any] | None = None
    ) -> tuple[list[Effect], list[dict[str, Any]]]:
        eid = event.get(EVENT_ID)
        state = self.ring.state
        if ("fseen", part.sub_id, eid) in state:
            return [], []
        changed, published = self.flows.fold(part, eid, event, state, results)
        out: list[Effect] = []
        for key, value in changed.items():
            out += self.ring.set_state(key, value)
        part.seen.append(eid)
        while len(part.seen) > SEEN:
            out += self.ring.del_state(("fseen", part.sub_id, part.seen.popleft()))
        events = []
        for eid2, ev in published:
            ev[EVENT_ID] = eid2
            self._stamp(ev)
            events.append(ev)
        return out, events

    def _edge(
        self, sub_id: Hashable, sub: FlowSubscription, event: Mapping[str, Any], results: dict[Any, Any]
    ) -> list[Effect]:
        """``event`` for flow subscription ``sub_id``: the subscription's transforms applied
        (``results``: what the paths gave for this event, and per space what every routed
        subscription to it gets: shared by the event's subscriptions)."""
        if self.flows.waiting and not self.flows.admit(sub_id, event):
            return []
        eid = event.get(EVENT_ID)
        if sub.shares(event):  # (what every routed subscription to the space gets: made once)
            got = self._shared_result(sub, event, results)
            return [] if got is None else [Deliver(sub_id, got)]
        out: list[Effect] = []
        for i, result in enumerate(sub.deliver(event, results)):
            if i:  # (a copy: the first result is shared by every subscription it goes to)
                alias = (f"{eid[0]}#{i}", eid[1]) if isinstance(eid, tuple) and len(eid) == 2 else (eid, i)
                self._aliases[alias] = eid
                result = {**result, EVENT_ID: alias}
            else:
                result[EVENT_ID] = eid
            out.append(Deliver(sub_id, result))
        return out

    @staticmethod
    def _shared_result(sub: FlowSubscription, event: Mapping[str, Any], results: dict[Any, Any]) -> Any:
        """What every subscription to ``sub``'s space that shares it gets of ``event``
        (None: nothing), made once per event and space (kept in ``results``)."""
        got = results.get(sub.space, results)
        if got is results:
            found = sub.deliver(event, results)
            got = results[sub.space] = found[0] if found else None
            if got is not None:
                got[EVENT_ID] = event.get(EVENT_ID)
        return got

    # -- the driver's entry points

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
        for event in events:
            self._open(src, event)
        if not self._orphans and not self._syncing:
            return self._out(self.router.route_batch(events, src))
        out: list[Effect] = []
        for event in events:
            out.extend(self._extra(self.router.route_batch([event], src), event, src))
        return self._out(out)

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        self.ring.heard_from(src, now)  # (a busy broker is alive: the ring's tests ask)
        match msg:
            case Confirm(ids=ids):
                for eid in ids:
                    self._release(src, eid)
                return self._out([])
            case HandedOver():
                self._open(src, msg.event)
                return self._out(self._on_handed_over(msg))
            case Delegated():
                self._open(src, msg.event)
                return self._out(self.shared.deliveries(msg, self.subs, self.router.grouped))
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
                return self._out(self._on_flow_sync(src, msg))
            case SnapshotAsk():
                return self._out(self._on_snapshot_ask(src, msg))
            case SnapshotRows():
                return self._out(self._on_snapshot_rows(msg))
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
                return self._out(self._sync(self.ring.on_message(src, msg, now)))
        raise ProtocolError(f"RingBroker {self.addr}: unknown message {msg!r} from {src}")

    def _from_router(self, src: int, msg: Any, now: float) -> list[Effect]:
        """A content router's message (or ``Synced``): routed if ``src`` is a tree neighbour
        (or a former one), else kept until the link is new to this end too."""
        router = self.router
        if src in router.neighbours or (src in router.former and src not in self.tree_neighbours()):
            return self._out(self._routing_message(src, msg, now))
        self._early.setdefault(src, []).append(msg)  # the link is new to its other end only
        return []

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if isinstance(key, tuple) and key[:1] == (FLOW_GRACE,):
            return self._fold_buffered(key[1])
        if key == DERIVED:
            self._derived_due = False
            derived, self._derived = self._derived, []
            return self._out(self._route_own(derived)) if derived else []
        out = self._out(self._sync(self.ring.on_timer(key, now)))
        if key == ("ring", "heartbeat") and self.express.on:  # (links measured at each round)
            out += self.express.beat_round(self.peer_addrs(), self.tree_neighbours(), now)
        return out

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """A failed send (a routing message too) is a failure clue for the ring; the ring's
        repair then changes the tree, and the routers re-send what the new links need. An
        event is kept for the broker that takes the dead one's place (and delivered at once
        to its subscriptions if we took them over already)."""
        out: list[Effect] = []
        if isinstance(msg, cbr.Publish | HandedOver) and self.ring.joined:
            side = self.ring.side_of_addr(dst)  # (the ring may be repaired already)
            eid = msg.event.get(EVENT_ID)
            keys: list[_Key | None] = list(self._waiting_on(dst, eid)) if self.custody else []
            if side:
                for key in keys or [None]:
                    out.extend(self._keep(msg.event, dst, side, key))
            else:
                for key in keys:
                    if key is not None:
                        self._release(dst, eid, only=key)
        elif isinstance(msg, Detour):
            out.extend(self.express.failed(msg))
        elif isinstance(msg, Delegated) and self.custody:  # (its home is gone: so are its sessions)
            for key in self._waiting_on(dst, msg.event.get(EVENT_ID)):
                self._release(dst, key[1], only=key)
        return self._out(out + self._sync(self.ring.on_send_failed(dst, msg, now)))

    def _routing_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        """A content router's message from a tree neighbour (or a former one: dropped)."""
        if isinstance(msg, Synced):
            self._syncing.discard(src)
            return []
        if isinstance(msg, cbr.Publish):
            self._open(src, msg.event)  # (from a former neighbour: dropped, confirmed)
            self.ring.routed(now)  # (the ring's load: events routed a second)
        routed = self.router.on_message(src, msg, now)  # (removed for good: dropped there)
        if isinstance(msg, cbr.Publish) and src in self.router.neighbours:
            return self._extra(routed, msg.event, src)
        return routed

    def _extra(self, effects: list[Effect], event: Mapping[str, Any], src: int) -> list[Effect]:
        """An event also goes where the tree's tables may not know of its subscribers yet:
        a dead neighbour's orphans (across the cut), new neighbours not yet synced."""
        out = self._route_orphans(effects, event)
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
            effects = self._flow_effects(effects)
        if self.shared.hosted:
            effects = self.shared.redirect(effects)
        out: list[Effect] = []
        step = self._step
        delivered, custody, local_ack = self._delivered, self._custody, self.local_ack
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
                else:
                    e = Deliver(e.sub, {k: v for k, v in e.event.items() if k != EVENT_ID})
            elif isinstance(e, Send) and isinstance(e.msg, cbr.Publish | HandedOver | Delegated):
                if self._retry and type(e.msg) is cbr.Publish and self._behind_kept(e.dst, e.msg.event):
                    continue
                if step:
                    self._hold(step.get(e.msg.event[EVENT_ID]), e.dst)
            out.append(e)
        if step:
            self._step = {}
            for key in step.values():
                self._maybe_done(key)
        if self._confirms:
            out.extend(Send(dst, Confirm(tuple(ids))) for dst, ids in sorted(self._confirms.items()))
            self._confirms = {}
        if self._refusals:
            out.extend(Send(dst, Refused(tuple(items))) for dst, items in sorted(self._refusals.items()))
            self._refusals = {}
        return self.express.route(out, SPACE) if self.express.on else out

    def _cost(self, subs: Iterable[Hashable]) -> None:
        """Deliveries to our own subscriptions, counted per state entry (a load share moves
        the busiest first)."""
        self.ring.loads.meter.by_key.update(("sub", s, self.addr) for s in subs)

    # -- custody

    def _open(self, src: int | None, event: Mapping[str, Any]) -> None:
        """This step routes ``event`` (from ``src``; None: published here) in custody."""
        if self.custody:
            eid = event[EVENT_ID]
            key = (src, eid)
            if key not in self._custody:
                self._custody[key] = _Custody(event, src)
                self._by_id.setdefault(eid, set()).add(src)
            self._step[eid] = key

    def _hold(self, key: _Key | None, party: Hashable) -> None:
        rec = self._custody.get(key) if key is not None else None
        if rec is not None:
            rec.waiting.add(party)

    def _waiting_on(self, party: Hashable, eid: Any) -> list[_Key]:
        keys = [(s, eid) for s in self._by_id.get(eid, ())]
        return [k for k in keys if party in self._custody[k].waiting]

    def _release(self, party: Hashable, eid: Any, *, only: _Key | None = None) -> None:
        if only is not None:
            keys: Iterable[_Key] = (only,)
        else:
            srcs = self._by_id.get(eid)
            if not srcs:
                return
            keys = [(s, eid) for s in srcs]
        custody = self._custody
        for key in keys:
            rec = custody.get(key)
            if rec is not None and (only is not None or party in rec.waiting):
                rec.waiting.discard(party)
                self._maybe_done(key)

    def _maybe_done(self, key: _Key) -> None:
        rec = self._custody.get(key)
        if rec is None or rec.waiting or rec.local or rec.retries:
            return
        del self._custody[key]
        src, eid = key
        srcs = self._by_id[eid]
        srcs.discard(src)
        if not srcs:
            del self._by_id[eid]
        if rec.refused is not None:
            if src is None:
                self.refused.append((eid, rec.refused))
            else:
                self._refusals.setdefault(src, []).append((eid, rec.refused))
        elif src is None:
            self.settled.append(eid)
        else:
            self._confirms.setdefault(src, []).append(eid)

    def _keep(self, event: Mapping[str, Any], dead: int, side: int, key: _Key | None) -> list[Effect]:
        """``event`` could not go to ``dead``: keep it for the broker that takes its place,
        and deliver it now to the subscriptions we took over from ``dead`` already."""
        self._retry.append((event, dead, side))
        self._retry_for.append(key)
        rec = self._custody.get(key) if key is not None else None
        if rec is not None and key is not None:
            rec.waiting.discard(dead)
            rec.retries += 1
            self._step[event[EVENT_ID]] = key
        return self._on_handed_over(HandedOver(event, dead))

    def _behind_kept(self, dst: int, event: Mapping[str, Any]) -> bool:
        """Events kept for the side of the ring ``dst`` is on go first: ``event`` waits behind
        them (so each publisher's order holds across a repair). Whether it was kept."""
        side = self.ring.side_of_addr(dst)
        dead = next((d for _, d, s in self._retry if s == side), None) if side else None
        if dead is None:
            return False
        key = self._step.get(event[EVENT_ID])
        self._retry.append((event, dead, side))
        self._retry_for.append(key)
        rec = self._custody.get(key) if key is not None else None
        if rec is not None:
            rec.retries += 1
        return True

    def _bury_custody(self, dead: int) -> list[Effect]:
        """A tree neighbour died: what it had not confirmed is kept, as if its send failed."""
        side = self.ring.side_of_addr(dead)
        out: list[Effect] = []
        for key, rec in list(self._custody.items()):
            if dead in rec.waiting:
                if side:
                    out.extend(self._keep(rec.event, dead, side, key))
                else:
                    self._release(dead, key[1], only=key)
        return out

    # -- secure spaces: link classes ring-wide, refusals upstream (routing/link_classes.py)

    def announce_links(self, version: int, links: tuple[tuple[int, bool], ...]) -> list[Effect]:
        """The driver's view of this broker's tree links (``(neighbour, secure)``), as of
        ``version`` (growing), to every broker of the tree."""
        msg = LinkClasses(self.addr, version, links)
        return self.link_book.flood(msg, self.tree_neighbours(), None) if self.link_book.take(msg) else []

    def refuse(self, dst: int, items: Sequence[tuple[Any, str]]) -> list[Effect]:
        """Broker ``dst`` is done with these events (``(event id, reason)``) without carrying
        them on: the driver did not send them to it (a secure space's events on a plain
        link), or ``dst`` answered :class:`Refused`. Their publishes are refused upstream."""
        for eid, why in items:
            for key in self._waiting_on(dst, eid) if self.custody else ():
                self._custody[key].refused = why
                self._release(dst, eid, only=key)
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
                out.extend(self._drop_adopted(key[1]))  # type: ignore[index]
        return out

    def _drop_adopted(self, sub: Hashable) -> list[Effect]:
        """Stop serving the adopted subscription ``sub`` (passed on, or unshared)."""
        origin = self._adopted.pop(sub, None)
        out = self.router.drop(origin) if origin and self.addr in self.router.directions(origin) else []
        self.subs.discard(sub)
        self.shared.hosted.pop(sub, None)
        self._taken_from.pop(sub, None)
        self._taken_by_dead = None
        return out

    # -- keeping the router in step with the ring

    def _sync(self, effects: list[Effect]) -> list[Effect]:
        """After a ring step: take up taken-over subscriptions, follow the tree's changes."""
        out = list(effects)
        self._backups_confirmed()
        ring = self.ring
        fresh_dead = [self._known.get(d) for d in ring.taken_over[self._takeovers :]]
        self._takeovers = len(ring.taken_over)
        signature = (ring.backups.foreign, len(ring.taken_over), len(ring.dead))  # (own set_state: no scan)
        changed = signature != self._state_seen  # (scanning the state costs O(subscriptions))
        self._state_seen = signature
        for key, text in list(ring.state.items()) if changed else ():
            if isinstance(key, tuple) and key[:1] == ("sub",) and key[1] not in self.subs:
                self.subs.add(key[1])
                filt = parse(text[0] if isinstance(text, tuple) else text)
                self._taken_from[key[1]] = (filt, {a for a in fresh_dead if a is not None})
                self._taken_by_dead = None
                self._adopted[key[1]] = origin_of(key)
                out.extend(self.router.adopt(origin_of(key), filt))
                out.extend(self._flow_adopted(key[1]))
                matches = compiled(filt)
                for (e, d, _), rkey in zip(self._retry, self._retry_for, strict=True):
                    if d in fresh_dead and matches(e):
                        out.append(Deliver(key[1], e))
                        if rkey is not None:
                            self._step[e[EVENT_ID]] = rkey
        held = {k[1] for k in ring.state if isinstance(k, tuple) and k[:1] == ("sub",)} if changed else set()
        for sub in sorted(set(self._adopted) - held, key=repr) if changed else ():  # passed on (sharing)
            out.extend(self._drop_adopted(sub))
        if changed or ring.shares.placed:
            gone = {self._known[d] for d in ring.dead if d in self._known}
            out.extend(self.shared.after_step(ring, self.router, self._adopted, gone, changed=changed))
        if ring.joined:
            self._known.update((p.id, p.addr) for p in ring.links())
        wanted = self.tree_neighbours()
        if wanted != set(self.router.neighbours):
            added = wanted - set(self.router.neighbours)
            handover = self._handover(wanted)
            self._keep_orphans(wanted, handover)
            if self.custody:
                dead_addrs = {self._known[d] for d in ring.dead if d in self._known}
                for a in sorted(self.router.neighbours - wanted):
                    if a in dead_addrs:
                        out.extend(self._bury_custody(a))
            out.extend(self.router.set_neighbours(wanted, handover=handover))
            self._syncing = (self._syncing & wanted) | added
            if self.flows.records or self.flows.withdrawn:
                sync = FlowSync(
                    tuple(self.flows.records.values()), tuple(sorted(self.flows.withdrawn)), False
                )
                out.extend(Send(a, sync) for a in sorted(added))
            out.extend(self.link_book.welcome(added))
            out.extend(self.express.book.welcome(added))
            out.extend(Send(a, Synced()) for a in sorted(added))
            for src in sorted(added):
                for msg in self._early.pop(src, []):
                    out.extend(self._routing_message(src, msg, 0.0))
        for dead, orphans in list(self._orphans.items()):  # adopted and routed by now: drop
            for o in [o for o in orphans if self.router.directions(o) - {dead}]:
                del orphans[o]
            if not orphans:
                del self._orphans[dead]
        return out + self._resend()

    def _keep_orphans(self, wanted: set[int], handover: Mapping[int, int]) -> None:
        """A dead tree neighbour with no replacement (the tree's cut moved onto it): what
        came from it was its own subscriptions, taken over across the cut. Until they come
        back through the tree, events for them are handed over the ring link."""
        dead_addrs = {self._known[d] for d in self.ring.dead if d in self._known}
        for a in self.router.neighbours - wanted - set(handover):
            if a in dead_addrs:
                side = self.ring.side_of_addr(a)
                orphans = self.router.received_from(a)
                if side and orphans:
                    self._orphans[a] = orphans
                    self._orphan_side[a] = side

    def _route_orphans(self, effects: list[Effect], event: Mapping[str, Any] | None) -> list[Effect]:
        if event is None or not self._orphans:
            return effects
        out = list(effects)
        for dead, orphans in self._orphans.items():
            side = self._orphan_side[dead]
            now = self.ring.right if side > 0 else self.ring.left
            if now is not None and now.addr != dead and any(f.matches(event) for f in orphans.values()):
                out.append(Send(now.addr, HandedOver(event, dead)))
        return out

    def _handover(self, wanted: set[int]) -> dict[int, int]:
        """A dead tree neighbour's place goes to our new neighbour on the same side."""
        out: dict[int, int] = {}
        dead_addrs = {self._known[d] for d in self.ring.dead if d in self._known}
        gone = [a for a in self.router.neighbours if a not in wanted and a in dead_addrs]
        for a in gone:
            for side in (1, -1):
                now = self.ring.right if side > 0 else self.ring.left
                fresh = now is not None and now.addr in wanted and now.addr not in self.router.neighbours
                if fresh and now is not None and self.ring.side_of_addr(a) == side:
                    out[a] = now.addr
        return out

    def _resend(self) -> list[Effect]:
        """Kept events go to the new neighbour on their side, once the ring has one, in
        each publisher's order (they were kept in the order their sends failed or their
        receiver was found dead, which is not it)."""
        if not self._retry or not self.ring.joined:
            return []
        out: list[Effect] = []
        keep, keep_for = [], []
        kept = sorted(
            zip(self._retry, self._retry_for, strict=True), key=lambda k: _publish_order(k[0][0][EVENT_ID])
        )
        for (event, dead, side), key in kept:
            now = self.ring.right if side > 0 else self.ring.left
            if now is None or now.addr == dead or self.ring.open & {side}:
                keep.append((event, dead, side))
                keep_for.append(key)
                continue
            if now.addr in self.router.neighbours:
                out.append(Send(now.addr, cbr.Publish(event)))
            else:  # across the tree's cut: only the dead broker's own subscriptions are there
                out.append(Send(now.addr, HandedOver(event, dead)))
            rec = self._custody.get(key) if key is not None else None
            if rec is not None and key is not None:
                rec.retries -= 1
                self._step[event[EVENT_ID]] = key
        self._retry, self._retry_for = keep, keep_for
        return out

    def _on_handed_over(self, msg: HandedOver) -> list[Effect]:
        """An event that was going to a dead broker: deliver it to the subscriptions we took
        over from that broker (the tree did not reach it, nobody else serves them)."""
        return [
            Deliver(sub, msg.event) for sub, matches in self._taken().get(msg.dead, ()) if matches(msg.event)
        ]

    def _taken(self) -> dict[int, list[tuple[Hashable, Any]]]:
        """Dead broker -> the subscriptions taken over from it, in order, with their
        compiled filters (built again only after ``_taken_from`` changed)."""
        if self._taken_by_dead is None:
            index: dict[int, list[tuple[Hashable, Any]]] = {}
            for sub, (filt, dead) in sorted(self._taken_from.items(), key=lambda kv: repr(kv[0])):
                for d in dead:
                    index.setdefault(d, []).append((sub, compiled(filt)))
            self._taken_by_dead = index
        return self._taken_by_dead


def _remember(delivered: OrderedDict[Any, Any], eid: Any, seen: Any, subs: tuple[Hashable, ...]) -> None:
    """``subs`` got event ``eid`` too (it had gone to ``seen``: a tuple, or a set to add to)."""
    if type(seen) is set:
        seen.update(subs)
    else:
        delivered[eid] = {*seen, *subs}


def _same_event(a: Effect, b: Effect) -> bool:
    """Whether ``a`` and ``b`` deliver the same event object (``b`` a ``Deliver``)."""
    return type(b) is Deliver and type(a) in (Deliver, DeliverAll) and a.event is b.event  # type: ignore[union-attr]


def _joined(a: Effect, b: Effect) -> DeliverAll:
    """``a`` (a ``Deliver`` or ``DeliverAll``) and the ``Deliver`` ``b`` of the same event, as one."""
    assert isinstance(a, Deliver | DeliverAll) and isinstance(b, Deliver)  # (see _same_event)
    subs = a.subs if isinstance(a, DeliverAll) else (a.sub,)
    return DeliverAll((*subs, b.sub), b.event)
