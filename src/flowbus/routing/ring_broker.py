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

What is not done here: acknowledged hop-by-hop forwarding, and queues of undelivered events
in the backed-up state. An event sent while the tree is being repaired may be lost.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.effects import Effect
from flowbus.routing import cbr

__all__ = ["RingBroker"]

_CBR = (cbr.Subscribe, cbr.Unsubscribe, cbr.Publish)


class RingBroker:
    """One broker: a ring node and a content router over the ring's tree."""

    def __init__(self, addr: int, *, backup: int = 2, heartbeat: float | None = None, **ring: Any) -> None:
        self.ring = RingNode(addr, backup=backup, heartbeat=heartbeat, **ring)
        self.router = cbr.ContentRouter(addr, ())
        self.subs: set[Hashable] = set()  # subscriptions served here (own and taken over)
        self._early: dict[int, list[Any]] = {}  # routing messages from not-yet neighbours

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
        return out + self.ring.set_state(("sub", sub_id), filt.to_text())

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.subs:
            raise ProtocolError(f"broker {self.addr}: no subscription {sub_id!r}")
        self.subs.discard(sub_id)
        return self.router.unsubscribe(sub_id) + self.ring.del_state(("sub", sub_id))

    def publish(self, event: Mapping[str, Any]) -> list[Effect]:
        return self.router.publish(event)

    # -- the driver's entry points

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        if isinstance(msg, _CBR):
            router = self.router
            if src in router.neighbours or (src in router.former and src not in self.tree_neighbours()):
                return router.on_message(src, msg, now)  # (a link removed for good: dropped there)
            self._early.setdefault(src, []).append(msg)  # the link is new to its other end only
            return []
        return self._sync(self.ring.on_message(src, msg, now))

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return self._sync(self.ring.on_timer(key, now))

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """A failed send (a routing message too) is a failure clue for the ring; the ring's
        repair then changes the tree, and the routers re-send what the new links need."""
        return self._sync(self.ring.on_send_failed(dst, msg, now))

    # -- keeping the router in step with the ring

    def _sync(self, effects: list[Effect]) -> list[Effect]:
        """After a ring step: take up taken-over subscriptions, follow the tree's changes."""
        out = list(effects)
        for key, text in list(self.ring.state.items()):
            if isinstance(key, tuple) and key[:1] == ("sub",) and key[1] not in self.subs:
                self.subs.add(key[1])
                out.extend(self.router.subscribe(key[1], parse(text)))
        wanted = self.tree_neighbours()
        if wanted != set(self.router.neighbours):
            added = wanted - set(self.router.neighbours)
            out.extend(self.router.set_neighbours(wanted))
            for src in sorted(added):
                for msg in self._early.pop(src, []):
                    out.extend(self.router.on_message(src, msg, 0.0))
        return out
