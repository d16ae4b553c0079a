"""Scribe-based baseline: content-based pub/sub over one Scribe multicast tree (sans-IO core).

How it works (Scribe: Castro, Druschel, Kermarrec & Rowstron, "SCRIBE: A large-scale and
decentralized application-level multicast infrastructure", IEEE JSAC 2002; used as the
"Scribe-based" baseline of the IRBR paper, section 1 and section 4 with one rendezvous point):

* Rendezvous point: every subscription uses one topic key, :data:`TOPIC` (the hash of
  ``"flowbus/scribe"``). The rendezvous -- the root of the multicast tree -- is whichever
  live node Pastry delivers that key to.
* Subscribe (join): a node's first local subscription routes a :class:`JoinTree` towards the
  topic key. Every node on the way adds the previous hop as a child (the tree is the union
  of the reverse paths). A node already in the tree stops the join there; any other node
  becomes a forwarder and routes it on; the node Pastry delivers the key to is the root.
  Each node remembers its parent, the hop it forwarded its join to.
* Publish: the event is routed to the rendezvous (:class:`Publish`), which sends it down
  the whole tree (:class:`Multicast`, direct messages parent to child). Filters never leave
  their node: each tree node delivers to its own matching subscriptions and passes every
  event to every child -- the baseline's cost compared with IRBR's pruned trees.
* Unsubscribe (leave): a node with no local subscription and no child leaves the tree and
  sends :class:`LeaveTree` to its parent, which may cascade up.
* Repair (``heartbeat=p``): every tree node sends a :class:`Heartbeat` to each child every
  p (and at once to a new child). A child that heard nothing from its parent for more than
  2p considers it failed, makes Pastry forget it and routes a join again; its subtree stays
  attached to it. With ``heartbeat=None`` nothing is repaired: the paper's experiment fails
  nodes all at once and measures the loss before any repair ("Scribe only gives weak
  reliability: events sent by the rendezvous during breaks and repair may be lost").
* Failed sends (the driver's failure notice): a routed message is re-routed by Pastry (a
  join in flight keeps going to the root; with heartbeats on, a message that could not reach
  our parent also makes us re-join at once); a failed send to a child drops that child (its
  subtree is lost until it re-joins by itself).

What the baseline simplifies: one topic for every subscription (no event-space partition as
in Hermes or P2P-ToPSS), so the tree reaches every subscriber; the root does not move when a
node closer to the key joins; no capacity limits or tree push-down; loop-freedom of the tree
after repair relies on Pastry's routing being loop-free. A tree message from a node that is
not our parent (a stale parent) is answered with a :class:`LeaveTree`, so no event arrives
twice. Joins and leaves carry the sender's membership number (``epoch``, + 1 each time it
enters the tree), so a leave overtaken by the next join of the same child (a reordering
transport) does not cut the child off.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from flowbus import wire
from flowbus.core import CancelTimer, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.filters import Filter
from flowbus.overlay.pastry import ID_SPACE, PastryNode, Route, node_id_from
from flowbus.overlay.pastry_app import PastryApp

__all__ = ["TIMER", "TOPIC", "Heartbeat", "JoinTree", "LeaveTree", "Multicast", "Publish", "ScribeNode"]

TOPIC: Final = node_id_from("flowbus/scribe")
"""The default topic key: its rendezvous point is the root of the one multicast tree."""

TIMER: Final = ("scribe", "heartbeat")
"""The key of the heartbeat round timer (only with ``heartbeat`` on)."""

SILENT_ROUNDS: Final = 3
"""Heartbeat rounds without word from the parent (more than 2 periods) that mean it died."""


# ------------------------------------------------------------------------------- messages


@wire.message("scribe.join_tree")
@dataclass(frozen=True, slots=True)
class JoinTree:
    """Routed towards the topic key: the previous hop (in its tree membership number
    ``epoch``) wants to be a child of each node."""

    epoch: int


@wire.message("scribe.leave_tree")
@dataclass(frozen=True, slots=True)
class LeaveTree:
    """Child to parent: forget me (my membership ``epoch`` and older ones)."""

    epoch: int


@wire.message("scribe.publish")
@dataclass(frozen=True, slots=True)
class Publish:
    """Routed towards the topic key: the rendezvous multicasts ``event``."""

    event: Mapping[str, Any]


@wire.message("scribe.multicast")
@dataclass(frozen=True, slots=True)
class Multicast:
    """Parent to child: ``event`` on its way down the tree."""

    event: Mapping[str, Any]


@wire.message("scribe.heartbeat")
@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Parent to child: I am alive (every period, and at once to a new child)."""


# ---------------------------------------------------------------------------------- node


class ScribeNode(PastryApp):
    """The Scribe-based event-notification layer of one Pastry node (see the module note).

    ``subs`` holds the local subscriptions (sub id -> filter); local subscribers get
    ``Deliver(sub_id, event)``. ``in_tree``, ``parent`` (an address, None for the root or
    off the tree), :attr:`children` and :attr:`is_root` describe this node's part of the tree.
    """

    app_messages = frozenset({JoinTree, LeaveTree, Publish, Multicast, Heartbeat})

    __slots__ = ("_children", "_epoch", "_silent", "heartbeat", "in_tree", "parent", "subs", "topic")

    def __init__(self, pastry: PastryNode, *, topic: int = TOPIC, heartbeat: float | None = None) -> None:
        super().__init__(pastry)
        if type(topic) is not int or not 0 <= topic < ID_SPACE:
            raise ProtocolError(f"ScribeNode: a topic is a 128-bit int, got {topic!r}")
        if heartbeat is not None and not heartbeat > 0:
            raise ProtocolError(f"ScribeNode: the heartbeat period must be > 0, got {heartbeat!r}")
        self.topic = topic
        self.heartbeat = heartbeat
        self.subs: dict[Hashable, Filter] = {}
        self.in_tree = False
        self.parent: int | None = None
        self._children: dict[int, int] = {}  # child address -> its membership epoch
        self._epoch = 0  # our membership number: + 1 each time we enter the tree
        self._silent = 0  # heartbeat rounds since the parent was last heard from

    @property
    def children(self) -> list[int]:
        """The children's addresses, sorted."""
        return sorted(self._children)

    @property
    def is_root(self) -> bool:
        return self.in_tree and self.parent is None

    # -- local calls

    def subscribe(self, filt: Filter, sub_id: Hashable) -> list[Effect]:
        if sub_id in self.subs:
            raise ProtocolError(f"ScribeNode.subscribe: subscription {sub_id!r} exists already")
        self.subs[sub_id] = filt
        return [] if self.in_tree else self.route(self.topic, JoinTree(self._epoch))

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.subs:
            raise ProtocolError(f"ScribeNode.unsubscribe: no subscription {sub_id!r}")
        del self.subs[sub_id]
        return self._maybe_leave()

    def publish(self, event: Mapping[str, Any]) -> list[Effect]:
        return self.route(self.topic, Publish(event))

    # -- what PastryApp hands us

    def on_app_message(self, src: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        """Scribe's messages, all read here: joins and publications are routed towards the
        topic key, the tree's own messages go straight from parent to child (or back)."""
        match msg:
            case JoinTree() if route is not None and route.key == self.topic:
                out = [] if src == self.address else self._add_child(src, msg.epoch)
                if self.in_tree:
                    return out
                return out + self._enter() + self._push_join(route)
            case Publish() if route is not None and route.key == self.topic:
                if self.next_hop(self.topic) is None:  # the rendezvous
                    return self._multicast(msg.event)
                return self.forward(route)
            case Multicast() | Heartbeat() if route is None and src != self.parent:
                return [Send(src, LeaveTree(self._epoch))]  # a stale parent: we are not its child
            case Multicast() if route is None:
                self._silent = 0
                return self._multicast(msg.event)
            case Heartbeat() if route is None:
                self._silent = 0
                return []
            case LeaveTree() if route is None:
                if self._children.get(src, msg.epoch + 1) > msg.epoch:  # not a child, or a newer one
                    return []
                del self._children[src]
                return self._maybe_leave()
            case _:
                what = f"message {msg!r}" if route is None else f"route {route!r}"
                raise ProtocolError(f"ScribeNode {self.address}: unexpected {what} from {src}")

    def on_app_send_failed(self, dst: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        """A join to our lost parent goes on to the new one; a routed publication is routed
        again (with heartbeats on, losing our parent also makes us re-join at once); a failed
        send to a child drops that child."""
        lost_parent = self.in_tree and dst == self.parent
        match msg:
            case JoinTree() if route is not None:  # ours (or a child's) to our parent, or stale
                return self._push_join(route) if lost_parent else []
            case _ if route is not None:
                repair = lost_parent and self.heartbeat is not None  # no repair without heartbeats
                out = self._rejoin() if repair else []
                return out + self.reroute(route, now)
            case _:
                if self._children.pop(dst, None) is None:
                    return []
                return self._maybe_leave()

    def on_app_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key != TIMER or self.heartbeat is None:
            raise ProtocolError(f"ScribeNode {self.address}: unknown timer {key!r}")
        if not self.in_tree:
            return []
        out: list[Effect] = []
        if self.parent is not None:
            self._silent += 1
            if self._silent >= SILENT_ROUNDS:
                out.extend(self.pastry.node_failed(self.parent))
                out.extend(self._rejoin())
        beat = Heartbeat()
        out.extend(Send(c, beat) for c in sorted(self._children))
        out.append(SetTimer(self.heartbeat, TIMER))
        return out

    # -- tree upkeep

    def _multicast(self, event: Mapping[str, Any]) -> list[Effect]:
        """Deliver ``event`` to the matching local subscriptions and pass it to every child."""
        out: list[Effect] = [Deliver(s, event) for s, f in self.subs.items() if f.matches(event)]
        msg = Multicast(event)
        out.extend(Send(c, msg) for c in sorted(self._children))
        return out

    def _add_child(self, child: int, epoch: int) -> list[Effect]:
        known = self._children.get(child)
        self._children[child] = epoch if known is None else max(known, epoch)
        if known is not None:
            return []
        return [] if self.heartbeat is None else [Send(child, Heartbeat())]

    def _enter(self) -> list[Effect]:
        self.in_tree = True
        self._epoch += 1
        return [] if self.heartbeat is None else [SetTimer(self.heartbeat, TIMER)]

    def _push_join(self, route: Route) -> list[Effect]:
        """Send a join one hop on: the next hop is our parent (None: we are the root)."""
        self.parent = self.next_hop(self.topic)
        self._silent = 0
        return self.forward(route, JoinTree(self._epoch))

    def _rejoin(self) -> list[Effect]:
        """Our parent is dead (Pastry has forgotten it): join again, keeping our subtree."""
        return self._push_join(Route(self.topic, JoinTree(self._epoch), 0, self.address))

    def _maybe_leave(self) -> list[Effect]:
        """Leave the tree if nothing keeps us in it (no local subscription, no child)."""
        if not self.in_tree or self.subs or self._children:
            return []
        out: list[Effect] = [] if self.parent is None else [Send(self.parent, LeaveTree(self._epoch))]
        self.in_tree = False
        self.parent = None
        if self.heartbeat is not None:
            out.append(CancelTimer(TIMER))
        return out
