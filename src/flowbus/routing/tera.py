"""TERA: topic-based event routing over a random graph, CBDLO's second baseline (sans-IO core).

How it works (Baldoni, Beraldi, Quema, Querzoni & Tucci-Piergiovanni, "TERA: topic-based
event routing for peer-to-peer architectures", DEBS 2007; the 004 document, section 5.3,
uses it with an access-point table of 50 and attributes as topics):

* Every node is in the general overlay (a view of random neighbours); the subscribers of a
  topic also form that topic's overlay (``topic_views``: a few random other members each).
* A node keeps an access-point table (:class:`~flowbus.overlay.cyclon.Apt`): topic -> a
  member of the topic's overlay.
* Publishing: one search per topic of the event (here: per attribute). A node that is a
  member of the topic, or finds it in its APT, hands the event to the topic's overlay
  (:class:`TopicEnter` to the access point); otherwise the event goes on a random walk
  (:class:`TopicWalk`, to a random neighbour other than the one it came from) for at most
  ``max_hops`` hops.
* Inside the topic overlay the event is flooded (:class:`TopicFlood`): a member that gets it
  for the first time passes it to all its topic neighbours but the sender, and delivers it
  to its local subscriptions that match it (content filtering at the subscriber); an event
  is delivered at most once per subscription, whichever topic brought it.

What this simplifies from TERA: one walk per topic (TERA may start several), no
partition-merging of topic overlays, and the topic overlays and APTs are given (built from
a converged peer-sampling state) rather than gossiped here.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus.core import Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.cbdlo_tree import RangeSubscription
from flowbus.overlay.cyclon import Apt
from flowbus.routing.crawl import Publication

__all__ = ["TeraNode", "TopicEnter", "TopicFlood", "TopicWalk"]


@dataclass(frozen=True, slots=True)
class TopicWalk:
    """The search for ``topic``'s overlay after ``hops`` hops."""

    pub: Publication
    topic: str
    hops: int


@dataclass(frozen=True, slots=True)
class TopicEnter:
    """To an access point of ``topic``: flood ``pub`` in the topic's overlay."""

    pub: Publication
    topic: str


@dataclass(frozen=True, slots=True)
class TopicFlood:
    """Inside ``topic``'s overlay: ``pub`` being flooded."""

    pub: Publication
    topic: str


class TeraNode(Core):
    """One TERA node (see the module note). ``observer.walk_ended(pub, topic, outcome, hops)``
    is told how each search ended (``"hit"`` or ``"expired"``)."""

    __slots__ = (
        "addr", "apt", "delivered", "flooded", "max_hops", "observer", "rng", "subs", "topic_views",
        "ttl", "view",
    )  # fmt: skip

    def __init__(
        self,
        addr: int,
        *,
        view: Sequence[int],
        rng: random.Random,
        apt: Apt,
        topic_views: Mapping[str, Sequence[int]] | None = None,
        max_hops: int = 10,
        ttl: float = 1000.0,
        observer: Any = None,
    ) -> None:
        if max_hops < 0 or ttl <= 0:
            raise ProtocolError(f"TERA node {addr}: need max_hops >= 0 and ttl > 0")
        self.addr = addr
        self.view = [n for n in view if n != addr]
        self.rng = rng
        self.apt = apt
        self.topic_views = {t: [n for n in v if n != addr] for t, v in (topic_views or {}).items()}
        self.max_hops = max_hops
        self.ttl = ttl
        self.observer = observer
        self.subs: dict[Hashable, RangeSubscription] = {}
        self.flooded: set[tuple[int, str]] = set()
        self.delivered: dict[int, set[Hashable]] = {}

    def subscribe(self, sub: RangeSubscription) -> list[Effect]:
        self.subs[sub.sid] = sub
        return []

    def publish(self, pub: Publication) -> list[Effect]:
        effects: list[Effect] = []
        for topic, _ in pub.values:
            effects += self._walk(pub, topic, 0, self.addr)
        return effects

    def _walk(self, pub: Publication, topic: str, hops: int, src: int) -> list[Effect]:
        if topic in self.topic_views:
            self._ended(pub, topic, "hit", hops)
            return self._flood(pub, topic, self.addr)
        ap = self.apt.lookup(topic)
        if ap is not None:
            self._ended(pub, topic, "hit", hops)
            return [Send(ap, TopicEnter(pub, topic))]
        if hops >= self.max_hops:
            self._ended(pub, topic, "expired", hops)
            return []
        choices = [n for n in self.view if n != src] or self.view
        if not choices:
            self._ended(pub, topic, "expired", hops)
            return []
        return [Send(choices[self.rng.randrange(len(choices))], TopicWalk(pub, topic, hops + 1))]

    def _ended(self, pub: Publication, topic: str, outcome: str, hops: int) -> None:
        if self.observer is not None:
            self.observer.tera_walk_ended(pub, topic, outcome, hops)

    def _flood(self, pub: Publication, topic: str, src: int) -> list[Effect]:
        key = (pub.eid, topic)
        if key in self.flooded:
            return []
        self.flooded.add(key)
        effects: list[Effect] = []
        done = self.delivered.get(pub.eid)
        if done is None:
            done = self.delivered[pub.eid] = set()
            effects.append(SetTimer(self.ttl, ("tera", pub.eid)))
        if self.subs:
            event = pub.as_dict()
            for sid, sub in self.subs.items():
                if sid not in done and sub.matches(event):
                    done.add(sid)
                    effects.append(Deliver(sid, pub))
        msg = TopicFlood(pub, topic)
        effects += [Send(n, msg) for n in self.topic_views.get(topic, ()) if n != src]
        return effects

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case TopicWalk():
                return self._walk(msg.pub, msg.topic, msg.hops, src)
            case TopicEnter():
                if msg.topic in self.topic_views:
                    return self._flood(msg.pub, msg.topic, self.addr)
                self._ended(msg.pub, msg.topic, "stale", 0)  # a stale entry: the search ends here
                return []
            case TopicFlood():
                return self._flood(msg.pub, msg.topic, src)
            case _:
                raise ProtocolError(f"TERA node {self.addr}: unknown message {msg!r} from {src}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "tera":
            eid = key[1]
            self.delivered.pop(eid, None)
            self.flooded = {k for k in self.flooded if k[0] != eid}
            return []
        raise ProtocolError(f"TERA node {self.addr}: unknown timer {key!r}")
