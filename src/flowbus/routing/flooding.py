"""Simple: content-based flooding with local matching, CBDLO's first baseline (sans-IO core).

How it works (the 004 document, section 5.3, "Simple"): the nodes form the same kind of
unstructured random graph as CBDLO's lower layer (a view of neighbours per node). A node
that gets an event for the first time matches it against its own subscriptions (each
subscription costs its number of attributes in comparisons: the document's ``m x s`` per
node, section 5.4), delivers it to those that match, and forwards it -- until the event
has made ``max_hops`` hops. A copy that reaches a node a second time is dropped (it was
still a message).

How many neighbours a node forwards to (``fanout``) the document does not say; 0 means
all of them (a full flood). Its one stated point (3,000 nodes, view 10, max hops 10:
68,605 messages, 68 of 408 expected matches delivered) fits a fanout of 2: a full flood
reaches every node of such a graph within 5 hops, for some 27,000 messages per event,
whereas forwarding to 2 random neighbours costs about 2 messages per node reached and
reaches a sixth of the nodes in 10 hops, as the document's 68 / 408 does. The
experiments use 2 and say so.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus.core import Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.cbdlo_tree import RangeSubscription
from flowbus.routing.crawl import Publication

__all__ = ["Flood", "SimpleNode"]


@dataclass(frozen=True, slots=True)
class Flood:
    """The event ``pub`` after ``hops`` hops."""

    pub: Publication
    hops: int


class SimpleNode(Core):
    """One node of the Simple flooding protocol (see the module note).

    ``comparisons`` counts the attribute comparisons of local matching; ``reached`` the
    events this node got (first copies)."""

    __slots__ = ("addr", "comparisons", "fanout", "max_hops", "reached", "rng", "seen", "subs", "ttl", "view")

    def __init__(
        self,
        addr: int,
        *,
        view: Sequence[int],
        rng: random.Random,
        fanout: int = 2,
        max_hops: int = 10,
        ttl: float = 1000.0,
    ) -> None:
        if fanout < 0 or max_hops < 0 or ttl <= 0:
            raise ProtocolError(f"Simple node {addr}: need fanout >= 0, max_hops >= 0, ttl > 0")
        self.addr = addr
        self.view = [n for n in view if n != addr]
        self.rng = rng
        self.fanout = fanout
        self.max_hops = max_hops
        self.ttl = ttl
        self.subs: dict[Hashable, RangeSubscription] = {}
        self.seen: set[int] = set()
        self.comparisons = 0
        self.reached = 0

    def subscribe(self, sub: RangeSubscription) -> list[Effect]:
        self.subs[sub.sid] = sub
        return []

    def publish(self, pub: Publication) -> list[Effect]:
        return self._handle(pub, 0, self.addr)

    def _handle(self, pub: Publication, hops: int, src: int) -> list[Effect]:
        if pub.eid in self.seen:
            return []
        self.seen.add(pub.eid)
        self.reached += 1
        effects: list[Effect] = [SetTimer(self.ttl, ("seen", pub.eid))]
        if self.subs:
            event = pub.as_dict()
            for sid, sub in self.subs.items():
                self.comparisons += len(sub.ranges)
                if sub.matches(event):
                    effects.append(Deliver(sid, pub))
        if hops < self.max_hops:
            targets = [n for n in self.view if n != src]
            if 0 < self.fanout < len(targets):
                targets = self.rng.sample(targets, self.fanout)
            msg = Flood(pub, hops + 1)
            effects += [Send(n, msg) for n in targets]
        return effects

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Flood():
                return self._handle(msg.pub, msg.hops, src)
            case _:
                raise ProtocolError(f"Simple node {self.addr}: unknown message {msg!r} from {src}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "seen":
            self.seen.discard(key[1])
            return []
        raise ProtocolError(f"Simple node {self.addr}: unknown timer {key!r}")
