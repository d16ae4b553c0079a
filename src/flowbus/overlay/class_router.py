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

In the simulator all brokers share one view object, which stands for a link-state protocol
that has converged.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Core, Deliver, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.overlay.multigraph import LinkClass, Multigraph

__all__ = ["ClassRouter", "Classed"]


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


class ClassRouter(Core):
    """One broker's class-aware forwarding (see the module note)."""

    def __init__(self, broker: int, view: Multigraph) -> None:
        if broker not in view:
            raise ProtocolError(f"ClassRouter: broker {broker} is not in the overlay")
        self.broker = broker
        self.view = view
        self.violations = 0  # messages that arrived over a link lacking their class
        self.undeliverable = 0  # no path for the class (secure: never falls back)
        self._tables: dict[LinkClass, tuple[int, dict[int, tuple[int, int]]]] = {}

    def _table(self, cls: LinkClass) -> dict[int, tuple[int, int]]:
        cached = self._tables.get(cls)
        if cached is None or cached[0] != self.view.version:
            cached = (self.view.version, self.view.next_hops(self.broker, cls=cls))
            self._tables[cls] = cached
        return cached[1]

    def send(self, dst: int, payload: Any, cls: LinkClass, now: float) -> list[Effect]:
        """Start routing ``payload`` to broker ``dst`` as a ``cls`` event."""
        if dst == self.broker:
            return [Deliver(("class", cls.name), Classed(self.broker, dst, cls, payload, -1, now, 0))]
        return self._forward(Classed(self.broker, dst, cls, payload, -1, now, 0))

    def _forward(self, msg: Classed) -> list[Effect]:
        cls, fell_back = msg.cls, msg.fell_back
        hop = self._table(LinkClass.NORMAL if fell_back else cls).get(msg.dst)
        if hop is None and cls is LinkClass.EXPRESS and not fell_back:
            hop, fell_back = self._table(LinkClass.NORMAL).get(msg.dst), True
        if hop is None:
            self.undeliverable += 1
            return []
        nxt, link = hop
        out = Classed(msg.origin, msg.dst, cls, msg.payload, link, msg.sent, msg.hops + 1, fell_back)
        return [Send(nxt, out)]

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Classed():
                return self._on_classed(msg)
            case _:
                raise ProtocolError(f"ClassRouter {self.broker}: unknown message {msg!r} from {src}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        raise ProtocolError(f"ClassRouter {self.broker}: unknown timer {key!r}")

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """The link was down: mark it failed in the view and route the event again."""
        match msg:
            case Classed():
                self.view.fail_link(msg.link)
                back = Classed(
                    msg.origin, msg.dst, msg.cls, msg.payload, msg.link, msg.sent, msg.hops - 1, msg.fell_back
                )
                return self._forward(back)
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
