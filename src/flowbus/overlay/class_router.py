"""Events routed by class over the broker multigraph (sans-IO core).

How it works (Chordal Reliability Rings, section 3.5: "as there are express, normal and
secure links defined in the overlay, adapting to the event disseminations of urgent, and
secure events is straightforward"):

* Each broker routes hop by hop from its own table for the event's class. The table comes
  from the broker's link-state view, a :class:`~flowbus.overlay.multigraph.Multigraph`
  (:meth:`~flowbus.overlay.multigraph.Multigraph.next_hops`), and is recomputed when the
  view's ``version`` changes.
  - A SECURE event only ever takes secure links. With no secure path it is dropped and
    counted, never sent over a normal link.
  - An EXPRESS (urgent) event takes express links. With no express path it falls back to
    the normal route and is marked so.
  - A NORMAL event takes the cheapest path by weight.
* Every message names the link it travels on. The receiving broker checks that link's
  classes against the event's and counts a violation otherwise, so the "never over a
  normal-only link" property is checked on every hop, not assumed.
* A send that fails because its link is down (the driver's failure notice) marks the link
  failed in the view and routes the event again from here.
* Link latency from heartbeats (section 3.3.3, the express range; figure 2's link load
  change): with ``heartbeat=p`` a broker sends a ``LinkBeat`` stamped with its ``now`` on
  each of its live links every ``p``; the far end echoes the stamp (``LinkEcho``), and the
  broker records half the round trip as the link's latency in its view
  (:meth:`~flowbus.overlay.multigraph.Multigraph.measure`, the latest sample). A beat
  still unanswered says something too: at each round, a link whose oldest unanswered beat
  went ``w`` ago has a latency of at least ``w / 2``, recorded if above what is known, so a
  link that slows past a bound ``b`` is left within about ``2 b`` plus a period, not one
  slow round trip later.
* An express space may carry a latency bound (``send(..., bound=b)``): its events take
  only express links whose latency meets it, so when a link slows past the bound its
  tables change and the next events go round it; with no path within the bound they fall
  back to the normal route, marked, as above.

In the simulator all brokers share one view object, which stands for a link-state protocol
that has converged.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from flowbus import wire
from flowbus.core import Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.multigraph import LinkClass, Multigraph

__all__ = ["ClassRouter", "Classed", "LinkBeat", "LinkEcho"]


@wire.message("classes.classed")
@dataclass(frozen=True, slots=True)
class Classed:
    """An event of class ``cls`` from broker ``origin`` to broker ``dst``, on link ``link``."""

    origin: int
    dst: int
    cls: LinkClass
    payload: Any
    link: int
    sent: float
    hops: int = 1
    fell_back: bool = False  # an express event on the normal route (no express path)
    bound: float | None = None  # the most latency a link of its path may have (express)


@wire.message("classes.link_beat")
@dataclass(frozen=True, slots=True)
class LinkBeat:
    """A heartbeat on link ``link``, stamped with the sender's time (echoed back)."""

    link: int
    sent: float


@wire.message("classes.link_echo")
@dataclass(frozen=True, slots=True)
class LinkEcho:
    """The answer to a :class:`LinkBeat`: its stamp, back over the same link."""

    link: int
    sent: float


class ClassRouter(Core):
    """One broker's class-aware forwarding (see the module note)."""

    def __init__(self, broker: int, view: Multigraph, *, heartbeat: float | None = None) -> None:
        if broker not in view:
            raise ProtocolError(f"ClassRouter: broker {broker} is not in the overlay")
        if heartbeat is not None and not heartbeat > 0:
            raise ProtocolError(f"ClassRouter {broker}: the heartbeat period must be > 0, got {heartbeat!r}")
        self.broker = broker
        self.view = view
        self.heartbeat = heartbeat
        self.violations = 0  # messages that arrived over a link lacking their class
        self.undeliverable = 0  # no path for the class (secure: never falls back)
        self.measured = 0  # link latencies measured that changed the view
        self._waiting: dict[int, float] = {}  # link key -> the time of its oldest unanswered beat
        _Key = tuple[LinkClass, float | None]
        self._tables: dict[_Key, tuple[int, dict[int, tuple[int, int]]]] = {}

    def _table(self, cls: LinkClass, bound: float | None = None) -> dict[int, tuple[int, int]]:
        cached = self._tables.get((cls, bound))
        if cached is None or cached[0] != self.view.version:
            cached = (self.view.version, self.view.next_hops(self.broker, cls=cls, bound=bound))
            self._tables[(cls, bound)] = cached
        return cached[1]

    def start(self) -> list[Effect]:
        """Start the link heartbeats (if a period was given)."""
        return [] if self.heartbeat is None else [SetTimer(self.heartbeat, ("class", "beat"))]

    def send(
        self, dst: int, payload: Any, cls: LinkClass, now: float, *, bound: float | None = None
    ) -> list[Effect]:
        """Start routing ``payload`` to broker ``dst`` as a ``cls`` event (an express one
        only over links of latency ``bound`` at most, if given)."""
        msg = Classed(self.broker, dst, cls, payload, -1, now, 0, bound=bound)
        if dst == self.broker:
            return [Deliver(("class", cls.name), msg)]
        return self._forward(msg)

    def _forward(self, msg: Classed) -> list[Effect]:
        cls, fell_back = msg.cls, msg.fell_back
        hop = (self._table(LinkClass.NORMAL) if fell_back else self._table(cls, msg.bound)).get(msg.dst)
        if hop is None and cls is LinkClass.EXPRESS and not fell_back:
            hop, fell_back = self._table(LinkClass.NORMAL).get(msg.dst), True
        if hop is None:
            self.undeliverable += 1
            return []
        nxt, link = hop
        return [Send(nxt, replace(msg, link=link, hops=msg.hops + 1, fell_back=fell_back))]

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Classed():
                return self._on_classed(msg)
            case LinkBeat(link=link, sent=sent):
                return [Send(src, LinkEcho(link, sent))]
            case LinkEcho(link=link, sent=sent):
                if self._waiting.get(link, sent) <= sent:
                    self._waiting.pop(link, None)
                self._measure(link, max(0.0, now - sent) / 2)
                return []
            case _:
                raise ProtocolError(f"ClassRouter {self.broker}: unknown message {msg!r} from {src}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        match key:
            case ("class", "beat") if self.heartbeat is not None:
                return [*self._beats(now), SetTimer(self.heartbeat, ("class", "beat"))]
        raise ProtocolError(f"ClassRouter {self.broker}: unknown timer {key!r}")

    def _beats(self, now: float) -> list[Effect]:
        """A stamped heartbeat on each of our live links; a link silent for ``w`` has a
        latency of ``w / 2`` at least."""
        out: list[Effect] = []
        for link in self.view.incident(self.broker):
            silent = (now - self._waiting.setdefault(link.key, now)) / 2
            if silent > 0 and (link.latency is None or silent > link.latency):
                self._measure(link.key, silent)
            out.append(Send(link.other(self.broker), LinkBeat(link.key, now)))
        return out

    def _measure(self, link: int, latency: float) -> None:
        if self.view.measure(link, latency):
            self.measured += 1

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """The link was down: mark it failed in the view and route the event again."""
        match msg:
            case Classed():
                self.view.fail_link(msg.link)
                return self._forward(replace(msg, hops=msg.hops - 1))
            case _:
                return []

    def _on_classed(self, msg: Classed) -> list[Effect]:
        """Check the link it came on against its class; deliver it here or send it on."""
        needed = LinkClass.NORMAL if msg.fell_back else msg.cls
        if needed not in self.view.link(msg.link).classes:
            self.violations += 1
        if msg.dst == self.broker:
            return [Deliver(("class", msg.cls.name), msg)]
        return self._forward(msg)
