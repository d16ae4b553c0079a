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
* **Subscriptions are state.** ``subscribe`` files ``("sub", id) -> filter text`` in the
  ring node's state, so it is backed up on the ring neighbours. When a broker takes over a
  dead one's state, the subscriptions in it are subscribed here: their events are delivered
  by the broker that took over (a client would re-attach to it).
* Each subscription id is global (say ``(client, n)``): ``Deliver(sub_id, event)``.

* **Events sent into a failure.** An event whose send to a tree neighbour fails (the
  driver's failure notice) is kept, with the side of the ring it was going to.
  - When the ring has a new neighbour on that side, the event goes there. That broker is
    the first one of the part of the tree the dead broker led to, so nothing there had the
    event yet.
  - When this broker takes the dead one's subscriptions over itself, the kept events are
    delivered to them.
  So one crash loses no event, as long as its subscriptions were backed up and the
  failure is detected (heartbeats or failed sends).

What is not done here: events a dead broker had queued for its own clients (the driver
delivers at once, so there are none in the simulator), and a link failure whose broker is
alive (the tree keeps the link; its events wait until the link is back).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.effects import Deliver, Effect, Send
from flowbus.routing import cbr

__all__ = ["HandedOver", "RingBroker"]

_CBR = (cbr.Subscribe, cbr.Unsubscribe, cbr.Publish)


def origin_of(key: Hashable) -> tuple[int, Hashable]:
    """The routing origin of a subscription's state key ``("sub", sub_id, home broker)``."""
    assert isinstance(key, tuple)
    return (key[2], key[1])


DEDUP_WINDOW = 100_000
"""How many recent (subscription, event id) deliveries a broker remembers."""

EVENT_ID = "__flowbus_event_id"
"""The field an event carries between brokers: (publishing broker, sequence number)."""


@dataclass(frozen=True, slots=True)
class HandedOver:
    """An event that a broker could not send to the dead broker ``dead``, handed to the ring
    neighbour that took its place across the tree's cut."""

    event: Mapping[str, Any]
    dead: int


class RingBroker:
    """One broker: a ring node and a content router over the ring's tree."""

    def __init__(self, addr: int, *, backup: int = 2, heartbeat: float | None = None, **ring: Any) -> None:
        self.ring = RingNode(addr, backup=backup, heartbeat=heartbeat, **ring)
        self.router = cbr.ContentRouter(addr, ())
        self.subs: set[Hashable] = set()  # subscriptions served here (own and taken over)
        self._early: dict[int, list[Any]] = {}  # routing messages from not-yet neighbours
        self._retry: list[tuple[Mapping[str, Any], int, int]] = []  # (event, dead addr, ring side)
        self._known: dict[int, int] = {}  # ring id -> address of the brokers we have linked to
        self._takeovers = 0  # how many of the ring node's takeovers we have taken up
        self._orphans: dict[int, dict[Any, Filter]] = {}  # dead addr -> its subs, across the cut
        self._orphan_side: dict[int, int] = {}
        self._adopted: dict[Hashable, tuple[int, Hashable]] = {}  # taken-over sub -> its origin
        self._seq = 0
        self._delivered: OrderedDict[tuple[Hashable, Any], None] = OrderedDict()  # (sub, event id)
        self._taken_from: dict[Hashable, tuple[Filter, set[int]]] = {}  # sub -> (filter, dead addrs)

    @property
    def addr(self) -> int:
        return self.ring.addr

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

    def join(self, candidates: list[int]) -> list[Effect]:
        return self.ring.join(candidates)

    def subscribe(self, sub_id: Hashable, filt: Filter) -> list[Effect]:
        if sub_id in self.subs:
            raise ProtocolError(f"broker {self.addr}: subscription {sub_id!r} exists already")
        self.subs.add(sub_id)
        out = self.router.subscribe(sub_id, filt)
        return out + self.ring.set_state(("sub", sub_id, self.addr), filt.to_text())

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.subs:
            raise ProtocolError(f"broker {self.addr}: no subscription {sub_id!r}")
        self.subs.discard(sub_id)
        key = next(k for k in self.ring.state if isinstance(k, tuple) and k[:2] == ("sub", sub_id))
        self._taken_from.pop(sub_id, None)
        return self.router.drop(origin_of(key)) + self.ring.del_state(key)

    def publish(self, event: Mapping[str, Any]) -> list[Effect]:
        """Route ``event``; it travels with an id (this broker, a sequence number) that
        de-duplicates the deliveries to taken-over subscriptions, and is removed before
        any subscriber sees the event."""
        self._seq += 1
        stamped = {**event, EVENT_ID: (self.addr, self._seq)}
        return self._out(self._route_orphans(self.router.publish(stamped), stamped))

    # -- the driver's entry points

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        if isinstance(msg, HandedOver):
            return self._out(self._on_handed_over(msg))
        if isinstance(msg, _CBR):
            router = self.router
            if src in router.neighbours or (src in router.former and src not in self.tree_neighbours()):
                routed = router.on_message(src, msg, now)  # (removed for good: dropped there)
                event = msg.event if isinstance(msg, cbr.Publish) and src in router.neighbours else None
                return self._out(self._route_orphans(routed, event))
            self._early.setdefault(src, []).append(msg)  # the link is new to its other end only
            return []
        return self._out(self._sync(self.ring.on_message(src, msg, now)))

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return self._out(self._sync(self.ring.on_timer(key, now)))

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """A failed send (a routing message too) is a failure clue for the ring; the ring's
        repair then changes the tree, and the routers re-send what the new links need. An
        event is kept for the broker that takes the dead one's place (and delivered at once
        to its subscriptions if we took them over already)."""
        out: list[Effect] = []
        if isinstance(msg, cbr.Publish) and self.ring.joined:
            side = self.ring.side_of_addr(dst)  # (the ring may be repaired already)
            if side:
                self._retry.append((msg.event, dst, side))
                out.extend(self._on_handed_over(HandedOver(msg.event, dst)))
        return self._out(out + self._sync(self.ring.on_send_failed(dst, msg, now)))

    def _out(self, effects: list[Effect]) -> list[Effect]:
        """Deliveries without the event id, each (subscription, event) once: a kept event
        re-sent after a repair may meet one that went round (the last ``DEDUP_WINDOW``
        deliveries are remembered)."""
        out: list[Effect] = []
        for e in effects:
            if isinstance(e, Deliver) and isinstance(e.event, Mapping) and EVENT_ID in e.event:
                key = (e.sub, e.event[EVENT_ID])
                if key in self._delivered:
                    continue
                self._delivered[key] = None
                if len(self._delivered) > DEDUP_WINDOW:
                    self._delivered.popitem(last=False)
                e = Deliver(e.sub, {k: v for k, v in e.event.items() if k != EVENT_ID})
            out.append(e)
        return out

    # -- keeping the router in step with the ring

    def _sync(self, effects: list[Effect]) -> list[Effect]:
        """After a ring step: take up taken-over subscriptions, follow the tree's changes."""
        out = list(effects)
        ring = self.ring
        fresh_dead = [self._known.get(d) for d in ring.taken_over[self._takeovers :]]
        self._takeovers = len(ring.taken_over)
        for key, text in list(ring.state.items()):
            if isinstance(key, tuple) and key[:1] == ("sub",) and key[1] not in self.subs:
                self.subs.add(key[1])
                filt = parse(text)
                self._taken_from[key[1]] = (filt, {a for a in fresh_dead if a is not None})
                self._adopted[key[1]] = origin_of(key)
                out.extend(self.router.adopt(origin_of(key), filt))
                out.extend(
                    Deliver(key[1], e) for e, d, _ in self._retry if d in fresh_dead and filt.matches(e)
                )
        held = {k[1] for k in ring.state if isinstance(k, tuple) and k[:1] == ("sub",)}
        for sub in sorted(set(self._adopted) - held, key=repr):  # passed on (load sharing)
            out.extend(self.router.drop(self._adopted.pop(sub)))
            self.subs.discard(sub)
            self._taken_from.pop(sub, None)
        if ring.joined:
            self._known.update((p.id, p.addr) for p in ring.links())
        wanted = self.tree_neighbours()
        if wanted != set(self.router.neighbours):
            added = wanted - set(self.router.neighbours)
            handover = self._handover(wanted)
            self._keep_orphans(wanted, handover)
            out.extend(self.router.set_neighbours(wanted, handover=handover))
            for src in sorted(added):
                for msg in self._early.pop(src, []):
                    out.extend(self.router.on_message(src, msg, 0.0))
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
        """Kept events go to the new neighbour on their side, once the ring has one."""
        if not self._retry or not self.ring.joined:
            return []
        out: list[Effect] = []
        keep = []
        for event, dead, side in self._retry:
            now = self.ring.right if side > 0 else self.ring.left
            if now is None or now.addr == dead or self.ring.open & {side}:
                keep.append((event, dead, side))
            elif now.addr in self.router.neighbours:
                out.append(Send(now.addr, cbr.Publish(event)))
            else:  # across the tree's cut: only the dead broker's own subscriptions are there
                out.append(Send(now.addr, HandedOver(event, dead)))
        self._retry = keep
        return out

    def _on_handed_over(self, msg: HandedOver) -> list[Effect]:
        """An event that was going to a dead broker: deliver it to the subscriptions we took
        over from that broker (the tree did not reach it, nobody else serves them)."""
        return [
            Deliver(sub, msg.event)
            for sub, (filt, dead) in sorted(self._taken_from.items(), key=lambda kv: repr(kv[0]))
            if msg.dead in dead and filt.matches(msg.event)
        ]
