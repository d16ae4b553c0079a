"""Express spaces on the ring brokers: their events cross only links whose latency, measured
from the heartbeats, meets the express bound (sans-IO, a part of
:class:`~flowbus.routing.ring_broker.RingBroker`).

How it works (Chordal Reliability Rings, 3.3.3: an express link's latency "is guaranteed to
be in the range designated as the express range"; figure 2's "link load change"; in the
simulator's multigraph the :class:`~flowbus.overlay.class_router.ClassRouter` does the
same with the same beats):

* **Measured.** At each ring heartbeat round a broker sends a
  :class:`~flowbus.overlay.class_router.LinkBeat` stamped with its ``now`` (the driver's
  clock: the core reads none) to every broker it links to (window and chords); the far end
  echoes the stamp (``LinkEcho``) and the broker takes half the round trip as the link's
  latency (:class:`LinkJudge`). A beat still unanswered says something too: a link whose
  oldest unanswered beat went ``w`` ago has a latency of at least ``w / 2``, so a link that
  stops answering is seen slow within about twice the bound plus a period.
* **Judged, with hysteresis.** A link is *express* while its latency is at most ``bound``;
  once over it, it is express again only below ``bound * (1 - HYSTERESIS)``, so a link
  whose latency hovers at the bound does not flap.
* **Ring-wide.** When a judgement flips (or the links change) the broker announces its
  links, ``(peer, express, latency)`` each, in a :class:`LinkLatency` with a growing
  version, flooded on the tree and kept in a
  :class:`~flowbus.routing.link_classes.LinkBook` as link classes are; a broker joining gets
  them all. Every broker so holds the *ring view*: each link is express if both ends that
  told say so (its own links from its own measurement).
* **Routed.** An express space's event is routed by content like any other (the tree,
  covering, custody); only the hop changes. A send of it to a tree neighbour whose direct
  link is not express goes as a :class:`Detour` over the fewest express links of the ring
  view (source-routed: each broker on the way passes it on; the last takes it as sent by the
  origin, whose custody record and confirmation are the tree's). When the link recovers,
  the events take it again.
* **No express path.** The event goes over the direct link anyway, counted in
  :attr:`ExpressRoutes.fallbacks` (the broker logs it). We chose the direct link over the
  least-latency detour because no path meets the bound then, so none is "express", and the
  direct link is the tree's own hop: no other broker is loaded with the event, the
  publisher's order on the link holds, and it is what the simulator's class router does (an
  express event with no express path takes the normal route).

Not done: an event of a space that is sometimes detoured may overtake one sent directly
before it (the order of one publisher holds per path, not across a change of path); a bound
per space (one ``express_bound`` is the ring's express range).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Effect, Send
from flowbus.errors import ProtocolError
from flowbus.overlay.class_router import LinkBeat, LinkEcho
from flowbus.overlay.multigraph import NORMAL_ONLY, LinkClass, Multigraph
from flowbus.routing import cbr
from flowbus.routing.link_classes import LinkBook

__all__ = ["HYSTERESIS", "Detour", "ExpressRoutes", "LinkJudge", "LinkLatency"]

HYSTERESIS = 0.25
"""A link over the bound is express again below ``bound * (1 - HYSTERESIS)``."""

_EXPRESS = frozenset({LinkClass.NORMAL, LinkClass.EXPRESS})


@wire.message("ringbroker.link_latency")
@dataclass(frozen=True, slots=True)
class LinkLatency:
    """Broker ``broker``'s links as measured, ``(peer, express, latency)``, as of ``version``."""

    broker: int
    version: int
    links: tuple[tuple[int, bool, float], ...]


@wire.message("ringbroker.detour")
@dataclass(frozen=True, slots=True)
class Detour:
    """An express event going round a slow link: the brokers still ahead (``via``, the last
    is its tree receiver; none: the receiver is it), and ``origin``, the tree neighbour that
    sent it."""

    via: tuple[int, ...]
    origin: int
    event: Mapping[str, Any]


class LinkJudge:
    """The latency of a broker's links from its beats, and whether each is express."""

    def __init__(self, bound: float) -> None:
        if not bound > 0:
            raise ProtocolError(f"express bound: seconds > 0, got {bound!r}")
        self.bound = bound
        self.latency: dict[int, float] = {}  # peer -> the latest measure (seconds)
        self.express: dict[int, bool] = {}  # peer -> judged express
        self._waiting: dict[int, float] = {}  # peer -> the stamp of its oldest unanswered beat

    def beats(self, me: int, peers: Iterable[int], now: float) -> tuple[list[Effect], bool]:
        """A beat to each peer (others forgotten); whether a judgement changed."""
        peers = set(peers)
        changed = bool(set(self.express) - peers)
        for gone in set(self.express) - peers:
            del self.express[gone]
            self.latency.pop(gone, None)
            self._waiting.pop(gone, None)
        out: list[Effect] = []
        for peer in sorted(peers):
            silent = (now - self._waiting.setdefault(peer, now)) / 2
            if silent > self.latency.get(peer, 0.0):
                changed |= self.measure(peer, silent)
            out.append(Send(peer, LinkBeat(me, now)))
        return out, changed

    def echo(self, peer: int, sent: float, now: float) -> bool:
        """A beat stamped ``sent`` came back from ``peer``: whether its judgement changed."""
        if self._waiting.get(peer, sent) <= sent:  # (it answers the older beats too)
            self._waiting.pop(peer, None)
        return self.measure(peer, max(0.0, now - sent) / 2)

    def measure(self, peer: int, latency: float) -> bool:
        """Record ``latency`` for the link to ``peer``; whether it flipped its judgement."""
        self.latency[peer] = latency
        was = self.express.get(peer)
        limit = self.bound if was is not False else self.bound * (1 - HYSTERESIS)
        self.express[peer] = now = latency <= limit
        return now != was


class ExpressRoutes:
    """Broker ``addr``'s express routing (see the module note): off when ``bound`` is None;
    ``is_express`` says which spaces are express; ``epoch`` starts the announcements'
    versions (a restarted broker's must be newer: the driver gives the wall clock)."""

    def __init__(
        self,
        addr: int,
        *,
        bound: float | None = None,
        is_express: Callable[[Any], bool] = lambda space: False,
        epoch: int = 0,
    ) -> None:
        self.addr = addr
        self.judge = LinkJudge(bound) if bound is not None else None
        self.is_express = is_express
        self.book: LinkBook[LinkLatency] = LinkBook()  # every broker's latest LinkLatency
        self.version = epoch
        self.detours = 0  # express events sent round a slow link (from here)
        self.relayed = 0  # detours passed on by this broker
        self.fallbacks = 0  # express events with no express path: sent on the direct link
        self.routes: Counter[tuple[int, ...]] = Counter()  # brokers of the express hops sent from here
        self._spaces: dict[Any, bool] = {}
        self._view: tuple[Any, Multigraph] | None = None

    @property
    def on(self) -> bool:
        return self.judge is not None

    def beat_round(self, peers: Iterable[int], tree: Iterable[int], now: float) -> list[Effect]:
        """The heartbeat round's beats, and our announcement if a judgement changed."""
        if self.judge is None:
            return []
        out, changed = self.judge.beats(self.addr, peers, now)
        return out + (self._announce(tree) if changed or self.addr not in self.book.known else [])

    def take(self, src: int, msg: Any, now: float, tree: Iterable[int]) -> list[Effect]:
        """A beat (echoed), an echo (measured) or an announcement (kept, flooded on)."""
        match msg:
            case LinkBeat(link=link, sent=sent):
                return [Send(src, LinkEcho(link, sent))]
            case LinkEcho(sent=sent) if self.judge is not None:
                return self._announce(tree) if self.judge.echo(src, sent, now) else []
            case LinkEcho():
                return []
            case LinkLatency():
                return self.book.flood(msg, tree, src) if self.book.take(msg) else []
        raise ProtocolError(f"ExpressRoutes {self.addr}: unknown message {msg!r} from {src}")

    def _announce(self, tree: Iterable[int]) -> list[Effect]:
        assert self.judge is not None
        judge = self.judge
        self.version += 1
        links = tuple(
            (p, judge.express[p], round(judge.latency.get(p, 0.0), 6)) for p in sorted(judge.express)
        )
        msg = LinkLatency(self.addr, self.version, links)
        self.book.take(msg)
        return self.book.flood(msg, tree, None)

    def express_space(self, space: Any) -> bool:
        known = self._spaces.get(space)
        if known is None:
            known = self._spaces[space] = self.is_express(space)
        return known

    def route(self, effects: list[Effect], space_field: str) -> list[Effect]:
        """Sends of express events to a neighbour over a slow link: round it (see the note)."""
        judge = self.judge
        if judge is None:
            return effects
        out: list[Effect] = []
        for e in effects:
            if (
                type(e) is Send
                and type(e.msg) is cbr.Publish
                and self.express_space(e.msg.event.get(space_field))
            ):
                e = self._hop(e.dst, e.msg.event, judge.express.get(e.dst, True))
            out.append(e)
        return out

    def _hop(self, dst: int, event: Mapping[str, Any], direct: bool) -> Send:
        path = None if direct else self.view().path(self.addr, dst, cls=LinkClass.EXPRESS)
        if direct or path is None or len(path.brokers) <= 2:
            self.fallbacks += not direct
            self.routes[(self.addr, dst)] += 1
            return Send(dst, cbr.Publish(event))
        self.detours += 1
        self.routes[path.brokers] += 1
        return Send(path.brokers[1], Detour(path.brokers[2:], self.addr, event))

    def pass_on(self, msg: Detour) -> list[Effect]:
        """A detour through this broker: on to the next broker of its path."""
        self.relayed += 1
        return [Send(msg.via[0], Detour(msg.via[1:], msg.origin, msg.event))]

    def view(self) -> Multigraph:
        """The ring view: the links each end that announced lists (a broker gone is left
        out by its neighbours' news), express if each says so (our own as we judge them
        now); built again when an announcement or a judgement changed."""
        own = tuple(sorted(self.judge.express.items())) if self.judge is not None else ()
        key = (tuple((b, m.version) for b, m in self.book.known.items()), own)
        if self._view is not None and self._view[0] == key:
            return self._view[1]
        told = {b: msg.links for b, msg in self.book.known.items() if b != self.addr}
        told[self.addr] = tuple((peer, fast, 0.0) for peer, fast in own)
        edges: dict[tuple[int, int], bool] = {}
        listed: dict[tuple[int, int], int] = {}  # (how many of its ends list it)
        for broker, links in told.items():
            for peer, fast, _ in links:
                edge = (min(broker, peer), max(broker, peer))
                edges[edge] = edges.get(edge, True) and fast
                listed[edge] = listed.get(edge, 0) + 1
        view = Multigraph({self.addr, *(b for edge in edges for b in edge)})
        for (a, b), fast in sorted(edges.items()):
            if listed[(a, b)] == (a in told) + (b in told):  # (an end that told of others, not it: gone)
                view.add_link(a, b, weight=1.0, classes=_EXPRESS if fast else NORMAL_ONLY)
        self._view = (key, view)
        return view

    def failed(self, msg: Detour) -> list[Effect]:
        """A detour's next hop could not be reached: straight to its tree receiver."""
        if not msg.via:
            return []
        return [Send(msg.via[-1], Detour((), msg.origin, msg.event))]

    def status(self) -> dict[str, Any]:
        """What the console and metrics show: each link's latency and judgement, the counts."""
        judge = self.judge
        return {
            "bound": judge.bound if judge is not None else None,
            "links": {p: (judge.latency.get(p), fast) for p, fast in judge.express.items()} if judge else {},
            "detours": self.detours,
            "relayed": self.relayed,
            "fallbacks": self.fallbacks,
        }
